"""The Simulator page under AppTest: the default comparison, a custom run, errors shown as st.error, the heatmap
slider and the measured-attention option."""

import json

from tests.conftest import open_app

PAGE = "app_pages/simulator.py"


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_default_page_compares_all_policies():
    at = open_app(PAGE)
    assert not at.error
    assert len(at.get("plotly_chart")) >= 5
    paged = float(_metric(at, "Paged (vLLM): token states").rstrip("%"))
    orca_max = float(_metric(at, "Orca (Max): token states").rstrip("%"))
    assert paged > 85 and 15 < orca_max < 30
    assert [b.proto.label for b in at.get("download_button")] == ["Per-step table (CSV)", "Summary (JSON)"]


def _small_run(at, **numbers):
    at.number_input(key="num_requests").set_value(numbers.get("num_requests", 120))
    at.number_input(key="rate").set_value(numbers.get("rate", 6.0))
    at.number_input(key="n").set_value(numbers.get("n", 2))
    at.number_input(key="prefix_len").set_value(numbers.get("prefix_len", 64))
    at.slider(key="prefix_fraction").set_value(0.5)
    at.checkbox(key="prefix_caching").set_value(True)
    at.multiselect(key="policies").set_value(["paged", "orca-oracle"])
    for key, value in numbers.items():
        if key.startswith("_"):
            at.number_input(key=key[1:]).set_value(value)


def _submit(at):
    next(b for b in at.button if b.proto.label == "Run simulation").click()
    at.run()
    assert not at.exception, at.exception


def test_custom_run_with_sharing_heatmap_slider_and_measured_attention():
    at = open_app(PAGE)
    _small_run(at)
    at.checkbox(key="measure").set_value(True)
    at.number_input(key="budget_s").set_value(0.5)
    _submit(at)
    assert not at.error
    labels = [m.label for m in at.metric]
    assert "Paged (vLLM): token states" in labels and "Orca (Oracle): token states" in labels
    assert "Orca (Max): token states" not in labels
    charts_with_attention = len(at.get("plotly_chart"))
    assert charts_with_attention >= 6
    slider = at.select_slider(key="heatmap_step")
    steps = slider.options
    slider.set_value(steps[1])
    at.run()
    assert not at.exception and not at.error


def test_bad_settings_show_an_error_not_a_traceback():
    at = open_app(PAGE)
    at.radio(key="capacity").set_value("raw")
    at.number_input(key="raw_capacity").set_value(256)
    _submit(at)
    assert at.error and "Cannot simulate" in at.error[0].value
    at = open_app(PAGE)
    at.multiselect(key="policies").set_value([])
    _submit(at)
    assert at.error and "at least one policy" in at.error[0].value


def test_hybrid_kv_cache_manager_for_a_sliding_window_model():
    at = open_app(PAGE)
    at.selectbox(key="model").set_value("gpt-oss-20b")
    at.number_input(key="num_requests").set_value(30)
    at.checkbox(key="hybrid").check()
    at.button[0].click().run(timeout=300)
    assert not at.exception
    assert not at.error
    captions = " ".join(c.value for c in at.caption)
    assert (
        "1 sliding-window group (window 128 tokens) of 12 layers; 1 full-attention group of 12 layers"
        in captions
    )
    charts = at.get("plotly_chart")
    assert len(charts) == 5  # summary, breakdown, free memory, running/waiting, and the hybrid heatmap
    heatmap = json.loads(charts[4].proto.spec)
    assert heatmap["layout"]["title"]["text"].startswith("Hybrid KV cache after step")
    bands = [a["text"] for a in heatmap["layout"]["annotations"]]
    assert bands[0].startswith("sliding window 128 tokens (12 layers)") and bands[1].startswith(
        "full attention"
    )
    assert bands[2].startswith("free, shared by every group")


def test_hybrid_kv_cache_manager_pads_gemma_3s_unequal_groups():
    """Gemma-3-27B's groups differ in size (10 full layers; 52 sliding in groups of 9, 9, 9, 9, 8, 8): they are
    padded to 10 layers per block as vLLM does, so the run simulates and shows the six window groups in one band."""
    at = open_app(PAGE)
    at.selectbox(key="model").set_value("gemma-3-27b")
    at.number_input(key="num_requests").set_value(30)
    at.checkbox(key="hybrid").check()
    at.button[0].click().run(timeout=300)
    assert not at.exception
    assert not at.error
    heatmap = json.loads(at.get("plotly_chart")[4].proto.spec)
    bands = [a["text"] for a in heatmap["layout"]["annotations"]]
    assert bands[0].startswith("sliding window 1,024 tokens (6 groups of 9, 9, 9, 9, 8, 8 layers)")
    assert bands[1].startswith("full attention (10 layers)")
    assert "(10 layers per block)" in heatmap["layout"]["title"]["text"]
    captions = " ".join(c.value for c in at.caption)
    assert (
        "6 sliding-window groups (window 1,024 tokens) of 9, 9, 9, 9, 8, 8 layers; 1 full-attention group"
        in captions
    )
