"""Plotly figures of the serving simulator. Each takes simulation results (or plain frames) and returns a Figure.

Units: time in seconds of simulated serving, memory in KV token slots (tokens), latency in ms. A policy keeps its
`ui.theme.POLICY_COLORS` colour and a memory category its `MEMORY_COLORS` colour on every chart.
"""

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.theme import CACHED_BLOCK_COLOR, FREE_BLOCK_COLOR, MEMORY_COLORS, policy_color, sequence_color

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
BREAKDOWN = (
    ("token_states", "token states"),
    ("reservation", "reservation"),
    ("internal_fragmentation", "internal fragmentation"),
    ("external_fragmentation", "external fragmentation"),
)
MAX_POINTS = 2_000


def label(name: str) -> str:
    return POLICY_LABELS.get(name, name)


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


def free_memory_figure(steps: dict[str, pd.DataFrame], capacity: int) -> go.Figure:
    """Free KV slots over time per policy: paged = free-list length x block size; contiguous = slots no
    reservation covers."""
    fig = go.Figure()
    for name, frame in steps.items():
        f = thin(frame)
        fig.add_trace(
            go.Scatter(
                x=f["time_s"],
                y=f["free_slots"],
                name=label(name),
                mode="lines",
                line={"color": policy_color(name), "width": 1.5},
                customdata=np.stack([f["free_blocks"], f["step"]], axis=1),
                hovertemplate="t=%{x:,.1f} s (step %{customdata[1]:,})<br>%{y:,} free slots"
                "<br>free list: %{customdata[0]:,} blocks<extra>" + label(name) + "</extra>",
            )
        )
    fig.update_xaxes(title="simulated time (s)")
    fig.update_yaxes(title="free KV slots (tokens)", range=[0, capacity * 1.02], tickformat=",")
    return _layout(fig, f"Free KV memory over time (capacity {capacity:,} token slots)")


def memory_breakdown_figure(steps: dict[str, pd.DataFrame], capacity: int) -> go.Figure:
    """Stacked areas of token states / reservation / internal / external fragmentation, one panel per policy
    (paged first), in token slots."""
    order = list(POLICY_LABELS)
    names = sorted(steps, key=lambda n: order.index(n) if n in order else len(order))
    fig = make_subplots(
        rows=1,
        cols=len(names),
        shared_yaxes=True,
        subplot_titles=[label(n) for n in names],
        horizontal_spacing=0.02,
    )
    for col, name in enumerate(names, start=1):
        f = thin(steps[name])
        for key, category in BREAKDOWN:
            fig.add_trace(
                go.Scatter(
                    x=f["time_s"],
                    y=f[key],
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
        fig.update_xaxes(title="time (s)", row=1, col=col)
    fig.update_yaxes(title="KV slots (tokens)", range=[0, capacity], tickformat=",", row=1, col=1)
    return _layout(fig, "Where the KV memory goes, step by step", height=440)


def summary_bars_figure(summaries: dict[str, dict], show_paper: bool = True) -> go.Figure:
    """Figure 2 style: each policy's time-averaged share of KV memory, stacked to 100%, with the paper's bar
    beside it when `show_paper`."""
    rows: list[tuple[str, tuple[float, ...], str]] = []
    for name, summary in summaries.items():
        shares = tuple(summary[f"{key}_pct"] for key, _ in BREAKDOWN)
        batched = summary.get("avg_batched_requests", float("nan"))
        rows.append((f"{label(name)} — simulated", shares, f"{batched:,.2f} batched requests"))
        if show_paper and name in PAPER_FIGURE_2:
            note = f"{PAPER_BATCHED[name]:,.2f} batched requests (paper, Fig. 13a)"
            if name == "paged":
                note += "; waste < 4% not split in the paper"
            rows.append((f"{label(name)} — paper", PAPER_FIGURE_2[name], note))
    fig = go.Figure()
    ys = [r[0] for r in rows]
    for i, (_, category) in enumerate(BREAKDOWN):
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
    fig.update_xaxes(title="share of KV capacity, averaged over time (%)", range=[0, 100])
    fig.update_yaxes(autorange="reversed")
    _layout(fig, "KV memory breakdown (paper Figure 2)", height=150 + 42 * len(rows))
    fig.update_layout(legend={"y": 1.0, "yanchor": "bottom", "traceorder": "normal"}, margin={"t": 80})
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
    fig.update_yaxes(title="requests", tickformat=",")
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


def _block_grid_traces(
    owner, ref, fill, cached, names, block_size: int, cols: int, legend: bool = True
) -> list:
    """A grid of blocks, cell i at (i % cols, i // cols): one Heatmap (colour = owning request, light grey = free,
    darker grey = free but prefix-cached; hover: names[i], owner, fill, ref count) plus marker scatters for
    shared (ref count > 1) and partly filled blocks. Arrays are indexed by cell; owner -1 = free."""
    num_blocks = len(owner)
    rows = max(1, math.ceil(num_blocks / cols))
    palette = [sequence_color(i) for i in range(24)]
    # z: 0 free, 1 cached-free, 2.. palette index of the owning request
    code = np.where(owner >= 0, 2 + owner % len(palette), np.where(cached, 1, 0)).astype(float)
    colors = [FREE_BLOCK_COLOR, CACHED_BLOCK_COLOR, *palette]
    n = len(colors)
    scale = []
    for i, color in enumerate(colors):
        scale += [[i / n, color], [(i + 1) / n, color]]
    z = np.full(rows * cols, np.nan)
    z[:num_blocks] = code
    text = np.full(rows * cols, "", dtype=object)
    for b in range(num_blocks):
        who = f"request {owner[b]:,}" if owner[b] >= 0 else ("free (cached)" if cached[b] else "free")
        text[b] = f"{names[b]}<br>{who}<br>{fill[b]}/{block_size} tokens<br>ref count {ref[b]}"
    traces = [
        go.Heatmap(
            z=z.reshape(rows, cols),
            text=text.reshape(rows, cols),
            hoverinfo="text",
            colorscale=scale,
            zmin=0,
            zmax=n,
            showscale=False,
            xgap=1,
            ygap=1,
        )
    ]
    shared = np.flatnonzero(ref > 1)
    if shared.size:
        traces.append(
            go.Scatter(
                x=shared % cols,
                y=shared // cols,
                mode="markers",
                marker={
                    "symbol": "diamond",
                    "size": 6,
                    "color": "white",
                    "line": {"color": "black", "width": 1},
                },
                name="shared block (ref count > 1)",
                hoverinfo="skip",
                showlegend=legend,
            )
        )
    partial = np.flatnonzero((owner >= 0) & (fill < block_size))
    if partial.size:
        traces.append(
            go.Scatter(
                x=partial % cols,
                y=partial // cols,
                mode="markers",
                marker={"symbol": "circle-open", "size": 5, "color": "black"},
                name="partly filled block (internal fragmentation)",
                hoverinfo="skip",
                showlegend=legend,
            )
        )
    return traces


def _grid_columns(num_blocks: int, columns: int | None) -> int:
    return columns or max(8, math.ceil(math.sqrt(num_blocks * 2)))


def block_heatmap_figure(snapshot, block_size: int, columns: int | None = None) -> go.Figure:
    """Every physical block of the paged cache after one step: colour = owning request, light grey = free,
    darker grey = free but still prefix-cached; ◆ = shared by several sequences (ref count > 1); hover shows the
    fill."""
    owner = np.asarray(snapshot.owner_request)
    ref = np.asarray(snapshot.ref_count)
    num_blocks = len(owner)
    cols = _grid_columns(num_blocks, columns)
    rows = math.ceil(num_blocks / cols)
    names = [f"block {b:,}" for b in range(num_blocks)]
    traces = _block_grid_traces(
        owner, ref, np.asarray(snapshot.fill), np.asarray(snapshot.is_cached), names, block_size, cols
    )
    fig = go.Figure(traces)
    fig.update_xaxes(title=f"block id mod {cols}", showgrid=False, zeroline=False)
    fig.update_yaxes(title=f"block id // {cols}", autorange="reversed", showgrid=False, zeroline=False)
    used = int((owner >= 0).sum())
    title = (
        f"Paged KV cache after step {snapshot.step:,} (t = {snapshot.time_s:,.1f} s): {used:,} of {num_blocks:,} "
        f"blocks used, {int((ref > 1).sum()):,} shared"
    )
    _layout(fig, title, height=max(340, 110 + 16 * rows))
    fig.update_layout(
        showlegend=True, legend={"y": 1.0, "yanchor": "bottom", "x": 1, "xanchor": "right"}, margin={"t": 90}
    )
    return fig


def kv_group_name(kind: str, window: int | None) -> str:
    """ "full attention" or "sliding window 1,024 tokens"."""
    return "full attention" if kind == "full" else f"sliding window {window:,} tokens"


def _hybrid_bands(pool) -> list[tuple[str, np.ndarray, np.ndarray, list]]:
    """(title, owner, fill, cell names) per group kind (groups of one kind and window side by side, in group
    order), then the pool's free blocks."""
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
        names = [
            f"{name}, group {i}, block {b:,}" if len(members) > 1 else f"{name}, block {b:,}"
            for i, g in members
            for b in g.block_ids
        ]
        owner = np.concatenate([np.asarray(g.owner_request, dtype=np.int64) for _, g in members])
        fill = np.concatenate([np.asarray(g.fill, dtype=np.int64) for _, g in members])
        bands.append((title, owner, fill, names))
    free = pool.free_blocks
    bands.append(
        (
            f"free, shared by every group: {free:,} blocks",
            np.full(free, -1, np.int64),
            np.zeros(free, np.int64),
            ["free block"] * free,
        )
    )
    return bands


def hybrid_block_heatmap_figure(snapshot, block_size: int, columns: int | None = None) -> go.Figure:
    """The hybrid pool after one step (`snapshot.hybrid_pool`), one band per KV cache group kind plus the free
    blocks: each cell is a block the group holds (its own block ids, increasing; groups of one kind side by
    side), coloured by the owning request as in `block_heatmap_figure`, ○ = partly filled. The cells of all bands
    sum to the pool's blocks; a window group's band stays small because released blocks return to the pool."""
    pool = snapshot.hybrid_pool
    cols = _grid_columns(pool.num_blocks, columns)
    bands = _hybrid_bands(pool)
    grid_rows = [max(1, math.ceil(len(owner) / cols)) for _, owner, _, _ in bands]
    fig = make_subplots(
        rows=len(bands),
        cols=1,
        row_heights=[r / sum(grid_rows) for r in grid_rows],
        subplot_titles=[title for title, _, _, _ in bands],
        vertical_spacing=min(0.08, 0.3 / len(bands)),
    )
    seen = False
    for row, (_, owner, fill, names) in enumerate(bands, start=1):
        ref = (owner >= 0).astype(np.int64)  # no sharing: one sequence per request, no prefix caching
        traces = _block_grid_traces(
            owner, ref, fill, np.zeros(len(owner), bool), names, block_size, cols, legend=not seen
        )
        seen = seen or len(traces) > 1
        for trace in traces:
            fig.add_trace(trace, row=row, col=1)
        rows = grid_rows[row - 1]
        fig.update_yaxes(
            title=f"block in band // {cols}" if rows > 1 else "",
            autorange="reversed",
            tick0=0,
            dtick=max(1, math.ceil(rows / 4)),
            row=row,
            col=1,
        )
    fig.update_xaxes(showgrid=False, zeroline=False, range=[-0.5, cols - 0.5])
    fig.update_yaxes(showgrid=False, zeroline=False)
    fig.update_xaxes(title=f"block in band mod {cols}", row=len(bands), col=1)
    used = pool.num_blocks - pool.free_blocks
    title = (
        f"Hybrid KV cache after step {snapshot.step:,} (t = {snapshot.time_s:,.1f} s): {used:,} of "
        f"{pool.num_blocks:,} pool blocks used ({pool.group_size:,} layers per block)"
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
