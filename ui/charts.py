"""Plotly charts built once per input and sent as the same immutable JSON to every session that asks.

`cached_chart(where, builder, *args)` stands for `where.plotly_chart(builder(*args), width="stretch")`. The first
call for given inputs builds the figure, thins it to what a screen can show (`fit_to_screen`) and serializes it;
every later call, from any session, sends that JSON again: no figure is built, validated or serialized twice.
A render then costs the element's id and the send, not ~10-90 ms of plotly per chart.

`cached_dataframe` does the same for a table (its Arrow conversion), and `cached_value` for any pure computation
a page repeats on every render.

Inputs are recognised by value for plain data (numbers, strings, tuples, lists, dicts and sets of them, frozen
dataclasses) and by identity for everything else (the shared, read-only results the job cache hands every
session). An entry holds its identity-keyed inputs by weak reference where they allow one (DataFrames, arrays,
most objects), so the chart cache never keeps a job result alive after the result cache let it go (a replica's
memory stays bounded by that cache: pinning them held ~0.5 GB more on a replica under 20 distinct simulations);
an entry matches only while each of those inputs is alive and is the very object asked with, so a reused id
never matches. Inputs without weak references are held strongly. The cache holds at most MAX_ENTRIES values. A
builder must be a pure function of its arguments, which is what `ui/*/figures.py` builders are.

Sessions asking for the same inputs at once share one build: the first builds, the others wait for its value
(a replica's ten first visitors of a page used to build each of its charts ten times over, under one interpreter
lock). A build that raises hands nothing on: each waiter then tries for itself.

The element is the one `st.plotly_chart(figure, width="stretch")` sends (the same proto, a test compares them),
except that its id hashes a digest of the spec rather than the spec; when this Streamlit's internals differ, it
falls back to `st.plotly_chart` with the figure read back from the cached JSON.
"""

import dataclasses
import hashlib
import itertools
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.io
import pyarrow as pa
import streamlit as st

MAX_ENTRIES = 256
MAX_POINTS = 1_200  # per trace: about the plot area's width in pixels on a wide screen
_PLAIN = (type(None), bool, int, float, str, bytes)
_PER_POINT = ("x", "y", "text", "hovertext", "customdata", "ids")


@dataclass(frozen=True)
class _Chart:
    spec: str  # the thinned figure's plotly JSON, as Streamlit sends it
    digest: str  # of `spec`: what the element id hashes instead of the whole spec
    height: int  # pixels: the figure's layout height, else plotly's default


# key -> (value, pins): pins holds a weak (or, for inputs without one, strong) reference per identity-keyed input
_CACHE: OrderedDict = OrderedDict()
_BUILDING: dict = {}  # key -> threading.Event set when the build of that key in progress ends
_LOCK = threading.Lock()


def _fingerprint(value, pins: list):
    """A hashable key for `value`: by value for plain data, by identity (appending it to `pins`) otherwise."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, tuple | list):
        return (type(value).__name__, *(_fingerprint(v, pins) for v in value))
    if isinstance(value, dict):
        return ("dict", *((_fingerprint(k, pins), _fingerprint(v, pins)) for k, v in value.items()))
    if isinstance(value, set | frozenset) and all(isinstance(v, _PLAIN) for v in value):
        return ("set", frozenset(value))
    if dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen:
        try:
            hash(value)
            return ("frozen", value)
        except TypeError:
            pass
    pins.append(value)
    return ("id", id(value))


def cached_value(builder: Callable, *args, **kwargs):
    """`builder(*args, **kwargs)`, computed the first time these inputs are asked for and then handed, shared and
    read-only, to every session that asks again (inputs recognised as the module docstring says). A caller that
    asks while another builds the same inputs waits for that build instead of repeating it."""
    pins: list = []
    key = (builder.__module__, builder.__qualname__, _fingerprint(args, pins), _fingerprint(kwargs, pins))
    while True:
        with _LOCK:
            entry = _CACHE.get(key)
            if entry is not None and all(held() is pin for held, pin in zip(entry[1], pins, strict=True)):
                _CACHE.move_to_end(key)
                return entry[0]
            building = _BUILDING.get(key)
            if building is None:
                building = _BUILDING[key] = threading.Event()
                break  # this caller builds
        building.wait()  # then look again: its value, or (it raised) a build of our own
    try:
        value = builder(*args, **kwargs)
        with _LOCK:
            _CACHE[key] = (value, tuple(map(_reference, pins)))
            while len(_CACHE) > MAX_ENTRIES:
                _CACHE.popitem(last=False)
    finally:
        with _LOCK:
            del _BUILDING[key]
        building.set()
    return value


def _reference(value) -> Callable[[], object]:
    """A weak reference to `value`, or a strong one (a function returning it) when it allows none."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


def _chart(builder: Callable, *args, **kwargs) -> _Chart:
    figure = fit_to_screen(builder(*args, **kwargs))
    spec = plotly.io.to_json(figure.to_dict(), validate=False)
    height = figure.layout.height
    height = int(height) if isinstance(height, int | float) and height > 0 else 450
    return _Chart(spec, hashlib.sha256(spec.encode()).hexdigest(), height)


def cached_chart(where, builder: Callable, *args, **kwargs) -> None:
    """Draw `builder(*args, **kwargs)` in `where` (the `st` module, a column or a container) at full width,
    built, thinned and serialized only the first time these inputs are asked for."""
    chart = cached_value(_chart, builder, *args, **kwargs)
    dg = where if hasattr(where, "_enqueue") else st._main
    try:
        _send(dg, chart)
    except (ImportError, AttributeError, TypeError):  # another Streamlit's internals: the public call
        dg.plotly_chart(plotly.io.from_json(chart.spec, skip_invalid=True), width="stretch")


def _arrow_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False)


def cached_dataframe(where, rows: list[dict], **kwargs) -> None:
    """`where.dataframe(pd.DataFrame(rows), hide_index=True, **kwargs)`, with the rows converted to Arrow once
    per input rather than on every render (pandas to Arrow is most of what a table costs the server)."""
    dg = where if hasattr(where, "_enqueue") else st._main
    dg.dataframe(cached_value(_arrow_table, rows), hide_index=True, **kwargs)


def _send(dg, chart: _Chart) -> None:
    """Enqueue the PlotlyChart element `st.plotly_chart(figure, width="stretch")` would (Streamlit 1.67)."""
    from streamlit.elements.lib.form_utils import current_form_id
    from streamlit.elements.lib.layout_utils import LayoutConfig
    from streamlit.elements.lib.utils import compute_and_register_element_id
    from streamlit.proto.PlotlyChart_pb2 import PlotlyChart

    proto = PlotlyChart()
    proto.theme = "streamlit"
    proto.form_id = current_form_id(dg)
    proto.spec = chart.spec
    proto.config = "{}"
    proto.id = compute_and_register_element_id(
        "plotly_chart",
        user_key=None,
        key_as_main_identity=False,
        dg=dg,
        plotly_spec=chart.digest,  # the same id for the same chart, without hashing ~0.4 MB per render
        plotly_config=proto.config,
        selection_mode=("points", "box", "lasso"),
        is_selection_activated=False,
        theme="streamlit",
        width="stretch",
        height="content",
        alt=None,
    )
    dg._enqueue("plotly_chart", proto, layout_config=LayoutConfig(width="stretch", height=chart.height))


def fit_to_screen(figure, max_points: int = MAX_POINTS):
    """`figure` with every long scatter trace cut to about `max_points` points a screen can tell apart (fewer
    in a subplot, in proportion to its width):
    stacked traces (a `stackgroup`) keep every k-th point, so the stack stays aligned; other lines keep, per
    bucket of x, the points with the smallest and largest y, so spikes and dips stay visible. The first and last
    points always stay; per-point arrays (x, y, text, hover text, custom data, ids, marker colours) are cut
    alike. Heatmaps wider than `max_points` columns keep every k-th column. Returns the same figure, changed."""
    for trace in figure.data:
        points = _points_across(figure, trace, max_points)
        if trace.type in ("scatter", "scattergl") and trace.y is not None and len(trace.y) > points:
            y = np.asarray(trace.y)
            if trace.stackgroup or y.dtype.kind not in "iuf":
                index = _every_kth(len(y), points)
            else:
                index = _extremes(y, points // 2)
            updates = {}
            for name in _PER_POINT:
                values = getattr(trace, name)
                if values is not None and not isinstance(values, str) and len(values) == len(y):
                    updates[name] = np.asarray(values)[index]
            color = trace.marker.color if trace.marker else None
            if color is not None and not isinstance(color, str) and len(color) == len(y):
                updates["marker.color"] = np.asarray(color)[index]
            trace.update(updates)
        elif trace.type == "heatmap" and trace.z is not None:
            z = np.asarray(trace.z)
            if z.ndim == 2 and z.shape[1] > max_points:
                columns = _every_kth(z.shape[1], max_points)
                updates = {"z": z[:, columns]}
                if trace.x is not None and len(trace.x) == z.shape[1]:
                    updates["x"] = np.asarray(trace.x)[columns]
                trace.update(updates)
    return figure


def _points_across(figure, trace, max_points: int) -> int:
    """`max_points` scaled by the share of the figure's width the trace's x axis spans (a subplot in a row of
    four gets a quarter), at least 200."""
    axis = getattr(trace, "xaxis", None) or "x"
    try:
        low, high = figure.layout["xaxis" + axis[1:]].domain or (0, 1)
    except (KeyError, ValueError, TypeError):
        low, high = 0, 1
    return max(200, int(max_points * (high - low)))


def _every_kth(length: int, max_points: int) -> np.ndarray:
    stride = math.ceil(length / max_points)
    return np.unique(np.concatenate([np.arange(0, length, stride), [length - 1]]))


def _extremes(y: np.ndarray, buckets: int) -> np.ndarray:
    """Per bucket of consecutive points, the indices of its smallest and largest finite y (NaN gaps kept as
    one NaN per bucket), plus the first and last index; sorted."""
    edges = np.linspace(0, len(y), buckets + 1).astype(int)
    keep = [0, len(y) - 1]
    for start, end in itertools.pairwise(edges):
        if end <= start:
            continue
        part = y[start:end].astype(float)
        finite = np.isfinite(part)
        if not finite.all():
            keep.append(start + int(np.argmin(finite)))  # a gap stays a gap
        if finite.any():
            masked_low = np.where(finite, part, np.inf)
            masked_high = np.where(finite, part, -np.inf)
            keep.extend((start + int(np.argmin(masked_low)), start + int(np.argmax(masked_high))))
    return np.unique(np.asarray(keep))
