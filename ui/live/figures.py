"""Plotly figures of the Live page: a running server's (or fleet's) KV cache as its metrics and events show it.

Builders take plain data (`LiveHistory.frame()`, histograms, a `CachedBlockTree`, a `Comparison`) and return a
Figure. Units: x is seconds since the page began watching; usage in % of KV blocks; latency in ms. Each server
keeps `sequence_color` of its position in the list of sources; the fleet (their sum) is black throughout.
"""

import html
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from core.live.histogram import Histogram
from core.live.history import FLEET
from core.live.prompt_lookup import first_words
from core.live.tree import CachedBlockTree, Pool
from core.planning.observed.compare import Comparison
from core.planning.observed.planned import PlannedVsObserved
from ui.theme import CACHED_BLOCK_COLOR, policy_color, sequence_color

FLEET_COLOR = "#000000"
PLANNED_COLOR = "#7f7f7f"  # the planner's figures, on every comparison of the page
PRIOR_COLOR = "#c7c7c7"  # the SLO planner's unfitted prediction, beside the fitted one
PERCENTILES = (0.5, 0.9, 0.99)
MAX_TREE_NODES = 1_500  # an icicle of more is slow to draw and unreadable


def source_colors(sources: list[str]) -> dict[str, str]:
    """Source label -> its colour (position in `sources`), the fleet black."""
    return {s: FLEET_COLOR if s == FLEET else sequence_color(i) for i, s in enumerate(sources)}


def _layout(fig: go.Figure, title: str, height: int = 320) -> go.Figure:
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        legend={"orientation": "h", "yanchor": "top", "y": -0.25, "x": 0},
        separators=".,",
    )
    return fig


def _lines(frame: pd.DataFrame, column: str, colors: Mapping[str, str], scale: float, unit: str, **style):
    traces = []
    for source, rows in frame.groupby("source", sort=False):
        rows = rows.dropna(subset=[column])
        if rows.empty:
            continue
        fleet = source == FLEET
        traces.append(
            go.Scatter(
                x=rows["t"],
                y=rows[column] * scale,
                name=str(source),
                mode="lines+markers" if len(rows) < 3 else "lines",
                line={"color": colors.get(source, FLEET_COLOR), "width": 3 if fleet else 2, **style},
                hovertemplate=f"{source}<br>%{{x:,.0f}} s<br>%{{y:,.1f}} {unit}<extra></extra>",
            )
        )
    return traces


def usage_figure(frame: pd.DataFrame, colors: Mapping[str, str]) -> go.Figure:
    """KV cache usage (% of blocks in use, vLLM's kv_cache_usage_perc) over time, one line per server and the
    fleet's block-weighted mean."""
    fig = go.Figure(_lines(frame, "kv_cache_usage", colors, 100.0, "% of KV blocks"))
    fig.update_yaxes(title="KV cache usage (% of blocks)", rangemode="tozero")
    fig.update_xaxes(title="time watched (s)")
    return _layout(fig, "KV cache usage")


def requests_figure(frame: pd.DataFrame, colors: Mapping[str, str]) -> go.Figure:
    """Running (solid) and waiting (dotted) requests over time."""
    fig = go.Figure()
    for column, dash in (("running", "solid"), ("waiting", "dot")):
        for trace in _lines(frame, column, colors, 1.0, f"requests {column}", dash=dash):
            trace.name = f"{trace.name} {column}"
            fig.add_trace(trace)
    fig.update_yaxes(title="requests", rangemode="tozero")
    fig.update_xaxes(title="time watched (s)")
    return _layout(fig, "Requests running (solid) and waiting (dotted)")


def preemptions_figure(frame: pd.DataFrame, colors: Mapping[str, str]) -> go.Figure:
    """Preemptions since each server started (vLLM's num_preemptions counter)."""
    fig = go.Figure(_lines(frame, "preemptions", colors, 1.0, "preemptions"))
    fig.update_yaxes(title="preemptions since start", rangemode="tozero")
    fig.update_xaxes(title="time watched (s)")
    return _layout(fig, "Preemptions (cumulative)")


def hit_rate_figure(frame: pd.DataFrame, colors: Mapping[str, str]) -> go.Figure:
    """Prefix-cache hit rate (% of prompt tokens found cached): each poll's window (solid) and overall since the
    server started (dashed)."""
    fig = go.Figure()
    for trace in _lines(frame, "window_hit_rate", colors, 100.0, "% hit (window)"):
        trace.name = f"{trace.name} window"
        fig.add_trace(trace)
    for trace in _lines(frame, "hit_rate", colors, 100.0, "% hit (overall)", dash="dash"):
        trace.name = f"{trace.name} overall"
        fig.add_trace(trace)
    fig.update_yaxes(title="prefix-cache hit rate (% of tokens)", range=[0, 100])
    fig.update_xaxes(title="time watched (s)")
    return _layout(fig, "Prefix-cache hit rate: last window (solid) and overall (dashed)")


def latency_figure(histograms: Mapping[str, Histogram | None]) -> go.Figure:
    """p50 / p90 / p99 (Prometheus's bucket-interpolated estimate) of each named histogram, in ms."""
    fig = go.Figure()
    names = [n for n, h in histograms.items() if h is not None and h.count > 0]
    for q, shade in zip(PERCENTILES, ("#9ecae1", "#4292c6", "#08519c"), strict=True):
        values = [histograms[n].quantile(q) * 1000 for n in names]
        fig.add_trace(
            go.Bar(
                x=names,
                y=values,
                name=f"p{q * 100:g}",
                marker_color=shade,
                text=[f"{v:,.0f}" if v >= 10 else f"{v:,.1f}" for v in values],
                hovertemplate="%{x}<br>p" + f"{q * 100:g}" + " %{y:,.1f} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="latency (ms, log scale)", type="log")
    return _layout(fig, "Latency percentiles from the histograms (estimates within a bucket)")


def tree_figure(
    tree: CachedBlockTree,
    pools: list[Pool] | None = None,
    max_nodes: int = MAX_TREE_NODES,
    texts: Mapping | None = None,
):
    """An icicle of the cached blocks: one band per pool (KV cache group, medium), under it the prefix chains,
    each block sized by itself plus the cached blocks below it. Shallow and large subtrees come first; past
    `max_nodes` the rest is left out (the space stays, sized by its parent). `texts` (block hash -> the server's
    text of its tokens): a block found there is labelled with its first words, else with its hash. Returns
    (figure, nodes drawn)."""
    texts = texts or {}
    ids, parents, values, labels, hovers = [], [], [], [], []
    budget = max_nodes
    for pool in pools if pools is not None else tree.pools():
        walked = tree.walk(pool)
        pool_id = f"group {pool[0]} · {pool[1]}"
        ids.append(pool_id)
        parents.append("")
        values.append(sum(1 + p.blocks_below for p in walked if p.depth == 1))
        labels.append(pool_id)
        hovers.append(f"{len(walked):,} cached blocks")
        chosen = sorted(walked, key=lambda p: (p.depth, -p.blocks_below))[:budget]
        kept = {p.block.block_hash for p in chosen}
        for p in chosen:
            parent = p.block.parent_hash
            if p.depth > 1 and parent not in kept:
                continue
            ids.append(f"{pool_id}/{_full(p.block.block_hash)}")
            parents.append(pool_id if p.depth == 1 else f"{pool_id}/{_full(parent)}")
            values.append(1 + p.blocks_below)
            text = texts.get(p.block.block_hash)
            labels.append(_short(p.block.block_hash) if text is None else html.escape(first_words(text)))
            tokens = " ".join(str(t) for t in p.block.token_ids[:8])
            shown = "" if text is None else "<br>text " + html.escape(" ".join(text.split())[:120])
            hovers.append(
                f"depth {p.depth}, {p.blocks_below:,} cached blocks below, {p.leaves:,} chains<br>tokens {tokens}"
                + (" …" if len(p.block.token_ids) > 8 else "")
                + shown
            )
        budget -= len(chosen)
    fig = go.Figure(
        go.Icicle(
            ids=ids,
            parents=parents,
            values=values,
            labels=labels,
            branchvalues="total",
            customdata=hovers,
            hovertemplate="%{label}<br>%{value:,} blocks (itself + below)<br>%{customdata}<extra></extra>",
            marker={"colorscale": [[0, CACHED_BLOCK_COLOR], [1, policy_color("paged")]], "colors": values},
            tiling={"orientation": "v"},
            maxdepth=8,
        )
    )
    fig = _layout(
        fig, "Cached blocks as prefix trees (size = the block + cached blocks below it)", height=480
    )
    return fig, len(ids) - len(pools if pools is not None else tree.pools())


def _full(block_hash) -> str:
    return block_hash.hex() if isinstance(block_hash, bytes) else str(block_hash)


def _short(block_hash) -> str:
    if isinstance(block_hash, bytes):
        return block_hash[:4].hex()
    return f"{block_hash & 0xFFFFFFFF:08x}"


def comparison_figure(c: Comparison) -> go.Figure:
    """Planned against observed KV blocks of one replica, and the concurrency each allows at the context length."""
    fig = go.Figure()
    kinds = ["KV blocks per replica", f"requests of {c.context_len:,} tokens"]
    planned = [c.planned_blocks, c.planned_concurrency]
    observed = [c.observed_blocks, c.observed_concurrency]
    fig.add_trace(
        go.Bar(
            x=kinds,
            y=planned,
            name="planned (capacity planner)",
            marker_color=PLANNED_COLOR,
            text=[f"{v:,}" for v in planned],
        )
    )
    if c.observed_blocks is not None:
        fig.add_trace(
            go.Bar(
                x=kinds,
                y=observed,
                name="observed (server)",
                marker_color=policy_color("paged"),
                text=[f"{v:,}" for v in observed],
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="blocks / requests (log scale)", type="log")
    return _layout(fig, f"Predicted against observed (blocks of {c.block_size} tokens)")


PVO_LABELS = {
    "ttft_p50_s": "TTFT p50",
    "ttft_p95_s": "TTFT p95",
    "tpot_p50_s": "TPOT p50",
    "tpot_p95_s": "TPOT p95",
}


def _vs_observed(value: float | None, observed_ms: float) -> str:
    """A bar's label: its value in ms and its signed error against the observed bar."""
    if value is None:
        return ""
    return f"{value * 1000:,.0f} ({100 * (value * 1000 - observed_ms) / observed_ms:+.0f}%)"


def planned_observed_figure(result: PlannedVsObserved, observed_color: str, source: str) -> go.Figure:
    """Planned (grey: the fitted model's simulation) against observed (`source`'s colour) TTFT / TPOT p50 / p95,
    in ms, both read by histogram_quantile over vLLM's buckets; (planned - observed) / observed on the planned bars.
    With `result.prior`, a third bar: the SLO planner's own prediction (engine profile, no fit), its error too."""
    keys = [
        k for k in PVO_LABELS if result.observed.get(k) and result.planned.get(k) is not None
    ]  # > 0: log y
    x = [PVO_LABELS[k] for k in keys]
    planned = [result.planned[k] * 1000 for k in keys]
    observed = [result.observed[k] * 1000 for k in keys]
    signed = [100 * (p - o) / o for p, o in zip(planned, observed, strict=True)]  # planned vs observed, %
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=x,
            y=observed,
            name=f"observed ({source})",
            marker_color=observed_color,
            text=[f"{v:,.0f}" for v in observed],
            hovertemplate="%{x}<br>observed %{y:,.1f} ms<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=x,
            y=planned,
            name="planned (fitted step-time model, simulated)",
            marker_color=PLANNED_COLOR,
            text=[f"{v:,.0f} ({e:+.0f}%)" for v, e in zip(planned, signed, strict=True)],
            hovertemplate="%{x}<br>planned %{y:,.1f} ms<extra></extra>",
        )
    )
    if result.prior is not None:
        prior = [result.prior.get(k) for k in keys]
        fig.add_trace(
            go.Bar(
                x=x,
                y=[None if v is None else v * 1000 for v in prior],
                name="SLO planner (vLLM profile, not fitted)",
                marker_color=PRIOR_COLOR,
                text=[_vs_observed(v, o) for v, o in zip(prior, observed, strict=True)],
                hovertemplate="%{x}<br>SLO planner %{y:,.1f} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="latency (ms, log scale)", type="log")
    w = result.window
    return _layout(
        fig,
        f"Planned vs observed over {w.seconds:,.0f} s ({w.requests:,.0f} requests, "
        f"{w.request_rate:,.2f} req/s)",
    )
