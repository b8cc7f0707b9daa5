"""The Simulator page's per-tier figure against the run's own requests frame and a hand-worked one."""

import pandas as pd

from ui.simulator.figures import tier_hits_figure, tier_hits_table


def test_tier_table_is_cumulative_in_admission_order_by_hand():
    requests = pd.DataFrame(
        {
            "admit_time": [2.0, 0.5, float("nan"), 1.0],  # the third was never admitted
            "prompt_len": [100, 64, 50, 80],
            "prefix_hit_tokens": [48, 0, 0, 64],
            "host_hit_tokens": [32, 0, 0, 16],
        }
    )
    table = tier_hits_table(requests)
    assert table["admit_time_s"].tolist() == [0.5, 1.0, 2.0]
    assert table["HBM"].tolist() == [0, 48, 64]  # (64 - 16), then + (48 - 32)
    assert table["host"].tolist() == [0, 16, 48]
    assert table["prefill"].tolist() == [64, 64 + 16, 64 + 16 + 52]
    figure = tier_hits_figure(requests)
    assert [trace.name for trace in figure.data] == [
        "hit in HBM",
        "loaded from the host tier",
        "prefilled (computed)",
    ]
    assert list(figure.data[1].y) == [0, 16, 48]
    assert figure.layout.xaxis.title.text == "simulated time (s)"
    assert figure.layout.yaxis.title.text == "prompt tokens, cumulative"
