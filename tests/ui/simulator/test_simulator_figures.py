"""Figure builders of the Simulator page: each trace carries the simulated numbers, with units and colours."""

import numpy as np
import pandas as pd
import pytest

from core.kv import KVCacheSnapshot
from core.planning.cost.step_time import opt_13b_a100
from core.serving.memory_policies import Policy, orca_max, orca_oracle, paged
from core.serving.paged_memory import check_kv_groups
from core.serving.simulator import SimulatorConfig, StepSnapshot, simulate
from core.serving.workload import sharegpt
from ui.simulator.figures import (
    PAPER_FIGURE_2,
    attention_latency_figure,
    block_heatmap_figure,
    free_memory_figure,
    memory_breakdown_figure,
    running_waiting_figure,
    smooth,
    steps_table,
    summary_bars_figure,
    thin,
)
from ui.theme import FREE_BLOCK_COLOR, MEMORY_COLORS, POLICY_COLORS, integer_dtick, sequence_color


@pytest.fixture(scope="module")
def results():
    requests = sharegpt(80, rate=4.0, seed=0, n=2)
    config = SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=8_192)
    return {p.name: simulate(requests, p, config) for p in (paged(16), orca_max(), orca_oracle())}


def test_thin_keeps_first_and_last_rows():
    frame = pd.DataFrame({"a": np.arange(10_001)})
    thinned = thin(frame, 1000)
    assert len(thinned) <= 1002 and thinned["a"].iloc[0] == 0 and thinned["a"].iloc[-1] == 10_000
    assert thin(frame.head(5), 1000).equals(frame.head(5))


def test_free_memory_figure_has_a_panel_per_policy_with_its_trend(results):
    steps = {name: r.steps for name, r in results.items()}
    fig = free_memory_figure(steps, 8_192)
    assert [a.text for a in fig.layout.annotations] == ["Paged (vLLM)", "Orca (Max)", "Orca (Oracle)"]
    assert [t.name for t in fig.data[1::2]] == ["Paged (vLLM)", "Orca (Max)", "Orca (Oracle)"]
    assert [t.line.color for t in fig.data[1::2]] == [
        POLICY_COLORS[n] for n in ("paged", "orca-max", "orca-oracle")
    ]
    raw, trend = fig.data[0], fig.data[1]
    shown = thin(results["paged"].steps)
    assert np.array_equal(np.asarray(raw.y), shown["free_slots"].to_numpy())
    assert np.array_equal(np.asarray(raw.x), shown["time_s"].to_numpy())
    assert raw.line.shape == "hv" and raw.xaxis == "x" and fig.data[2].xaxis == "x2"
    # the trend is a centred moving average of the raw series: its mean stays, its spread shrinks
    window = max(1, len(shown) // 50)
    y = shown["free_slots"].to_numpy(dtype=float)
    assert trend.y[len(y) // 2] == pytest.approx(
        y[len(y) // 2 - window // 2 : len(y) // 2 + (window + 1) // 2].mean()
    )
    assert np.std(trend.y) <= np.std(y)
    assert "(tokens)" in fig.layout.yaxis2.title.text and "(s)" in fig.layout.xaxis3.title.text
    assert fig.layout.yaxis.nticks == 3 and fig.layout.yaxis.tickformat == "~s"  # small panels, few labels


def test_smooth_is_a_centred_moving_average():
    assert smooth(np.array([0.0, 3.0, 0.0, 3.0, 0.0]), 3).tolist() == pytest.approx([1.5, 1, 2, 1, 1.5])
    assert smooth(np.array([1.0, 2.0]), 5).tolist() == [1.0, 2.0]


def test_breakdown_stacks_to_capacity_per_panel(results):
    steps = {name: r.steps for name, r in results.items()}
    fig = memory_breakdown_figure(steps, 8_192)
    assert len(fig.data) == 5 * 3
    assert [a.text for a in fig.layout.annotations] == ["Paged (vLLM)", "Orca (Max)", "Orca (Oracle)"]
    first_panel = fig.data[:5]
    assert [t.name for t in first_panel] == [
        "token states",
        "reservation",
        "internal fragmentation",
        "external fragmentation",
        "free",
    ]
    assert first_panel[0].fillcolor == MEMORY_COLORS["token states"]
    assert first_panel[4].fillcolor == MEMORY_COLORS["free"] != MEMORY_COLORS["external fragmentation"]
    total = sum(np.asarray(t.y, dtype=float) for t in first_panel)
    assert np.all(total == 8_192)
    assert not np.asarray(
        first_panel[3].y
    ).any()  # paged: 8,192 slots = 512 blocks, no external fragmentation


def test_summary_bars_put_the_paper_beside_each_policy(results):
    """Beside the paper (an OPT-13B run) the bars use the paper's four categories: external fragmentation and
    free memory are added up as its "external fragmentation & others", and the title says so."""
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
    assert [t.name for t in fig.data][-1] == "external fragmentation & others"
    assert "allocator slack + free memory" in fig.layout.title.text
    token_states = list(fig.data[0].x)
    assert token_states[0] == pytest.approx(summaries["paged"]["token_states_pct"])
    assert token_states[3] == PAPER_FIGURE_2["orca-max"][0] == 20.4
    oracle = summaries["orca-oracle"]
    others = oracle["external_fragmentation_pct"] + oracle["free_pct"]
    assert fig.data[3].x[4] == pytest.approx(others) and oracle["free_pct"] > 0
    for row in range(6):
        assert sum(trace.x[row] for trace in fig.data) == pytest.approx(100.0, abs=0.2)
    assert fig.layout.xaxis.dtick == 10


def test_summary_bars_without_the_paper_keep_free_memory_apart(results):
    summaries = {name: r.summary for name, r in results.items()}
    fig = summary_bars_figure(summaries, show_paper=False)
    assert len(fig.data[0].y) == 3
    assert [t.name for t in fig.data] == [
        "token states",
        "reservation",
        "internal fragmentation",
        "external fragmentation",
        "free",
    ]
    assert fig.data[3].x[0] == 0.0 and fig.data[4].x[0] == pytest.approx(summaries["paged"]["free_pct"])
    assert "Figure 2" not in fig.layout.title.text
    for row in range(3):
        assert sum(trace.x[row] for trace in fig.data) == pytest.approx(100.0)


def test_running_waiting_figure(results):
    fig = running_waiting_figure({name: r.steps for name, r in results.items()})
    assert len(fig.data) == 6 and fig.data[1].line.dash == "dot"
    assert max(fig.data[0].y) == results["paged"].steps["running"].max()
    top = max(max(r.steps["running"].max(), r.steps["waiting"].max()) for r in results.values())
    assert fig.layout.yaxis.dtick == integer_dtick(top) >= 1 and fig.layout.yaxis.tickformat == ",d"
    assert top / fig.layout.yaxis.dtick <= 12  # at most ~12 labels: they never overlap


def test_block_heatmap_marks_owners_shared_and_free(results):
    snap = next(s for s in results["paged"].snapshots if (s.pool.ref_count > 1).any())
    fig = block_heatmap_figure(snap, 16, columns=32)
    heat = fig.data[0]
    z = np.asarray(heat.z, dtype=float).ravel()[: len(snap.owner_request)]
    assert ((z >= 2) == (snap.owner_request >= 0)).all()  # every owned block is coloured by its request
    shared = next(t for t in fig.data if t.name and t.name.startswith("shared"))
    ids = np.asarray(shared.y) * 32 + np.asarray(shared.x)
    assert set(ids) == set(np.flatnonzero(snap.pool.ref_count > 1))
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


def _step_snapshot(step, time_s, context_lens, owner, ref, fill, is_cached, group=None) -> StepSnapshot:
    """A sampled step whose pool is given block by block (owner: the request holding each block, -1 free): the
    one snapshot type with one holder per request (tables left empty: the heatmap reads the per-block arrays)."""
    requests = sorted(set(owner[owner >= 0].tolist()))
    row = {r: i for i, r in enumerate(requests)}
    groups = 1 if group is None else int(group.max()) + 1
    free = np.flatnonzero(owner < 0).astype(np.int32)
    is_free = owner < 0
    pool = KVCacheSnapshot(
        num_blocks=len(owner),
        block_sizes=(16,) * groups,
        request_ids=tuple(requests),
        group=np.where(owner >= 0, 0, -1).astype(np.int8) if group is None else group,
        owner=np.array([row.get(r, -1) for r in owner.tolist()], dtype=np.int32),
        ref_count=np.asarray(ref, dtype=np.int32),
        fill=np.asarray(fill, dtype=np.int32),
        is_free=is_free,
        is_cached=is_cached,
        free_order=free,
        tables=np.zeros((groups, len(requests), 0), dtype=np.int32),
        table_lens=np.zeros((groups, len(requests)), dtype=np.int32),
        num_tokens=dict.fromkeys(requests, 0),
    )
    return StepSnapshot(step, time_s, context_lens, pool, np.array(requests, dtype=np.int32))


def _colour(heat, z):
    """The colour the heatmap's step colorscale gives value z (each colour spans [i/n, (i+1)/n))."""
    scale = heat.colorscale
    return next(
        c for (lo, c), (hi, _) in zip(scale[::2], scale[1::2], strict=True) if lo <= z / heat.zmax < hi
    )


def test_hybrid_heatmap_draws_every_group_in_one_id_space():
    """A 12-block pool of 10-layer blocks, block 16, groups full (10 layers) and two windows of 32 (9 and 8
    layers): the full group holds blocks 0, 3, 4, 9 (requests 3, 3, 3, 7), the window groups 1, 5 and 2, 6
    (requests 3, 7 each); 7 free blocks. One grid in block-id order, 4 columns x 3 rows; request 7's cells take
    z = 2 + 7 = 9, its colour in the paged heatmap; the hover of block 2 names its group."""
    n = 12
    owner = np.full(n, -1)
    kv_group = np.full(n, -1, dtype=np.int8)
    for block, request, group in (
        (0, 3, 0),
        (3, 3, 0),
        (4, 3, 0),
        (9, 7, 0),
        (1, 3, 1),
        (5, 7, 1),
        (2, 3, 2),
        (6, 7, 2),
    ):
        owner[block], kv_group[block] = request, group
    fill = np.where(owner >= 0, 16, 0)
    fill[[9, 5, 6]] = 4
    snap = _step_snapshot(
        1_234, 5_678.9, np.array([41, 20]), owner, (owner >= 0).astype(int), fill, np.zeros(n, bool), kv_group
    )
    groups = check_kv_groups((("full", 10, None), ("sliding_window", 9, 32), ("sliding_window", 8, 32)))
    fig = block_heatmap_figure(snap, 16, columns=4, kv_groups=groups)
    heat = fig.data[0]
    assert np.asarray(heat.z, dtype=float).tolist() == [[5, 5, 5, 5], [5, 9, 9, 0], [0, 9, 0, 0]]
    assert _colour(heat, 9) == sequence_color(7) and _colour(heat, 0) == FREE_BLOCK_COLOR
    text = np.asarray(heat.text).ravel()
    assert text[2].startswith("block 2 · group 2: sliding window 32 tokens<br>request 3")
    assert text[9].startswith("block 9 · group 0: full attention<br>request 7") and "4/16 tokens" in text[9]
    assert (
        "step 1,234 (t = 5,678.9 s): 8 of 12 blocks used,<br><sup>one pool for every group (full attention 4, "
        "sliding window 32 tokens 4; 10 layers per block)</sup>" in fig.layout.title.text
    )
    assert fig.layout.title.text.startswith("Hybrid KV cache")


def test_a_pool_of_any_size_is_drawn_in_fixed_cells():
    """157,182 blocks (gpt-oss-20b's pool on an H200 at 0.9): 103 blocks per cell, 1,527 cells in 64 columns
    x 24 rows. Blocks 0-9,999 are held by requests (every 7th partly filled, 100-199 shared), the rest free; a
    cell's colour is the share of its blocks held, computed here block by block."""
    n = 157_182
    owner = np.full(n, -1)
    owner[:10_000] = np.arange(10_000) // 40
    fill = np.where(owner >= 0, np.where(np.arange(n) % 7 == 0, 5, 16), 0)
    ref = (owner >= 0).astype(int)
    ref[100:200] = 2
    snap = _step_snapshot(9, 1.5, np.array([1]), owner, ref, fill, np.zeros(n, bool))
    fig = block_heatmap_figure(snap, 16)
    heat = fig.data[0]
    z = np.asarray(heat.z, dtype=float)
    assert z.shape == (24, 64) and np.isfinite(z).sum() == -(-n // 103) == 1_527
    cells = z.ravel()
    for c in (0, 97, 98, 1_526):
        blocks = owner[c * 103 : (c + 1) * 103]
        assert cells[c] == pytest.approx((blocks >= 0).mean())
    text = np.asarray(heat.text).ravel()
    assert text[97].startswith("blocks 9,991–10,093 (103 blocks)<br>9 used (9%), 94 free")
    assert text[1].startswith("blocks 103–205 (103 blocks)") and "97 shared" in text[1]
    assert text[1_526].startswith("blocks 157,178–157,181 (4 blocks)")  # 1,526 x 103 = 157,178
    assert "a cell = 103 blocks" in fig.layout.title.text and fig.layout.height < 600
    assert list(fig.layout.yaxis.ticktext)[:2] == ["0", "26,368"]  # row r starts at block r x 64 x 103
    assert fig.layout.xaxis.title.text == "offset in the row (blocks; 6,592 a row)"
    assert len(fig.layout.xaxis.tickvals) <= 7 and len(fig.layout.yaxis.tickvals) <= 7
    shared = next(t for t in fig.data if t.type == "scatter")
    assert sorted(np.asarray(shared.x) + 64 * np.asarray(shared.y)) == [0, 1]


def test_a_small_pool_keeps_one_cell_per_block(results):
    snap = results["paged"].snapshots[-1]
    fig = block_heatmap_figure(snap, 16)
    assert np.isfinite(np.asarray(fig.data[0].z, dtype=float)).sum() == len(snap.owner_request) == 512
    assert "a cell" not in fig.layout.title.text


def test_hybrid_heatmap_of_a_simulation_covers_the_pool():
    """On a real run the grid is the one pool (1,024 blocks of 16 tokens x 12 layers), every held block belongs
    to one group, and a request's window-group blocks stay within its bound: all its tokens while admitted and not
    yet computed, then at most cdiv(128, 16) + 1 = 9, while its full-group blocks grow with its length."""
    requests = sharegpt(60, rate=6.0, seed=3)
    groups = check_kv_groups((("full", 12, None), ("sliding_window", 12, 128)))
    result = simulate(
        requests,
        Policy("paged", 16, kv_groups=groups),
        SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=8_192),
    )
    snap = max(result.snapshots, key=lambda s: len(s.context_lens))
    fig = block_heatmap_figure(snap, 16, kv_groups=groups)
    assert np.isfinite(np.asarray(fig.data[0].z, dtype=float)).sum() == len(snap.owner_request) == 1_024
    held = snap.owner_request >= 0
    assert set(snap.pool.group[held].tolist()) <= {0, 1}
    full = np.bincount(snap.owner_request[held & (snap.pool.group == 0)])
    window = np.bincount(snap.owner_request[held & (snap.pool.group == 1)], minlength=len(full))
    lens = dict(
        zip(
            result.requests["request_id"],
            result.requests["prompt_len"] + result.requests["output_len"],
            strict=True,
        )
    )
    for request in np.flatnonzero(full):
        assert window[request] <= max(9, full[request]) and full[request] <= -(-lens[request] // 16)
    assert (
        f"full attention {int(full.sum()):,}, sliding window 128 tokens {int(window.sum()):,}"
        in fig.layout.title.text
    )
