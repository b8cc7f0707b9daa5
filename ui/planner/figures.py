"""Plotly figures of the capacity planner. Each takes plain numbers and returns a Figure (no streamlit)."""

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from core.planning.memory.what_if import MEMORY_CATEGORIES, WorkloadWhatIf
from ui.theme import MEMORY_COLORS, POLICY_COLORS, fmt_int, integer_dtick

GiB = 1024**3
HEADROOM_COLOR = "#bdbdbd"
COMPARISON_DASHES = ("solid", "dash", "dot", "dashdot")
BREAKDOWN_ORDER = MEMORY_CATEGORIES
BREAKDOWN_LABELS = {
    "weights": "weights",
    "activations": "activations (estimate)",
    "kv cache": "KV used by the workload",
    "internal fragmentation": "KV internal fragmentation",
    "free": "KV free",
    "headroom": "headroom (1 − utilization)",
}


def activation_label(estimated: Mapping[str, bool] | None) -> str:
    """The activations' legend entry, as the formula says it: "(estimate)" when every scenario estimates its
    activation peak, "(entered peak)" when every one uses an entered (profiled) peak, both otherwise."""
    kinds = set((estimated or {}).values()) or {True}
    if kinds == {True}:
        return "activations (estimate)"
    return "activations (entered peak)" if kinds == {False} else "activations (estimate / entered peak)"


def memory_breakdown_figure(
    breakdowns: Mapping[str, Mapping[str, int]],
    gpu_memory: Mapping[str, int],
    activation_estimated: Mapping[str, bool] | None = None,
) -> go.Figure:
    """Stacked horizontal bars, one per scenario, in GiB per GPU; a marker shows each GPU's total memory.
    activation_estimated: per scenario, whether its activation reserve is the estimate (default) or an entered
    peak; the legend and each bar's hover say which."""
    names = list(breakdowns)
    labels = {**BREAKDOWN_LABELS, "activations": activation_label(activation_estimated)}
    fig = go.Figure()
    for category in BREAKDOWN_ORDER:
        color = HEADROOM_COLOR if category == "headroom" else MEMORY_COLORS[category]
        values = [breakdowns[n][category] / GiB for n in names]
        hover = [BREAKDOWN_LABELS[category]] * len(names)
        if category == "activations":
            estimated = activation_estimated or {}
            hover = [
                "activations (estimate)" if estimated.get(n, True) else "activations (entered peak)"
                for n in names
            ]
        fig.add_bar(
            y=names,
            x=values,
            orientation="h",
            name=labels[category],
            marker_color=color,
            customdata=hover,
            hovertemplate="%{y}: %{x:,.2f} GiB<extra>%{customdata}</extra>",
        )
    fig.add_scatter(
        y=names,
        x=[gpu_memory[n] / GiB for n in names],
        mode="markers",
        marker={"symbol": "line-ns-open", "size": 28, "color": "black"},
        name="GPU memory",
        hovertemplate="%{y}: %{x:,.2f} GiB GPU memory<extra></extra>",
    )
    fig.update_layout(
        barmode="relative",
        xaxis_title="memory per GPU (GiB, 1 GiB = 1,073,741,824 bytes)",
        yaxis={"title": "scenario", "autorange": "reversed"},  # A on top, as the verdicts read
        height=180 + 70 * len(names),
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},  # above: clear of the axis title
        margin={"t": 60},
    )
    return fig


def concurrency_vs_context_figure(
    contexts: Sequence[int], series: Mapping[str, Sequence[int]], chosen_context: int | None = None
) -> go.Figure:
    """Max concurrent requests (whole deployment) vs request length, one line per GPU option.

    series: label -> concurrency for each of `contexts` (tokens). The first series is the chosen GPU (solid).
    """
    fig = go.Figure()
    for i, (label, values) in enumerate(series.items()):
        fig.add_scatter(
            x=list(contexts),
            y=list(values),
            mode="lines+markers",
            name=label,
            line={"dash": COMPARISON_DASHES[i % len(COMPARISON_DASHES)], "width": 3 if i == 0 else 2},
            hovertemplate="%{x:,} tokens: %{y:,} requests<extra>" + label + "</extra>",
        )
    if chosen_context:
        fig.add_vline(x=chosen_context, line_dash="dot", line_color="gray", annotation_text="max_model_len")
    ticks = [c for c in contexts if c & (c - 1) == 0][::2] or list(contexts)  # every other power of two
    fig.update_layout(
        xaxis={
            "title": "context length per request (tokens, log scale)",
            "type": "log",
            "tickmode": "array",
            "tickvals": ticks,
            "ticktext": [context_label(c) for c in ticks],
        },
        yaxis={
            "title": "max concurrent requests (requests, log scale)",
            "type": "log",
            "dtick": 1,  # one label per decade: minor ticks unlabelled, so labels never run together
            "tickformat": ",d",
        },
        height=420,
        margin={"t": 30},
    )
    return fig


def context_label(tokens: int) -> str:
    """A short axis label for a token count: 512, 4k, 128k, 1M (binary: 1k = 1,024 tokens)."""
    if tokens >= 1 << 20 and tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens >> 10}k"
    return f"{tokens:,}"


def paged_vs_contiguous_figure(
    what_ifs: Mapping[str, WorkloadWhatIf], max_num_seqs: Mapping[str, int] | None = None
) -> go.Figure:
    """Average concurrent requests per replica that the KV cache holds for the workload (memory-bound, before
    the max_num_seqs cap): paged, Orca-Oracle (exact reservation) and contiguous (max_model_len reservation).
    A dash marks each scenario's max_num_seqs."""
    names = list(what_ifs)
    bars = (
        ("paged (blocks for the actual length)", "paged", "paged_memory_concurrency"),
        ("Orca-Oracle (reserves exact prompt + output)", "orca-oracle", "oracle_memory_concurrency"),
        ("contiguous (reserves max_model_len)", "contiguous", "contiguous_memory_concurrency"),
    )
    fig = go.Figure()
    tops = [getattr(what_ifs[n], attr) for _, _, attr in bars for n in names]
    tops += list((max_num_seqs or {}).values())
    for label, policy, attr in bars:
        values = [getattr(what_ifs[n], attr) for n in names]
        fig.add_bar(
            x=names,
            y=values,
            name=label,
            marker_color=POLICY_COLORS[policy],
            text=[fmt_int(v) if v >= 10 else f"{v:.1f}" for v in values],
            textposition="outside",
            hovertemplate="%{x}: %{y:,.1f} requests<extra>" + label + "</extra>",
        )
    if max_num_seqs:
        fig.add_scatter(
            x=names,
            y=[max_num_seqs[n] for n in names],
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 60, "color": "black"},
            name="max_num_seqs (scheduler cap)",
            hovertemplate="%{x}: max_num_seqs %{y:,}<extra></extra>",
        )
    fig.update_layout(
        barmode="group",
        yaxis={
            "title": "concurrent requests the KV cache holds, per replica (requests)",
            "rangemode": "tozero",
            "dtick": integer_dtick(max(tops, default=1)),
        },
        xaxis_title="scenario",
        height=420,
        margin={"t": 30},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def fragmentation_figure(
    rows: Sequence[Mapping[str, float]], chosen_block_size: int | None = None
) -> go.Figure:
    """Internal fragmentation (% of allocated KV slots that hold no token) vs block size (tokens)."""
    sizes = [int(r["block_size"]) for r in rows]
    percent = [100 * r["internal_fragmentation"] for r in rows]
    colors = [MEMORY_COLORS["internal fragmentation"] if s == chosen_block_size else "#fdd0a2" for s in sizes]
    fig = go.Figure(
        go.Bar(
            x=[str(s) for s in sizes],
            y=percent,
            marker_color=colors,
            text=[f"{p:.1f}%" for p in percent],
            textposition="outside",
            customdata=[r["wasted_slots"] for r in rows],
            hovertemplate="block size %{x} tokens: %{y:.2f}% of slots empty, %{customdata:.1f} slots per request"
            "<extra></extra>",
        )
    )
    fig.update_layout(
        xaxis={"title": "block size (tokens)", "type": "category"},
        yaxis_title="internal fragmentation (% of allocated slots)",
        height=380,
        margin={"t": 30},
    )
    return fig
