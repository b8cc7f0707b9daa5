"""Plotly figures of the serving simulator. Each takes simulation results (or plain frames) and returns a Figure.

Units: time in seconds of simulated serving, memory in KV token slots (tokens), latency in ms. A policy keeps its
`ui.theme.POLICY_COLORS` colour and a memory category its `MEMORY_COLORS` colour on every chart.
"""

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.block_grid import GridShape, block_axes, grid_shape, grid_traces
from ui.theme import MEMORY_COLORS, integer_dtick, policy_color

# Figure 2 of the PagedAttention paper (share of KV memory, %): token states, reservation, internal
# fragmentation, external fragmentation & others. vLLM's row only gives token states (waste under 4%, not split).
PAPER_FIGURE_2 = {
    "orca-max": (20.4, 13.3, 57.3, 8.9),
    "orca-pow2": (26.8, 17.9, 13.6, 41.6),
    "orca-oracle": (38.2, 25.2, 0.0, 36.6),
    "paged": (96.3, 0.0, 0.0, 3.7),
}
# Figure 13(a): average batched requests, OPT-13B, ShareGPT at 2 req/s.
PAPER_BATCHED = {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "paged": 30.42}

POLICY_LABELS = {
    "paged": "Paged (vLLM)",
    "orca-max": "Orca (Max)",
    "orca-pow2": "Orca (Pow2)",
    "orca-oracle": "Orca (Oracle)",
}
# (step column, summary key prefix, category): where the KV capacity is; the five sum to the capacity
BREAKDOWN = (
    ("token_states", "token_states", "token states"),
    ("reservation", "reservation", "reservation"),
    ("internal_fragmentation", "internal_fragmentation", "internal fragmentation"),
    ("external_fragmentation", "external_fragmentation", "external fragmentation"),
    ("free_slots", "free", "free"),
)
PAPER_OTHERS = "external fragmentation & others"  # the paper's Figure 2 category: allocator slack + free
PAPER_MODEL = "opt-13b"  # the paper's Figure 2 reference bars belong beside runs of this model only
MAX_POINTS = 2_000


def label(name: str) -> str:
    return POLICY_LABELS.get(name, name)


def verdict_text(summaries: dict[str, dict]) -> str:
    """One sentence with the answer: the paged policy's average batch against the best contiguous policy's, with
    both token-state shares (markdown). Without both kinds, the policies' batches listed."""
    batched = {name: s["avg_batched_requests"] for name, s in summaries.items()}
    contiguous = {name: b for name, b in batched.items() if name != "paged"}
    if "paged" not in batched or not contiguous:
        return (
            "Average batch: " + ", ".join(f"{label(n)} {b:,.2f} requests" for n, b in batched.items()) + "."
        )
    best = max(contiguous, key=contiguous.get)
    paged, other = batched["paged"], contiguous[best]
    ratio = f"{paged / other:,.2f}x" if other > 0 else "more than"
    states = summaries["paged"]["token_states_pct"], summaries[best]["token_states_pct"]
    return (
        f"**{label('paged')} batches {paged:,.2f} requests on average, {ratio} {label(best)}'s {other:,.2f}** "
        f"(the best contiguous policy here); token states fill {states[0]:.1f}% of the KV memory against "
        f"{states[1]:.1f}%."
    )


def thin(frame: pd.DataFrame, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """Every k-th row so that at most ~max_points remain (the last row is always kept)."""
    if len(frame) <= max_points:
        return frame
    stride = math.ceil(len(frame) / max_points)
    index = np.unique(np.concatenate([np.arange(0, len(frame), stride), [len(frame) - 1]]))
    return frame.iloc[index]


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        separators=".,",
    )
    return fig


def _ordered(names) -> list[str]:
    """Policies in the page's order (paged first), unknown names last."""
    order = list(POLICY_LABELS)
    return sorted(names, key=lambda n: order.index(n) if n in order else len(order))


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over `window` points (shrinking at the ends): the trend of a noisy series."""
    values = np.asarray(values, dtype=np.float64)
    if window <= 1 or len(values) < 3:
        return values
    kernel = np.ones(window)
    return np.convolve(values, kernel, "same") / np.convolve(np.ones(len(values)), kernel, "same")


def free_memory_figure(steps: dict[str, pd.DataFrame], capacity: int) -> go.Figure:
    """Free KV slots over time, one small panel per policy (paged first) on a shared axis: a light area of the
    step-by-step value and a line of its moving average over ~2% of the run, in the policy's colour. Paged free =
    free-list length x block size; contiguous = slots no reservation covers."""
    names = _ordered(steps)
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.09,
        subplot_titles=[label(n) for n in names],
    )
    for row, name in enumerate(names, start=1):
        f = thin(steps[name])
        color = policy_color(name)
        fig.add_trace(
            go.Scatter(
                x=f["time_s"],
                y=f["free_slots"],
                name=f"{label(name)} (each step)",
                mode="lines",
                line={"color": color, "width": 0.5, "shape": "hv"},
                fill="tozeroy",
                opacity=0.35,
                showlegend=False,
                customdata=np.stack([f["free_blocks"], f["step"]], axis=1),
                hovertemplate="t=%{x:,.1f} s (step %{customdata[1]:,})<br>%{y:,} free slots"
                "<br>free list: %{customdata[0]:,} blocks<extra>" + label(name) + "</extra>",
            ),
            row=row,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=f["time_s"],
                y=smooth(f["free_slots"].to_numpy(), max(1, len(f) // 50)),
                name=label(name),
                mode="lines",
                line={"color": color, "width": 2.5},
                hovertemplate="t=%{x:,.1f} s<br>%{y:,.0f} free slots (moving average)<extra>"
                + label(name)
                + "</extra>",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(range=[0, capacity * 1.05], tickformat="~s", nticks=3, row=row, col=1)
    fig.update_xaxes(title="simulated time (s)", row=len(names), col=1)
    fig.update_yaxes(title="free KV slots (tokens)", row=(len(names) + 1) // 2, col=1)
    fig = _layout(
        fig, f"Free KV memory over time (capacity {capacity:,} token slots)", height=120 + 110 * len(names)
    )
    fig.update_layout(showlegend=False)
    return fig


def memory_breakdown_figure(steps: dict[str, pd.DataFrame], capacity: int) -> go.Figure:
    """Stacked areas of token states / reservation / internal / external fragmentation / free, one panel per policy
    (paged first), in token slots; each panel stacks to the capacity."""
    names = _ordered(steps)
    fig = make_subplots(
        rows=1,
        cols=len(names),
        shared_yaxes=True,
        subplot_titles=[label(n) for n in names],
        horizontal_spacing=0.02,
    )
    for col, name in enumerate(names, start=1):
        f = thin(steps[name])
        for column, _, category in BREAKDOWN:
            fig.add_trace(
                go.Scatter(
                    x=f["time_s"],
                    y=f[column],
                    name=category,
                    legendgroup=category,
                    showlegend=col == 1,
                    stackgroup=f"s{col}",
                    mode="lines",
                    line={"width": 0, "color": MEMORY_COLORS[category]},
                    fillcolor=MEMORY_COLORS[category],
                    hovertemplate="t=%{x:,.1f} s<br>%{y:,} slots<extra>" + category + "</extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title="time (s)", nticks=4, row=1, col=col)
    fig.update_yaxes(title="KV slots (tokens)", range=[0, capacity], tickformat="~s", row=1, col=1)
    return _layout(fig, "Where the KV memory goes, step by step", height=440)


def summary_bars_figure(summaries: dict[str, dict], show_paper: bool = True) -> go.Figure:
    """Each policy's time-averaged share of KV memory, stacked to 100%.

    show_paper (for OPT-13B runs, the paper's setup): the paper's Figure 2 bar beside each policy, in the paper's
    four categories, so the run's external fragmentation and free memory are added up as the paper's "external
    fragmentation & others" (the title says so). Otherwise the five categories, free memory apart."""
    rows: list[tuple[str, tuple[float, ...], str]] = []
    if show_paper:
        categories = [category for _, _, category in BREAKDOWN[:3]] + [PAPER_OTHERS]
    else:
        categories = [category for _, _, category in BREAKDOWN]
    for name, summary in summaries.items():
        shares = [summary[f"{key}_pct"] for _, key, _ in BREAKDOWN]
        if show_paper:
            shares = [*shares[:3], shares[3] + shares[4]]
        batched = summary.get("avg_batched_requests", float("nan"))
        rows.append((f"{label(name)} — simulated", tuple(shares), f"{batched:,.2f} batched requests"))
        if show_paper and name in PAPER_FIGURE_2:
            note = f"{PAPER_BATCHED[name]:,.2f} batched requests (paper, Fig. 13a)"
            if name == "paged":
                note += "; waste < 4% not split in the paper"
            rows.append((f"{label(name)} — paper", PAPER_FIGURE_2[name], note))
    fig = go.Figure()
    ys = [r[0] for r in rows]
    for i, category in enumerate(categories):
        values = [r[1][i] for r in rows]
        fig.add_trace(
            go.Bar(
                y=ys,
                x=values,
                name=category,
                orientation="h",
                marker_color=MEMORY_COLORS[category],
                text=[f"{v:.1f}%" if v >= 4 else "" for v in values],
                textposition="inside",
                customdata=[r[2] for r in rows],
                hovertemplate="%{y}<br>" + category + ": %{x:.1f}%<br>%{customdata}<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="share of KV capacity, averaged over time (%)", range=[0, 100], dtick=10)
    fig.update_yaxes(autorange="reversed")
    if show_paper:
        title = (
            "KV memory breakdown beside the paper's Figure 2<br><sup>“external fragmentation & others” = allocator "
            "slack + free memory, as the paper counts it</sup>"
        )
    else:
        title = "KV memory breakdown: where the capacity goes, averaged over time"
    _layout(fig, title, height=170 + 42 * len(rows))
    fig.update_layout(legend={"y": 1.0, "yanchor": "bottom", "traceorder": "normal"}, margin={"t": 100})
    return fig


def running_waiting_figure(steps: dict[str, pd.DataFrame]) -> go.Figure:
    """Requests in the batch (solid) and waiting in the queue (dotted) over time, per policy."""
    fig = go.Figure()
    for name, frame in steps.items():
        f = thin(frame)
        color = policy_color(name)
        fig.add_trace(
            go.Scatter(
                x=f["time_s"],
                y=f["running"],
                name=f"{label(name)} running",
                mode="lines",
                line={"color": color, "width": 1.5},
                hovertemplate="t=%{x:,.1f} s<br>%{y:,} running<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=f["time_s"],
                y=f["waiting"],
                name=f"{label(name)} waiting",
                mode="lines",
                line={"color": color, "width": 1.2, "dash": "dot"},
                hovertemplate="t=%{x:,.1f} s<br>%{y:,} waiting<extra></extra>",
            )
        )
    fig.update_xaxes(title="simulated time (s)")
    top = max((max(f["running"].max(), f["waiting"].max()) for f in steps.values()), default=1)
    fig.update_yaxes(title="requests", tickformat=",d", dtick=integer_dtick(top), rangemode="tozero")
    return _layout(fig, "Running and waiting requests")


def attention_latency_figure(table: pd.DataFrame) -> go.Figure:
    """Measured decode attention per sampled step: paged (through the block tables) vs contiguous (padded to the
    batch's longest sequence)."""
    fig = go.Figure()
    custom = np.stack([table["num_seqs"], table["total_context_tokens"], table["max_context_tokens"]], axis=1)
    hover = (
        "t=%{x:,.1f} s<br>%{y:.3f} ms<br>%{customdata[0]:,} sequences, %{customdata[1]:,} context tokens"
        "<br>longest %{customdata[2]:,}<extra>"
    )
    for column, name, color in (
        ("paged_ms", "paged (block tables)", policy_color("paged")),
        ("contiguous_ms", "contiguous (padded)", policy_color("contiguous")),
    ):
        fig.add_trace(
            go.Scatter(
                x=table["time_s"],
                y=table[column],
                name=name,
                mode="lines+markers",
                line={"color": color},
                customdata=custom,
                hovertemplate=hover + name + "</extra>",
            )
        )
    fig.update_xaxes(title="simulated time (s)")
    fig.update_yaxes(title="attention latency per step (ms)", rangemode="tozero")
    return _layout(fig, "Measured attention latency of each sampled step's batch")


def block_heatmap_figure(snapshot, block_size: int, columns: int | None = None) -> go.Figure:
    """Every physical block of the paged cache after one step, in fixed screen space (`ui.block_grid`): one cell
    per block for a small pool (colour = owning request, light grey = free, darker grey = free but still
    prefix-cached; ◆ = shared by several sequences; ○ = partly filled), else cells of consecutive blocks
    coloured by the share used, the hover naming the blocks."""
    owner = np.asarray(snapshot.owner_request)
    ref = np.asarray(snapshot.ref_count)
    num_blocks = len(owner)
    shape = grid_shape(num_blocks, columns)

    def names(start: int, stop: int) -> str:
        return f"block {start:,}" if stop == start + 1 else f"blocks {start:,}–{stop - 1:,}"

    traces = grid_traces(
        owner, ref, np.asarray(snapshot.fill), np.asarray(snapshot.is_cached), names, block_size, shape
    )
    fig = go.Figure(traces)
    xaxis, yaxis = block_axes(shape, "first block id of the row")
    fig.update_xaxes(**xaxis)
    fig.update_yaxes(**yaxis)
    used = int((owner >= 0).sum())
    per_cell = "" if shape.blocks_per_cell == 1 else f"; a cell = {shape.blocks_per_cell:,} blocks"
    title = (
        f"Paged KV cache after step {snapshot.step:,} (t = {snapshot.time_s:,.1f} s): {used:,} of {num_blocks:,} "
        f"blocks used, {int((ref > 1).sum()):,} shared{per_cell}"
    )
    _layout(fig, title, height=max(340, 130 + 16 * shape.rows))
    fig.update_layout(
        showlegend=True, legend={"y": 1.0, "yanchor": "bottom", "x": 1, "xanchor": "right"}, margin={"t": 90}
    )
    return fig


def kv_group_name(kind: str, window: int | None) -> str:
    """ "full attention" or "sliding window 1,024 tokens"."""
    return "full attention" if kind == "full" else f"sliding window {window:,} tokens"


def _hybrid_bands(pool) -> list[tuple[str, np.ndarray, np.ndarray, object]]:
    """(title, owner, fill, names(start, stop)) per group kind (groups of one kind and window side by side, in
    group order), then the pool's free blocks."""
    kinds: dict = {}
    for index, group in enumerate(pool.groups):
        kinds.setdefault((group.kind, group.window), []).append((index, group))
    bands = []
    for (kind, window), members in kinds.items():
        name = kv_group_name(kind, window)
        layers = ", ".join(str(g.num_layers) for _, g in members)
        held = sum(len(g.block_ids) for _, g in members)
        of = f"{len(members)} groups of {layers} layers" if len(members) > 1 else f"{layers} layers"
        title = f"{name} ({of}): {held:,} blocks"
        ids = np.concatenate([np.asarray(g.block_ids, dtype=np.int64) for _, g in members])
        group_of = np.concatenate([np.full(len(g.block_ids), i) for i, g in members])
        owner = np.concatenate([np.asarray(g.owner_request, dtype=np.int64) for _, g in members])
        fill = np.concatenate([np.asarray(g.fill, dtype=np.int64) for _, g in members])
        several = len(members) > 1

        def names(start, stop, name=name, ids=ids, group_of=group_of, several=several) -> str:
            if stop == start + 1:
                group = f", group {group_of[start]}" if several else ""
                return f"{name}{group}, block {ids[start]:,}"
            return f"{name}, its blocks {start:,}–{stop - 1:,} in this band"

        bands.append((title, owner, fill, names))
    free = pool.free_blocks

    def free_names(start, stop) -> str:
        return "free block" if stop == start + 1 else f"free blocks {start:,}–{stop - 1:,} of this band"

    bands.append(
        (
            f"free, shared by every group: {free:,} blocks",
            np.full(free, -1, np.int64),
            np.zeros(free, np.int64),
            free_names,
        )
    )
    return bands


def hybrid_block_heatmap_figure(snapshot, block_size: int, columns: int | None = None) -> go.Figure:
    """The hybrid pool after one step (`snapshot.hybrid_pool`), one band per KV cache group kind plus the free
    blocks: each cell is a block the group holds (its own block ids, increasing; groups of one kind side by
    side), coloured by the owning request as in `block_heatmap_figure`, ○ = partly filled; a large pool draws
    cells of consecutive blocks coloured by the share used (`ui.block_grid`). The blocks of all bands sum to the
    pool's; a window group's band stays small because released blocks return to the pool."""
    pool = snapshot.hybrid_pool
    pool_shape = grid_shape(pool.num_blocks, columns)
    k, cols = pool_shape.blocks_per_cell, pool_shape.cols
    bands = _hybrid_bands(pool)
    shapes = [GridShape(k, cols, max(1, math.ceil(math.ceil(len(o) / k) / cols))) for _, o, _, _ in bands]
    grid_rows = [shape.rows for shape in shapes]
    fig = make_subplots(
        rows=len(bands),
        cols=1,
        row_heights=[r / sum(grid_rows) for r in grid_rows],
        subplot_titles=[title for title, _, _, _ in bands],
        vertical_spacing=min(0.08, 0.3 / len(bands)),
    )
    seen = False
    for row, ((_, owner, fill, names), shape) in enumerate(zip(bands, shapes, strict=True), start=1):
        ref = (owner >= 0).astype(np.int64)  # no sharing: one sequence per request, no prefix caching
        traces = grid_traces(
            owner, ref, fill, np.zeros(len(owner), bool), names, block_size, shape, legend=not seen
        )
        seen = seen or len(traces) > 1 or k > 1
        for trace in traces:
            fig.add_trace(trace, row=row, col=1)
        xaxis, yaxis = block_axes(shape, "")  # rows are named by their first block; the x title says so
        last = row == len(bands)
        xaxis["title"] = f"{xaxis['title']}; a row's label is its first block in the band" if last else ""
        xaxis["showticklabels"] = last  # labels between bands would run into the next band's title
        fig.update_xaxes(**xaxis, row=row, col=1)
        fig.update_yaxes(**yaxis, row=row, col=1)
    used = pool.num_blocks - pool.free_blocks
    per_cell = "" if k == 1 else f"; a cell = {k:,} blocks"
    title = (
        f"Hybrid KV cache after step {snapshot.step:,} (t = {snapshot.time_s:,.1f} s): {used:,} of "
        f"{pool.num_blocks:,} pool blocks used ({pool.group_size:,} layers per block{per_cell})"
    )
    height = max(380, 160 + 60 * len(bands) + 16 * sum(grid_rows))
    _layout(fig, title, height=height)
    plot_height = height - 80 - 90  # less the top and bottom margins
    fig.update_layout(
        showlegend=True,
        legend={"y": -60 / plot_height, "yanchor": "top", "x": 0, "xanchor": "left"},
        margin={"t": 80, "b": 90},
    )
    return fig


def steps_table(results: dict) -> pd.DataFrame:
    """All policies' per-step tables stacked, with a `policy` column (for the CSV download)."""
    frames = [r.steps.assign(policy=name) for name, r in results.items()]
    table = pd.concat(frames, ignore_index=True)
    return table[["policy", *[c for c in table.columns if c != "policy"]]]
