"""The SLO planner's charts. Search mode: predicted TTFT and TPOT percentiles against the request rate for a few
configurations, the SLO targets as horizontal lines, the target rate as a vertical line and each configuration's
knee marked. Takes the page model's `Curve`s (plain data) and returns a Figure (no streamlit). Predict mode
(`percentiles_figure`): one deployment's p50 / p90 / p95 / p99 of TTFT, TPOT, ITL and end-to-end latency with
their 95% intervals and the targets.

Invariants the tests read: one colour per configuration (`config_color(i)`), the same in both panels; shapes
named "ttft target" / "tpot target" (y = the target, TPOT in ms), "target rate" (x = the rate) and
"knee i" (x = curve i's knee rate, one per panel), and one knee marker trace per knee.
"""

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.page_models.slo_planner import Curve
from core.serving.latency import PERCENTILES
from ui.theme import config_color

TARGET_COLOR = "#444444"


def _ms(values) -> list:
    return [None if v is None else v * 1e3 for v in values]


def _hover(curve: Curve, what: str, unit: str) -> str:
    return f"{curve.label}<br>%{{x:.3g}} req/s: {what} %{{y:.3g}} {unit}<br>binding: %{{customdata}}<extra></extra>"


def latency_vs_rate_figure(
    curves: Sequence[Curve], rate: float, ttft_target_s: float | None, tpot_target_s: float | None
) -> go.Figure:
    """Two panels side by side, TTFT and TPOT at the curves' percentiles (`Curve.ttft_q` / `tpot_q`, p95 by
    default; s and ms) against the rate (requests/s), log-scaled latency
    (queueing makes it grow by orders of magnitude). A line stops where its points were not simulated (pruned
    by a bound); a curve none of whose points was simulated is not drawn (the caller says why). The knee, where queueing takes over, is a dashed vertical line in the configuration's colour
    with a marker on its point (at the last simulated point before it when the throughput bound pruned it)."""
    ttft_name, tpot_name = (
        (f"TTFT p{curves[0].ttft_q}", f"TPOT p{curves[0].tpot_q}") if curves else ("TTFT", "TPOT")
    )
    fig = make_subplots(rows=1, cols=2, subplot_titles=(ttft_name, tpot_name), horizontal_spacing=0.09)
    for i, curve in enumerate(curves):
        if not curve.simulated:  # a bound ruled out every rate: no line, and no legend entry without one
            continue
        color = config_color(i)  # by rank, so a curve keeps its colour whether or not one above it is drawn
        for col, values, what, unit in (
            (1, list(curve.ttft_s), ttft_name, "s"),
            (2, _ms(curve.tpot_s), tpot_name, "ms"),
        ):
            fig.add_scatter(
                x=list(curve.rates),
                y=values,
                mode="lines+markers",
                name=curve.label,
                legendgroup=str(i),
                showlegend=col == 1,
                line={"color": color},
                marker={"color": color, "size": 6},
                customdata=list(curve.binding),
                hovertemplate=_hover(curve, what, unit),
                row=1,
                col=col,
            )
            if curve.knee_rate is not None:
                _mark_knee(fig, i, curve, values, color, col)
    for col, target, name, unit in ((1, ttft_target_s, "ttft", "s"), (2, tpot_target_s, "tpot", "ms")):
        if target is not None:
            y = target if unit == "s" else target * 1e3
            fig.add_hline(
                y=y,
                line={"color": TARGET_COLOR, "dash": "dash", "width": 1.5},
                name=f"{name} target",
                row=1,
                col=col,
            )
            # on a log axis an annotation's y is log10 of the value (add_hline's own annotation misplaces it)
            fig.add_annotation(
                x=0,
                xref=f"x{'' if col == 1 else col} domain",
                y=math.log10(y),
                yref=f"y{'' if col == 1 else col}",
                text=f"target {y:g} {unit}",
                showarrow=False,
                xanchor="left",
                yanchor="bottom",
                font={"color": TARGET_COLOR, "size": 11},
            )
        fig.add_vline(
            x=rate,
            line={"color": TARGET_COLOR, "dash": "dot", "width": 1.5},
            name="target rate",
            row=1,
            col=col,
        )
    fig.update_xaxes(title_text="request rate (requests/s)", rangemode="tozero")
    # ticks at 1, 2 and 5 x 10^k, each printed as its value (plotly's default prints a bare digit between decades)
    fig.update_yaxes(type="log", dtick="D2", tickformat=",.3~r")
    fig.update_yaxes(title_text=f"{ttft_name} (s, log scale)", row=1, col=1)
    fig.update_yaxes(title_text=f"{tpot_name} (ms, log scale)", row=1, col=2)
    fig.update_layout(
        height=440,
        margin={"t": 40, "b": 40},
        hovermode="closest",
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
    )
    return fig


def _mark_knee(fig: go.Figure, index: int, curve: Curve, values: list, color: str, col: int) -> None:
    """The knee of `curve` in panel `col`: a vertical line at its rate and a marker on the point (or, pruned,
    on the last simulated point before it)."""
    fig.add_vline(
        x=curve.knee_rate,
        line={"color": color, "dash": "dash", "width": 1},
        name=f"knee {index}",
        row=1,
        col=col,
    )
    at = curve.rates.index(curve.knee_rate)
    drawn = next((j for j in range(at, -1, -1) if values[j] is not None), None)
    if drawn is None:
        return
    fig.add_scatter(
        x=[curve.rates[drawn]],
        y=[values[drawn]],
        mode="markers",
        name=f"knee {index}",
        showlegend=False,
        legendgroup=str(index),
        marker={"color": color, "size": 13, "symbol": "x-open", "line": {"width": 2}},
        hovertemplate=f"{curve.label}<br>knee at {curve.knee_rate:.3g} req/s ({curve.knee_reason})<extra></extra>",
        row=1,
        col=col,
    )


PERCENTILE_PANELS = (
    ("ttft", "TTFT", "s", 1.0),
    ("tpot", "TPOT", "ms", 1e3),
    ("itl", "ITL", "ms", 1e3),
    ("e2e", "end-to-end", "s", 1.0),
)
PREDICTED_COLOR = config_color(0)


def percentiles_figure(prediction: dict, targets: dict[str, float]) -> go.Figure:
    """Four panels (TTFT s, TPOT ms, ITL ms, end-to-end s): the predicted percentile (trace "predicted {metric}",
    x "p50" ... "p99") with its 95% interval as error bars (`prediction["intervals"]`), and each target of that
    metric as an open marker at its percentile (trace "target {key}"). `prediction`: `Prediction.to_dict()`;
    `targets`: key -> seconds. A percentile the estimate left undefined (None) is not drawn."""
    quantiles = [f"p{q}" for q in PERCENTILES]
    titles = [f"{name} ({unit})" for _, name, unit, _ in PERCENTILE_PANELS]
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles, horizontal_spacing=0.07)
    intervals = prediction.get("intervals", {})
    for col, (metric, name, unit, factor) in enumerate(PERCENTILE_PANELS, start=1):
        keys = [f"{metric}_p{q}_s" for q in PERCENTILES]
        y = [None if prediction.get(k) is None else prediction[k] * factor for k in keys]
        low = [intervals.get(k, [None, None])[0] for k in keys]
        high = [intervals.get(k, [None, None])[1] for k in keys]
        plus = [None if v is None or h is None else h * factor - v for v, h in zip(y, high, strict=True)]
        minus = [None if v is None or lo is None else v - lo * factor for v, lo in zip(y, low, strict=True)]
        fig.add_scatter(
            x=quantiles,
            y=y,
            mode="markers+lines",
            name=f"predicted {metric}",
            showlegend=col == 1,
            legendgroup="predicted",
            line={"color": PREDICTED_COLOR},
            marker={"color": PREDICTED_COLOR, "size": 8},
            error_y={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
            hovertemplate=f"{name} %{{x}}: %{{y:.4g}} {unit}<extra>predicted</extra>",
            row=1,
            col=col,
        )
        for q in PERCENTILES:
            key = f"{metric}_p{q}_s"
            if key in targets:
                fig.add_scatter(
                    x=[f"p{q}"],
                    y=[targets[key] * factor],
                    mode="markers",
                    name=f"target {key}",
                    showlegend=False,
                    marker={
                        "color": TARGET_COLOR,
                        "size": 14,
                        "symbol": "line-ew-open",
                        "line": {"width": 3},
                    },
                    hovertemplate=f"target {name} p{q} <= %{{y:.4g}} {unit}<extra></extra>",
                    row=1,
                    col=col,
                )
        fig.update_yaxes(title_text=f"{name} ({unit})", rangemode="tozero", row=1, col=col)
    fig.update_xaxes(title_text="percentile", type="category", categoryorder="array", categoryarray=quantiles)
    fig.update_layout(height=360, margin={"t": 40, "b": 40}, hovermode="closest", showlegend=False)
    return fig
