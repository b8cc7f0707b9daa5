"""Plotly figures of the serving simulator. Each takes simulation results (or plain frames) and returns a Figure.

Units: time in seconds of simulated serving, memory in KV token slots (tokens), latency in ms. A policy keeps its
`ui.theme.POLICY_COLORS` colour and a memory category its `MEMORY_COLORS` colour on every chart.
"""

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.serving.memory_policies import POLICY_LABELS
from ui.block_grid import block_axes, grid_shape, grid_traces
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


TIER_COLORS = {"HBM": "#2ca02c", "host": "#3182bd", "prefill": "#7f7f7f"}


def tier_hits_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per admitted request, in admission order: admit time (s) and the cumulative prompt tokens served by HBM's
    prefix cache, loaded from the host tier, and prefilled (computed), from the run's requests frame
    (`prefix_hit_tokens` counts both tiers, `host_hit_tokens` the host tier's share)."""
    admitted = requests[requests["admit_time"].notna()].sort_values("admit_time", kind="stable")
    host = admitted["host_hit_tokens"].to_numpy(dtype=np.int64)
    hits = admitted["prefix_hit_tokens"].to_numpy(dtype=np.int64)
    prompt = admitted["prompt_len"].to_numpy(dtype=np.int64)
    return pd.DataFrame(
        {
            "admit_time_s": admitted["admit_time"].to_numpy(dtype=float),
            "HBM": np.cumsum(hits - host),
            "host": np.cumsum(host),
            "prefill": np.cumsum(prompt - hits),
        }
    )


def tier_hits_figure(requests: pd.DataFrame) -> go.Figure:
    """Where the paged run's prompt tokens came from over time: HBM's prefix cache, the host tier (loaded over
    the host link), or prefill (computed); cumulative, by admission time."""
    table = thin(tier_hits_table(requests))
    fig = go.Figure()
    names = {"HBM": "hit in HBM", "host": "loaded from the host tier", "prefill": "prefilled (computed)"}
    for column, name in names.items():
        fig.add_trace(
            go.Scatter(
                x=table["admit_time_s"],
                y=table[column],
                name=name,
                mode="lines",
                line={"color": TIER_COLORS[column], "width": 2, "shape": "hv"},
                hovertemplate=f"t=%{{x:,.1f}} s<br>%{{y:,}} tokens {name}<extra></extra>",
            )
        )
    fig.update_xaxes(title="simulated time (s)", rangemode="tozero")
    fig.update_yaxes(title="prompt tokens, cumulative", tickformat=",d", rangemode="tozero")
    return _layout(fig, "Prompt tokens by KV tier (paged)")


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


def kv_group_name(kind: str, window: int | None) -> str:
    """ "full attention" or "sliding window 1,024 tokens"."""
    return "full attention" if kind == "full" else f"sliding window {window:,} tokens"


def _held_by_kind(kv_group: np.ndarray, held: np.ndarray, kv_groups) -> str:
    """ "full attention 9, sliding window 32 tokens 6": blocks held per group kind, in first-group order."""
    counts = np.bincount(kv_group[held].astype(np.int64), minlength=len(kv_groups))
    kinds: dict = {}
    for group, count in zip(kv_groups, counts, strict=True):
        name = kv_group_name(group.kind, group.window)
        kinds[name] = kinds.get(name, 0) + int(count)
    return ", ".join(f"{name} {count:,}" for name, count in kinds.items())


def block_heatmap_figure(snapshot, block_size: int, columns: int | None = None, kv_groups=None) -> go.Figure:
    """Every physical block of the paged cache after one step, in fixed screen space (`ui.block_grid`): one cell
    per block for a small pool (colour = owning request, light grey = free, darker grey = free but still
    prefix-cached; ◆ = shared by several sequences; ○ = partly filled), else cells of consecutive blocks
    coloured by the share used, the hover naming the blocks.

    `snapshot` is a paged run's `StepSnapshot`: its `pool` (the one snapshot type) and the request of each block.
    A hybrid pool (`kv_groups` the policy's `PagedKVGroup`s) is the same grid: every group draws
    its block ids from the one pool, the hover names each block's group (`pool.group`) and the title counts the
    blocks each group kind holds."""
    pool = snapshot.pool
    owner = snapshot.owner_request
    ref = pool.ref_count
    num_blocks = len(owner)
    shape = grid_shape(num_blocks, columns)
    hybrid = kv_groups is not None
    group_names = [kv_group_name(g.kind, g.window) for g in kv_groups] if hybrid else []

    def names(start: int, stop: int) -> str:
        if stop != start + 1:
            return f"blocks {start:,}–{stop - 1:,}"
        group = int(pool.group[start]) if hybrid else -1
        return f"block {start:,}" + (f" · group {group}: {group_names[group]}" if group >= 0 else "")

    traces = grid_traces(owner, ref, pool.fill, pool.is_cached, names, block_size, shape)
    fig = go.Figure(traces)
    xaxis, yaxis = block_axes(shape, "first block id of the row")
    fig.update_xaxes(**xaxis)
    fig.update_yaxes(**yaxis)
    used = int((owner >= 0).sum())
    per_cell = "" if shape.blocks_per_cell == 1 else f"; a cell = {shape.blocks_per_cell:,} blocks"
    at = f"after step {snapshot.step:,} (t = {snapshot.time_s:,.1f} s)"
    if hybrid:
        layers = max(g.num_layers for g in kv_groups)
        by_kind = _held_by_kind(pool.group, owner >= 0, kv_groups)
        # the groups on a line of their own: one line ran past a chart of the page's width
        title = (
            f"Hybrid KV cache {at}: {used:,} of {num_blocks:,} blocks used,<br><sup>one pool for every group "
            f"({by_kind}; {layers:,} layers per block{per_cell})</sup>"
        )
    else:
        title = f"Paged KV cache {at}: {used:,} of {num_blocks:,} blocks used, {int((ref > 1).sum()):,} shared{per_cell}"
    _layout(fig, title, height=max(340, 130 + 16 * shape.rows))
    fig.update_layout(
        showlegend=True, legend={"y": 1.0, "yanchor": "bottom", "x": 1, "xanchor": "right"}, margin={"t": 90}
    )
    return fig


def steps_table(results: dict) -> pd.DataFrame:
    """All policies' per-step tables stacked, with a `policy` column (for the CSV download)."""
    frames = [r.steps.assign(policy=name) for name, r in results.items()]
    table = pd.concat(frames, ignore_index=True)
    return table[["policy", *[c for c in table.columns if c != "policy"]]]
