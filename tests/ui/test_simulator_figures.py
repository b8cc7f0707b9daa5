"""Figure builders of the Simulator page: each trace carries the simulated numbers, with units and colours."""

import numpy as np
import pandas as pd
import pytest

from core.serving.memory_policies import orca_max, orca_oracle, paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import sharegpt
from ui.simulator_figures import (
    PAPER_FIGURE_2,
    attention_latency_figure,
    block_heatmap_figure,
    free_memory_figure,
    memory_breakdown_figure,
    running_waiting_figure,
    steps_table,
    summary_bars_figure,
    thin,
)
from ui.theme import MEMORY_COLORS, POLICY_COLORS


@pytest.fixture(scope="module")
def results():
    requests = sharegpt(80, rate=4.0, seed=0, n=2)
    config = SimulatorConfig(kv_capacity_tokens=8_192)
    return {p.name: simulate(requests, p, config) for p in (paged(16), orca_max(), orca_oracle())}


def test_thin_keeps_first_and_last_rows():
    frame = pd.DataFrame({"a": np.arange(10_001)})
    thinned = thin(frame, 1000)
    assert len(thinned) <= 1002 and thinned["a"].iloc[0] == 0 and thinned["a"].iloc[-1] == 10_000
    assert thin(frame.head(5), 1000).equals(frame.head(5))


def test_free_memory_figure(results):
    steps = {name: r.steps for name, r in results.items()}
    fig = free_memory_figure(steps, 8_192)
    assert [t.name for t in fig.data] == ["Paged (vLLM)", "Orca (Max)", "Orca (Oracle)"]
    assert fig.data[0].line.color == POLICY_COLORS["paged"]
    shown = thin(results["paged"].steps)
    assert np.array_equal(np.asarray(fig.data[0].y), shown["free_slots"].to_numpy())
    assert np.array_equal(np.asarray(fig.data[0].x), shown["time_s"].to_numpy())
    assert "tokens" in fig.layout.yaxis.title.text and "(s)" in fig.layout.xaxis.title.text


def test_breakdown_stacks_to_capacity_per_panel(results):
    steps = {name: r.steps for name, r in results.items()}
    fig = memory_breakdown_figure(steps, 8_192)
    assert len(fig.data) == 4 * 3
    assert [a.text for a in fig.layout.annotations] == ["Paged (vLLM)", "Orca (Max)", "Orca (Oracle)"]
    first_panel = fig.data[:4]
    assert [t.name for t in first_panel] == [
        "token states",
        "reservation",
        "internal fragmentation",
        "external fragmentation",
    ]
    assert first_panel[0].fillcolor == MEMORY_COLORS["token states"]
    total = sum(np.asarray(t.y, dtype=float) for t in first_panel)
    assert np.all(total == 8_192)


def test_summary_bars_put_the_paper_beside_each_policy(results):
    summaries = {name: r.summary for name, r in results.items()}
    fig = summary_bars_figure(summaries)
    assert list(fig.data[0].y) == [
        "Paged (vLLM) — simulated",
        "Paged (vLLM) — paper",
        "Orca (Max) — simulated",
        "Orca (Max) — paper",
        "Orca (Oracle) — simulated",
        "Orca (Oracle) — paper",
    ]
    token_states = list(fig.data[0].x)
    assert token_states[0] == pytest.approx(summaries["paged"]["token_states_pct"])
    assert token_states[3] == PAPER_FIGURE_2["orca-max"][0] == 20.4
    for row in range(6):
        assert sum(trace.x[row] for trace in fig.data) == pytest.approx(100.0, abs=0.2)
    assert len(summary_bars_figure(summaries, show_paper=False).data[0].y) == 3


def test_running_waiting_figure(results):
    fig = running_waiting_figure({name: r.steps for name, r in results.items()})
    assert len(fig.data) == 6 and fig.data[1].line.dash == "dot"
    assert max(fig.data[0].y) == results["paged"].steps["running"].max()


def test_block_heatmap_marks_owners_shared_and_free(results):
    snap = next(s for s in results["paged"].snapshots if (s.ref_count > 1).any())
    fig = block_heatmap_figure(snap, 16, columns=32)
    heat = fig.data[0]
    z = np.asarray(heat.z, dtype=float).ravel()[: len(snap.owner_request)]
    assert ((z >= 2) == (snap.owner_request >= 0)).all()  # every owned block is coloured by its request
    shared = next(t for t in fig.data if t.name and t.name.startswith("shared"))
    ids = np.asarray(shared.y) * 32 + np.asarray(shared.x)
    assert set(ids) == set(np.flatnonzero(snap.ref_count > 1))
    assert (
        f"{int((snap.owner_request >= 0).sum()):,} of {len(snap.owner_request):,} blocks used"
        in fig.layout.title.text
    )


def test_attention_latency_figure():
    table = pd.DataFrame(
        {
            "step": [1, 5],
            "time_s": [0.1, 0.5],
            "num_seqs": [2, 3],
            "total_context_tokens": [10, 40],
            "max_context_tokens": [6, 20],
            "padded_tokens": [12, 60],
            "paged_ms": [0.5, 0.9],
            "contiguous_ms": [0.4, 1.2],
        }
    )
    fig = attention_latency_figure(table)
    assert [list(t.y) for t in fig.data] == [[0.5, 0.9], [0.4, 1.2]]
    assert "ms" in fig.layout.yaxis.title.text


def test_steps_table_stacks_policies(results):
    table = steps_table(results)
    assert table.columns[0] == "policy"
    assert len(table) == sum(len(r.steps) for r in results.values())
