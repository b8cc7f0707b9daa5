"""The Engine page's figures, built from hand-made step frames and real block-manager snapshots."""

from types import SimpleNamespace

import numpy as np
import pandas as pd

from core.paging.block_manager import BlockManager
from ui.engine.figures import (
    attention_latency_figure,
    copy_on_write_figure,
    engine_block_heatmap,
    free_blocks_figure,
    outputs_table,
    sequence_color_index,
    sharing_figure,
    step_time_figure,
)
from ui.theme import sequence_color

# Four steps of a hand-worked run: a 20-token prompt (2 blocks of 8) prefilled, forked into 2 samples that each
# copy the partly filled last block at step 2, then a preemption at step 3 frees everything.
STEPS = pd.DataFrame(
    {
        "step": [0, 1, 2, 3],
        "free_blocks": [14, 14, 13, 16],
        "shared_blocks": [0, 2, 1, 0],
        "cow_copies": [0, 0, 1, 0],
        "preemptions": [0, 0, 0, 1],
        "prefill_tokens": [20, 0, 0, 0],
        "running_seqs": [1, 2, 2, 0],
        "attention_ms": [1.5, 0.25, 0.3, 0.0],
    }
)


def _forked_snapshots():
    """Snapshots of a 16-block pool (block size 8): `a` holds 20 tokens, then `b` forks it, then `b` appends."""
    manager = BlockManager(num_blocks=16, block_size=8)
    manager.allocate("a", list(range(20)))
    first = manager.snapshot()
    manager.fork("a", "b")
    forked = manager.snapshot()
    manager.append_token("b", 99)  # copy-on-write: b gets its own copy of the shared partly filled last block
    copied = manager.snapshot()
    return first, forked, copied


def test_colour_index_is_admission_order_across_steps():
    first, forked, copied = _forked_snapshots()
    assert sequence_color_index([first, forked, copied]) == {"a": 0, "b": 1}
    assert sequence_color_index([copied, first]) == {"a": 0, "b": 1}


def test_heatmap_counts_used_and_shared_blocks_and_colours_owners():
    first, forked, copied = _forked_snapshots()
    index = sequence_color_index([first, forked, copied])
    figure = engine_block_heatmap(forked, 1, index)
    # 20 tokens in blocks of 8: 3 blocks, all three held by both sequences after the fork
    assert "3 of 16 in use, 3 shared" in figure.layout.title.text
    figure = engine_block_heatmap(copied, 2, index)
    # b copied the last block: 4 blocks in use, the 2 full prompt blocks still shared
    assert "after step 2: 4 of 16 in use, 2 shared" in figure.layout.title.text
    legend = {trace.name: trace.marker.color for trace in figure.data[1:]}
    assert legend == {"a": sequence_color(0), "b": sequence_color(1)}
    text = np.asarray(figure.data[0].text, dtype=object).reshape(-1)
    assert [t.startswith("×2") for t in text[:4]] == [True, True, False, False]


def test_free_blocks_figure_plots_the_frame_and_marks_preemptions():
    figure = free_blocks_figure(STEPS, 16)
    free, shared, preempted = figure.data
    assert list(free.y) == [14, 14, 13, 16] and list(shared.y) == [0, 2, 1, 0]
    assert list(preempted.x) == [3] and list(preempted.customdata) == [1]
    assert figure.layout.shapes[0].y0 == 16  # the pool line
    assert figure.layout.yaxis.title.text == "blocks" and "step" in figure.layout.xaxis.title.text


def test_free_blocks_figure_without_preemptions_has_no_marker_trace():
    figure = free_blocks_figure(STEPS.assign(preemptions=0), 16)
    assert [t.name for t in figure.data] == ["free blocks", "shared blocks (ref count > 1)"]


def test_copy_on_write_figure_totals_the_copies():
    figure = copy_on_write_figure(STEPS)
    assert list(figure.data[0].y) == [0, 0, 1, 0]
    assert "(1 in all)" in figure.layout.title.text


def test_attention_latency_splits_prefill_from_decode_steps():
    figure = attention_latency_figure(STEPS)
    by_name = {t.name: t for t in figure.data}
    assert list(by_name["decode only"].x) == [1, 2, 3]
    assert list(by_name["with prefill tokens"].y) == [1.5]
    assert "(ms)" in figure.layout.yaxis.title.text


def test_sharing_figure_puts_ours_beside_the_paper():
    # the paper's Figure 15 (Alpaca): 6.1 / 8.5 / 9.8 % for n = 2 / 4 / 6, 37.6 / 53.1 / 55.2 % for beam 2 / 4 / 6
    measured = pd.DataFrame(
        {
            "mode": ["parallel sampling"] * 3 + ["beam search"] * 3,
            "width": [2, 4, 6] * 2,
            "saving_pct": [5.0, 7.5, 9.0, 30.0, 45.0, np.nan],
            "paper_pct": [6.1, 8.5, 9.8, 37.6, 53.1, 55.2],
        }
    )
    figure = sharing_figure(measured)
    ours, paper = figure.data
    assert list(paper.y) == [6.1, 8.5, 9.8, 37.6, 53.1, 55.2]
    assert list(ours.y[:5]) == [5.0, 7.5, 9.0, 30.0, 45.0] and np.isnan(ours.y[5])
    assert list(ours.x) == ["n = 2", "n = 4", "n = 6", "beam = 2", "beam = 4", "beam = 6"]
    assert ours.text[5] == "" and paper.text[0] == "6.1%"
    assert "%" in figure.layout.yaxis.title.text


def test_sharing_figure_adds_the_random_model_beside_a_real_one():
    measured = pd.DataFrame(
        {
            "mode": ["parallel sampling", "beam search"],
            "width": [2, 2],
            "saving_pct": [4.0, 20.0],
            "random_model_pct": [10.0, 60.0],
            "paper_pct": [6.1, 37.6],
        }
    )
    real, random_model, paper = sharing_figure(measured, ours="SmolLM2-135M-Instruct").data
    assert real.name == "this engine (SmolLM2-135M-Instruct)" and list(real.y) == [4.0, 20.0]
    assert "random" in random_model.name and list(random_model.y) == [10.0, 60.0]
    assert list(paper.y) == [6.1, 37.6]
    # a run recorded without the random model (NaN in its column, as bench/results/sharing-smollm2.json): no
    # legend entry for bars that are not there
    without = measured.assign(random_model_pct=float("nan"))
    assert [t.name for t in sharing_figure(without, ours="SmolLM2-135M-Instruct").data] == [
        real.name,
        paper.name,
    ]


def test_heatmap_title_sits_above_its_top_x_axis():
    _, forked, _ = _forked_snapshots()
    figure = engine_block_heatmap(forked, 1, sequence_color_index([forked]))
    assert figure.layout.xaxis.side == "top"  # the axis and its title take the top of the plot area
    title = figure.layout.title
    assert title.yref == "container" and title.y == 1.0 and title.yanchor == "top"  # at the figure's top edge
    assert figure.layout.margin.t >= 120  # room for two title lines above the axis title and tick labels


def test_outputs_table_one_row_per_completion():
    completion = SimpleNamespace
    outputs = [
        SimpleNamespace(
            outputs=[completion(token_ids=[5, 6], cumulative_logprob=-1.23456, finish_reason="length")]
        ),
        SimpleNamespace(
            outputs=[
                completion(token_ids=[7], cumulative_logprob=-0.5, finish_reason="stop"),
                completion(token_ids=[8, 9, 10], cumulative_logprob=-2.0, finish_reason="length"),
            ]
        ),
    ]
    table = outputs_table([[1, 2, 3], [4]], outputs)
    assert table["prompt"].tolist() == [0, 1, 1] and table["output"].tolist() == [0, 0, 1]
    assert table["prompt tokens"].tolist() == [3, 1, 1] and table["tokens"].tolist() == [2, 1, 3]
    assert table["text"].tolist() == ["5 6", "7", "8 9 10"]
    assert table["cumulative logprob"].iloc[0] == -1.2346
    decoded = outputs_table([[1, 2, 3], [4]], outputs, decode=lambda ids: "-".join(map(str, ids)))
    assert decoded["text"].iloc[2] == "8-9-10"


def test_step_time_figure_stacks_the_three_parts_and_gives_their_shares():
    steps = STEPS.assign(
        step_time_ms=[4.0, 1.0, 1.0, 0.0],
        rest_of_model_ms=[2.0, 0.5, 0.5, 0.0],
        host_ms=[0.5, 0.25, 0.2, 0.0],
    )
    figure = step_time_figure(steps)
    assert [t.name.split(" (")[0] for t in figure.data] == ["attention", "rest of the model", "host"]
    assert figure.layout.barmode == "stack"
    # per step the bars add up to the step's time
    stacked = np.sum([np.asarray(t.y, dtype=float) for t in figure.data], axis=0)
    assert stacked.tolist() == steps["step_time_ms"].tolist()
    # 2.05 of 6 ms in attention, 3 in the rest of the model, 0.95 on the host; median step 1 ms
    assert "median 1.0 ms: attention 34%, rest of the model 50%, host 16%" in figure.layout.title.text
