"""The Kernels page under AppTest: defaults draw everything, bad input gets st.error, never a traceback."""

from core.device import default_device
from core.kernels.attention import available_backends
from tests.conftest import open_app

PAGE = "app_pages/kernels.py"


def _submit(at):
    at.button[0].click()  # the form's submit button
    at.run()
    assert not at.exception, at.exception
    return at


def test_defaults_check_correctness_and_draw_every_chart():
    at = open_app(PAGE)
    assert at.title[0].value.startswith("Kernels")
    assert not at.error
    metrics = {m.label: m for m in at.metric}
    expected = {f"max abs error, {backend}" for backend in available_backends(default_device())}
    assert {"max abs error, torch", "max abs error, gather"} <= set(metrics) == expected
    for metric in metrics.values():
        assert float(metric.value) <= 1e-4 and metric.delta == "pass"
    assert len(at.get("plotly_chart")) == 4  # latency, overhead, bandwidth, block map
    text = " ".join(m.value for m in at.markdown)
    assert "4 sequences x 1,024 tokens" in text and "At 1,024 tokens: contiguous" in text


def test_invalid_head_counts_are_refused_with_a_message():
    at = open_app(PAGE)
    at.selectbox[0].set_value(40)  # query heads
    at.selectbox[1].set_value(16)  # KV heads: 40 is not a multiple of 16
    _submit(at)
    assert at.error and "multiple" in at.error[0].value
    assert not at.get("plotly_chart")


def test_too_big_a_configuration_is_refused_before_allocating():
    at = open_app(PAGE)
    at.number_input[0].set_value(4096)  # batch
    at.number_input[1].set_value(1_048_576)  # context
    _submit(at)
    assert at.error and "budget" in at.error[0].value
    assert not at.metric


def test_other_settings_rerun_the_check():
    at = open_app(PAGE)
    at.selectbox[2].set_value(80)  # head_dim
    at.selectbox[3].set_value(8)  # block size
    at.selectbox[4].set_value("bfloat16")
    at.number_input[0].set_value(2)
    at.number_input[1].set_value(300)
    at.multiselect[0].set_value(["torch"])
    _submit(at)
    assert not at.error
    assert [m.label for m in at.metric] == ["max abs error, torch"]
    assert at.metric[0].delta == "pass"
    assert len(at.get("plotly_chart")) == 4


def test_no_backend_selected_is_an_error():
    at = open_app(PAGE)
    at.multiselect[0].set_value([])
    _submit(at)
    assert at.error and "backend" in at.error[0].value


def test_sliding_window_runs_the_check_and_sweep_with_a_window():
    at = open_app(PAGE)
    at.number_input[0].set_value(2)  # batch
    at.number_input[1].set_value(512)  # context
    at.number_input[2].set_value(100)  # sliding window
    _submit(at)
    assert not at.error
    for metric in at.metric:
        assert float(metric.value) <= 1e-4 and metric.delta == "pass"
    text = " ".join(m.value for m in at.markdown)
    # 2 sequences x 100 visible tokens x 8 KV heads x 128 dims x 4 bytes x (K and V) = 1,638,400 bytes
    assert "1,638,400 bytes" in text and "last 100 tokens" in text
    assert len(at.get("plotly_chart")) == 4
