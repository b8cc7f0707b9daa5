"""Plotly figures of the Engine page: a real model's run through the paged KV cache, step by step.

Each builder takes plain data (the engine's per-step metrics frame, `KVCacheSnapshot`s, the sharing measurement) and
returns a Figure. Units: x is the engine step (one scheduler iteration); memory in blocks; latency in ms.
The paged side keeps `ui.theme.POLICY_COLORS["paged"]`, sequences keep `sequence_color` of their admission index.
"""

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from core.kv import KVCacheSnapshot
from ui.playground.figures import block_heatmap
from ui.theme import POLICY_COLORS, policy_color

PREEMPTION_COLOR = "#d62728"
COPY_COLOR = "#ff7f0e"
PREFILL_COLOR = "#1f77b4"


def _layout(fig: go.Figure, title: str, height: int = 360) -> go.Figure:
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0},
        separators=".,",
    )
    return fig


def sequence_color_index(snapshots: Iterable[KVCacheSnapshot]) -> dict:
    """Sequence id -> its stable colour index: the order in which the sequence first appears across `snapshots`
    (admission order), so a sequence keeps its colour at every step of the slider."""
    index: dict = {}
    for snapshot in snapshots:
        for seq in snapshot.seq_ids:
            index.setdefault(seq, len(index))
    return index


def engine_block_heatmap(snapshot: KVCacheSnapshot, step: int, color_index: Mapping) -> go.Figure:
    """The playground's block grid for the pool after engine step `step` (one colour per live sequence)."""
    used = snapshot.num_blocks - snapshot.num_free_blocks
    shared = int(snapshot.is_shared.sum())
    title = (
        f"Physical blocks after step {step:,}: {used:,} of {snapshot.num_blocks:,} in use, {shared:,} shared<br>"
        f"<sup>×n = held by n sequences; {snapshot.block_size} tokens per block</sup>"
    )
    fig = block_heatmap(snapshot, color_index, title=title)
    # the grid's x axis (and its title) sits on top: the title goes above it, at the top of the figure
    fig.update_layout(
        title={"text": title, "yref": "container", "y": 1.0, "yanchor": "top", "pad": {"t": 8}},
        margin={"t": 130},
        height=fig.layout.height + 50,
    )
    return fig


def free_blocks_figure(steps: pd.DataFrame, num_blocks: int) -> go.Figure:
    """Free blocks (free list, cached-free included) and shared blocks after each step, the pool size dashed and
    each step that preempted a request marked with an x."""
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=steps["step"],
            y=steps["free_blocks"],
            name="free blocks",
            mode="lines",
            line={"shape": "hv", "color": policy_color("paged")},
            hovertemplate="step %{x:,}<br>%{y:,} free blocks<extra></extra>",
        )
    )
    if "shared_blocks" in steps:
        fig.add_trace(
            go.Scatter(
                x=steps["step"],
                y=steps["shared_blocks"],
                name="shared blocks (ref count > 1)",
                mode="lines",
                line={"shape": "hv", "color": COPY_COLOR, "dash": "dot"},
                hovertemplate="step %{x:,}<br>%{y:,} shared blocks<extra></extra>",
            )
        )
    preempted = steps[steps["preemptions"] > 0]
    if len(preempted):
        fig.add_trace(
            go.Scatter(
                x=preempted["step"],
                y=preempted["free_blocks"],
                name="preemption (recompute)",
                mode="markers",
                marker={"symbol": "x", "size": 10, "color": PREEMPTION_COLOR},
                customdata=preempted["preemptions"],
                hovertemplate="step %{x:,}: %{customdata:,} preempted<extra></extra>",
            )
        )
    fig.add_hline(
        y=num_blocks, line_dash="dash", line_color=POLICY_COLORS["contiguous"], annotation_text="pool"
    )
    fig.update_xaxes(title="engine step", tickformat=",")
    fig.update_yaxes(title="blocks", rangemode="tozero", range=[0, num_blocks * 1.05], tickformat=",")
    return _layout(fig, f"Free and shared blocks after each step (pool {num_blocks:,} blocks)")


def copy_on_write_figure(steps: pd.DataFrame) -> go.Figure:
    """Copy-on-write block copies per step (a sample or beam writing into a block it shares), bars."""
    copies = steps["cow_copies"]
    total = int(copies.sum())
    fig = go.Figure(
        go.Bar(
            x=steps["step"],
            y=copies,
            name="copy-on-write copies",
            marker_color=COPY_COLOR,
            hovertemplate="step %{x:,}<br>%{y:,} blocks copied<extra></extra>",
        )
    )
    fig.update_xaxes(title="engine step", tickformat=",")
    fig.update_yaxes(title="blocks copied", rangemode="tozero", tickformat=",")
    return _layout(fig, f"Copy-on-write copies per step ({total:,} in all)")


def attention_latency_figure(steps: pd.DataFrame) -> go.Figure:
    """Measured wall time of the attention calls in each step (all layers, ms): steps that ran prefill tokens
    (prompt chunks, recomputation) are drawn apart from pure decode steps."""
    has_prefill = steps["prefill_tokens"] > 0
    fig = go.Figure()
    for mask, name, color in (
        (~has_prefill, "decode only", policy_color("paged")),
        (has_prefill, "with prefill tokens", PREFILL_COLOR),
    ):
        part = steps[mask]
        if not len(part):
            continue
        fig.add_trace(
            go.Scatter(
                x=part["step"],
                y=part["attention_ms"],
                name=name,
                mode="markers",
                marker={"color": color, "size": 6},
                customdata=np.stack([part["running_seqs"], part["prefill_tokens"]], axis=1),
                hovertemplate="step %{x:,}<br>%{y:,.3f} ms<br>%{customdata[0]:,} sequences, "
                "%{customdata[1]:,} prefill tokens<extra>" + name + "</extra>",
            )
        )
    fig.update_xaxes(title="engine step", tickformat=",")
    fig.update_yaxes(title="attention time per step (ms)", rangemode="tozero")
    return _layout(fig, "Paged attention latency per step, all layers (measured)")


STEP_PARTS = (
    ("attention_ms", "attention", PREFILL_COLOR),
    ("rest_of_model_ms", "rest of the model", "#9467bd"),
    ("host_ms", "host (scheduling, tables, sampling)", "#7f7f7f"),
)


def step_time_figure(steps: pd.DataFrame) -> go.Figure:
    """Where each step's wall time goes (ms, stacked bars): the paged attention kernels, the rest of the model and
    host work, which add up to the step's time (`core.engine.metrics`). The title gives each part's share of the
    run's step time and the median step."""
    total = float(steps["step_time_ms"].sum())
    fig = go.Figure()
    shares = []
    for column, name, color in STEP_PARTS:
        share = float(steps[column].sum()) / total if total > 0 else 0.0
        shares.append(f"{name.split(' (')[0]} {share:.0%}")
        fig.add_trace(
            go.Bar(
                x=steps["step"],
                y=steps[column],
                name=name,
                marker_color=color,
                customdata=steps["step_time_ms"],
                hovertemplate="step %{x:,}<br>%{y:,.2f} of %{customdata:,.2f} ms<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(barmode="stack", bargap=0.1)
    fig.update_xaxes(title="engine step", tickformat=",")
    fig.update_yaxes(title="step time (ms)", rangemode="tozero")
    median = float(steps["step_time_ms"].median()) if len(steps) else 0.0
    return _layout(fig, f"Step time, median {median:,.1f} ms: {', '.join(shares)} (measured)")


def sharing_figure(measured: pd.DataFrame, ours: str = "tiny random model") -> go.Figure:
    """Memory saved by sharing (% of the blocks the same sequences would hold without sharing), ours beside the
    paper's Figure 15. `measured`: one row per run with columns mode ("parallel sampling" / "beam search"),
    width, saving_pct (ours, on the model named `ours`), paper_pct (the paper's, NaN where it has none), as
    `measure_sharing` returns, and optionally random_model_pct (the tiny random model, as bench/sharing.py
    prints it), drawn as a third series when it holds a figure (a run without the random model has NaN there)."""
    labels = [
        f"{'n' if m == 'parallel sampling' else 'beam'} = {w}"
        for m, w in zip(measured["mode"], measured["width"], strict=True)
    ]
    series = [("saving_pct", f"this engine ({ours})", policy_color("paged"))]
    if "random_model_pct" in measured and measured["random_model_pct"].notna().any():
        series.append(("random_model_pct", "this engine (tiny random model)", COPY_COLOR))
    series.append(("paper_pct", "paper, Figure 15 (OPT-13B)", POLICY_COLORS["contiguous"]))
    fig = go.Figure()
    for column, name, color in series:
        values = measured[column].to_numpy(dtype=float)
        fig.add_trace(
            go.Bar(
                x=labels,
                y=values,
                name=name,
                marker_color=color,
                text=[f"{v:.1f}%" if np.isfinite(v) else "" for v in values],
                textposition="outside",
                hovertemplate="%{x}: %{y:.1f}% saved<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="parallel samples (n) / beam width")
    fig.update_yaxes(title="KV blocks saved by sharing (%)", range=[0, 100])
    return _layout(fig, "Memory saved by sharing, paper Figure 15's setting", height=400)


def outputs_table(prompts: Sequence, outputs: Sequence, decode=None) -> pd.DataFrame:
    """One row per completion: prompt index, sample/beam rank, tokens generated, cumulative log-probability,
    finish reason and the text (decoded by `decode(token_ids)` when given, else the token ids)."""
    rows = []
    for i, (prompt, request) in enumerate(zip(prompts, outputs, strict=True)):
        for rank, completion in enumerate(request.outputs):
            ids = list(completion.token_ids)
            rows.append(
                {
                    "prompt": i,
                    "prompt tokens": len(prompt),
                    "output": rank,
                    "tokens": len(ids),
                    "cumulative logprob": round(float(completion.cumulative_logprob), 4),
                    "finish": completion.finish_reason,
                    "text": decode(ids) if decode is not None else " ".join(map(str, ids)),
                }
            )
    return pd.DataFrame(rows)
