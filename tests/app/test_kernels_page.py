"""The Kernels page under AppTest: defaults draw everything, bad input gets st.error (never a traceback), and
every input lives in the URL: a link reproduces the run."""

from streamlit.proto.Metric_pb2 import Metric
from streamlit.testing.v1 import AppTest

from core.device import default_device
from core.kernels.attention import available_backends
from tests.conftest import open_app, open_page_with

PAGE = "app_pages/kernels.py"
BACKENDS = available_backends(default_device())


def _submit(at):
    [submit] = [b for b in at.button if b.label == "Run check and sweep"]
    submit.click()
    at.run()
    assert not at.exception, at.exception
    return at


def open_with_url(**params) -> AppTest:
    """app.py under AppTest on the Kernels page with this query string, as a shared link opens it."""
    return open_page_with(PAGE, params)


def _text(at) -> str:
    return " ".join(m.value for m in at.markdown)


def test_defaults_check_correctness_and_draw_every_chart():
    at = open_app(PAGE)
    assert at.title[0].value.startswith("Kernels")
    assert not at.error
    metrics = {m.label: m for m in at.metric}
    expected = {f"max abs error, {backend}" for backend in BACKENDS}
    assert {"max abs error, torch", "max abs error, gather"} <= set(metrics) == expected
    for metric in metrics.values():
        assert float(metric.value) <= 1e-4 and metric.delta == "pass"
        assert metric.proto.direction == Metric.MetricDirection.NONE  # a verdict: no arrow
    assert len(at.get("plotly_chart")) == 4  # overhead, latency, bandwidth, block map
    text = _text(at)
    assert "4 sequences x 1,024 tokens" in text and "At 1,024 tokens: contiguous" in text
    assert "Paged / contiguous latency at 1,024 tokens" in text and "middle half" in text
    assert "every backend matches contiguous attention" in text
    assert dict(at.query_params) == {
        "heads": "32",
        "kv_heads": "8",
        "head_dim": "128",
        "block": "16",
        "batch": "4",
        "ctx": "1024",
        "dtype": "float32",
        "window": "0",
        "backends": ",".join(BACKENDS),
    }
    assert "Measured at" in " ".join(c.value for c in at.caption)


def test_invalid_head_counts_are_refused_with_a_message():
    at = open_app(PAGE)
    at.selectbox(key="heads").set_value(40)
    at.selectbox(key="kv_heads").set_value(16)  # 40 is not a multiple of 16
    _submit(at)
    assert at.error and "multiple" in at.error[0].value
    assert not at.get("plotly_chart")
    assert at.query_params["heads"] == "40"  # the link keeps what was asked, so it can be shown to someone


def test_too_big_a_configuration_is_refused_before_allocating():
    at = open_app(PAGE)
    at.number_input(key="batch").set_value(4096)
    at.number_input(key="ctx").set_value(1_048_576)
    _submit(at)
    assert at.error and "budget" in at.error[0].value
    assert not at.metric


def test_no_backend_selected_is_an_error():
    at = open_app(PAGE)
    at.multiselect[0].set_value([])
    _submit(at)
    assert at.error and "backend" in at.error[0].value


def test_sliding_window_runs_the_check_and_sweep_with_a_window():
    at = open_app(PAGE)
    at.number_input(key="batch").set_value(2)
    at.number_input(key="ctx").set_value(512)
    at.number_input(key="window").set_value(100)
    _submit(at)
    assert not at.error
    for metric in at.metric:
        assert float(metric.value) <= 1e-4 and metric.delta == "pass"
    text = _text(at)
    # 2 sequences x 100 visible tokens x 8 KV heads x 128 dims x 4 bytes x (K and V) = 1,638,400 bytes
    assert "1,638,400 bytes" in text and "last 100 tokens" in text
    assert len(at.get("plotly_chart")) == 4
    assert at.query_params["window"] == "100"


def test_a_url_round_trip_reproduces_the_run():
    at = open_app(PAGE)
    at.selectbox(key="head_dim").set_value(80)
    at.selectbox(key="block").set_value(8)
    at.selectbox(key="dtype").set_value("bfloat16")
    at.number_input(key="batch").set_value(2)
    at.number_input(key="ctx").set_value(300)
    at.multiselect[0].set_value(["torch"])
    _submit(at)
    assert not at.error
    assert [m.label for m in at.metric] == ["max abs error, torch"] and at.metric[0].delta == "pass"
    link = dict(at.query_params)
    assert link["head_dim"] == "80" and link["block"] == "8" and link["backends"] == "torch"
    assert link["dtype"] == "bfloat16" and (link["batch"], link["ctx"]) == ("2", "300")

    again = open_with_url(**link)  # a colleague opens the link in a fresh session
    assert not again.error
    assert dict(again.query_params) == link
    assert again.selectbox(key="head_dim").value == 80 and again.number_input(key="ctx").value == 300
    assert [(m.label, m.value) for m in again.metric] == [(m.label, m.value) for m in at.metric]
    assert "2 sequences x 300 tokens" in _text(again) and "80 dims, bfloat16" in _text(again)
    assert len(again.get("plotly_chart")) == 4


def test_bad_url_values_are_reported_and_replaced_by_defaults():
    at = open_with_url(batch="lots", heads="33", ctx="2048", backends="torch,warp9")
    messages = " ".join(e.value for e in at.error)
    assert "`batch`" in messages and "expected a whole number" in messages
    assert "`heads`" in messages and "unknown value" in messages
    assert "'warp9' not available on this machine" in messages
    assert at.number_input(key="batch").value == 4 and at.number_input(key="ctx").value == 2048
    assert at.multiselect[0].value == ["torch"]
    assert at.query_params["batch"] == "4" and at.query_params["backends"] == "torch"  # rewritten valid
    assert "4 sequences x 2,048 tokens" in _text(at)


def test_measure_again_replaces_the_shared_result_with_a_fresh_sweep():
    at = open_with_url(batch="1", ctx="64", backends="torch")  # small: the sweep takes a moment
    before = at.dataframe[0].value  # the result rows
    [again] = [b for b in at.button if b.label == "Measure again"]
    again.click()
    at.run()
    assert not at.exception, at.exception
    after = at.dataframe[0].value
    assert list(after["context_len"]) == list(before["context_len"])  # the same sweep...
    # ...measured anew: six medians to 4 significant digits do not all repeat by chance
    assert list(after["paged_ms"]) + list(after["contiguous_ms"]) != list(before["paged_ms"]) + list(
        before["contiguous_ms"]
    )
    assert at.query_params["batch"] == "1" and at.query_params["backends"] == "torch"  # inputs unchanged
