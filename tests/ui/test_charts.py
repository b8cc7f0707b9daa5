"""Charts built once per input and sent as cached JSON: the element equals what st.plotly_chart sends, a builder
runs once per input whoever asks, and long series are thinned without losing their extremes."""

import gc
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from streamlit.testing.v1 import AppTest

from ui import charts
from ui.charts import _fingerprint, cached_chart, cached_value, fit_to_screen

CALLS = []


def _line(points: int, scale: float = 1.0) -> go.Figure:
    CALLS.append((points, scale))
    return go.Figure(go.Scatter(x=list(range(points)), y=[scale * i for i in range(points)]))


def _script():
    import plotly.graph_objects as go
    import streamlit as st

    from ui.charts import cached_chart

    def build(n):
        return go.Figure(go.Bar(x=["a", "b"], y=[n, 2 * n]), layout={"height": 333, "title": "t"})

    st.plotly_chart(build(3), width="stretch")
    left, _ = st.columns(2)
    cached_chart(left, build, 3)


def test_the_element_is_the_one_st_plotly_chart_sends_but_for_its_id():
    at = AppTest.from_function(_script, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    public, cached = (chart.proto for chart in at.get("plotly_chart"))
    assert (cached.spec, cached.config, cached.theme, cached.form_id) == (
        public.spec,
        public.config,
        public.theme,
        public.form_id,
    )
    assert cached.id and cached.id != public.id


def test_a_builder_runs_once_per_input(monkeypatch):
    sent = []
    monkeypatch.setattr(charts, "_send", lambda dg, chart: sent.append(chart))
    monkeypatch.setattr(charts, "_CACHE", type(charts._CACHE)())
    CALLS.clear()
    for _ in range(3):
        cached_chart(object(), _line, 10, scale=2.0)  # `where` is never used when sending is patched
    cached_chart(object(), _line, 11, scale=2.0)
    assert CALLS == [(10, 2.0), (11, 2.0)]
    assert sent[0] is sent[1] is sent[2] and sent[3] is not sent[0]
    shared = {"rows": [1, 2]}  # a dict of plain values: keyed by value, so an equal copy hits too
    pins = []
    assert _fingerprint(shared, pins) == _fingerprint({"rows": [1, 2]}, pins) and pins == []
    frame = np.arange(3)  # not plain: keyed by identity
    assert _fingerprint(frame, pins) == ("id", id(frame)) and pins == [frame]
    owned = {3, 1, 2}  # a set of plain values (the Kernels page's block map): by value, any order
    assert _fingerprint(owned, pins) == _fingerprint({1, 2, 3}, pins) != _fingerprint({1, 2}, pins)
    assert pins == [frame]


def test_cached_value_computes_once_per_input(monkeypatch):
    monkeypatch.setattr(charts, "_CACHE", type(charts._CACHE)())
    calls = []

    def square(n, owned=frozenset()):
        calls.append(n)
        return [n * n, len(owned)]

    first = cached_value(square, 4, owned={1, 2})
    assert cached_value(square, 4, owned={2, 1}) is first == [16, 2]
    assert cached_value(square, 5) == [25, 0] and calls == [4, 5]


def test_an_entry_keeps_no_job_result_alive_and_a_new_object_never_matches(monkeypatch):
    monkeypatch.setattr(charts, "_CACHE", type(charts._CACHE)())
    calls = []

    def total(frame):
        calls.append(len(calls))
        return float(frame["x"].sum())

    frame = pd.DataFrame({"x": [1, 2]})
    held = weakref.ref(frame)
    assert cached_value(total, frame) == cached_value(total, frame) == 3.0 and len(calls) == 1
    del frame
    gc.collect()
    assert held() is None  # the result cache dropped it: the chart cache does not keep it
    for value in range(4, 9):  # new frames, some likely at the dead one's address: each computed afresh
        assert cached_value(total, pd.DataFrame({"x": [value, 0]})) == value
    assert len(calls) == 6


def test_sessions_asking_at_once_share_one_build_and_a_failed_build_blocks_nobody(monkeypatch):
    monkeypatch.setattr(charts, "_CACHE", type(charts._CACHE)())
    calls, started = [], threading.Event()

    def slow(n):
        calls.append(n)
        started.set()
        time.sleep(0.3)  # long enough for every other caller to arrive while it builds
        return [n]

    with ThreadPoolExecutor(8) as sessions:
        first = sessions.submit(cached_value, slow, 7)
        started.wait(5)
        others = [sessions.submit(cached_value, slow, 7) for _ in range(7)]
        values = [first.result(5)] + [f.result(5) for f in others]
    assert calls == [7] and all(v is values[0] for v in values) and values[0] == [7]
    assert charts._BUILDING == {}

    attempts = []

    def flaky(n):
        attempts.append(n)
        started.set()
        time.sleep(0.2)
        if len(attempts) == 1:
            raise ValueError("the first build fails")
        return n * 2

    started.clear()
    with ThreadPoolExecutor(2) as sessions:
        failing = sessions.submit(cached_value, flaky, 3)
        started.wait(5)
        waiting = sessions.submit(cached_value, flaky, 3)
        assert waiting.result(5) == 6  # it waited, saw no value, built for itself
        assert isinstance(failing.exception(5), ValueError)
    assert attempts == [3, 3] and charts._BUILDING == {}


def _table_script():
    import pandas as pd
    import streamlit as st

    from ui.charts import cached_dataframe

    rows = [{"backend": "torch", "ms": 1.25, "n": 3}, {"backend": "gather", "ms": None, "n": 4}]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    cached_dataframe(st, rows, width="stretch")


def test_a_cached_table_shows_what_st_dataframe_of_the_rows_shows():
    at = AppTest.from_function(_table_script, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    public, cached = at.dataframe
    assert public.value.equals(cached.value.reset_index(drop=True)), (public.value, cached.value)
    assert list(cached.value.columns) == ["backend", "ms", "n"]


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(charts, "_send", lambda dg, chart: None)
    monkeypatch.setattr(charts, "_CACHE", type(charts._CACHE)())
    monkeypatch.setattr(charts, "MAX_ENTRIES", 3)
    for points in range(2, 8):
        cached_chart(None, _line, points)
    assert len(charts._CACHE) == 3


def test_a_long_line_keeps_its_spike_dip_ends_and_hover_text_aligned():
    y = np.sin(np.linspace(0, 20, 50_000))
    y[12_345], y[40_000] = 50.0, -50.0
    text = [f"point {i}" for i in range(len(y))]
    figure = fit_to_screen(go.Figure(go.Scatter(x=np.arange(len(y)), y=y, text=text)), max_points=1000)
    trace = figure.data[0]
    assert 500 <= len(trace.y) <= 1002
    assert trace.y.max() == 50.0 and trace.y.min() == -50.0
    assert trace.x[0] == 0 and trace.x[-1] == len(y) - 1
    assert all(t == f"point {x}" for x, t in zip(trace.x, trace.text, strict=True))
    assert np.array_equal(trace.y, y[trace.x])


def test_stacked_traces_stay_aligned_and_subplots_get_their_share():
    x = np.arange(10_000)
    figure = make_subplots(rows=1, cols=4)
    for column in range(1, 5):
        for name in ("a", "b"):
            figure.add_trace(go.Scatter(x=x, y=x * 0 + 1, stackgroup=f"s{column}", name=name), 1, column)
    fit_to_screen(figure, max_points=1200)
    lengths = {len(trace.x) for trace in figure.data}
    assert len(lengths) == 1 and 200 <= lengths.pop() <= 320  # a quarter of the width each
    assert all(np.array_equal(figure.data[0].x, trace.x) for trace in figure.data)
    short = fit_to_screen(go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 2, 1])))
    assert list(short.data[0].y) == [3, 2, 1]


def test_a_wide_heatmap_keeps_every_kth_column():
    z = np.arange(20 * 5000).reshape(20, 5000)
    figure = fit_to_screen(go.Figure(go.Heatmap(z=z, x=np.arange(5000))), max_points=1000)
    kept = np.asarray(figure.data[0].x)
    assert len(kept) <= 1001 and kept[-1] == 4999
    assert np.array_equal(np.asarray(figure.data[0].z), z[:, kept])
