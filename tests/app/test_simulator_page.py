"""The Simulator page under AppTest: the default comparison, a custom run, errors shown as st.error, the heatmap
slider and the measured-attention option."""

import gzip
import json

from tests.conftest import open_app, page_order

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
    title = heatmap["layout"]["title"]["text"]
    assert title.startswith("Hybrid KV cache after step") and "one pool for every group" in title
    assert "sliding window 128 tokens" in title and "full attention" in title


def test_hybrid_kv_cache_manager_pads_gemma_3s_unequal_groups():
    """Gemma-3-27B's groups differ in size (10 full layers; 52 sliding in groups of 9, 9, 9, 9, 8, 8): they are
    padded to 10 layers per block as vLLM does, so the run simulates, every group drawing from the one pool of
    6,094 blocks."""
    at = open_app(PAGE)
    at.selectbox(key="model").set_value("gemma-3-27b")
    at.number_input(key="num_requests").set_value(30)
    at.checkbox(key="hybrid").check()
    at.button[0].click().run(timeout=300)
    assert not at.exception
    assert not at.error
    heatmap = json.loads(at.get("plotly_chart")[4].proto.spec)
    title = heatmap["layout"]["title"]["text"]
    assert "sliding window 1,024 tokens" in title and "full attention" in title
    assert "of 6,094 blocks used" in title  # 15,728 slots x 62 layers // 10 per block // 16
    assert "; 10 layers per block; a cell = 4 blocks)" in title  # 6,094 > 1,536 cells
    captions = " ".join(c.value for c in at.caption)
    assert (
        "6 sliding-window groups (window 1,024 tokens) of 9, 9, 9, 9, 8, 8 layers; 1 full-attention group"
        in captions
    )


def _upload_trace(at, name: str, data: bytes):
    at.selectbox(key="dataset").set_value("trace")
    at.file_uploader[0].set_value((name, data, "text/csv"))
    _submit(at)


def test_hostile_trace_uploads_show_the_reason_and_use_nothing_of_the_file():
    """Each bad trace stops the page with st.error: no metric, chart or download from any part of the file."""
    header = b"arrival_time,prompt_len,output_len\n"
    bad = {
        "bomb.csv": (
            gzip.compress(b"\0" * 2**20, 9) * 64,
            "gzip compressed archive: upload the uncompressed",
        ),
        "empty.csv": (b"", "is empty"),
        "binary.csv": (b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
        "columns.csv": (b"time,input,output\n0,5,5\n", "lacks column(s) ['arrival_time'"),
        "negative.csv": (header + b"0,5,5\n1,-5,5\n", "row 3, column 'prompt_len'"),
        # OPT-13B: the smaller of 2,048 (simulator) and 2,048 (model); rows 2-3 are fine, row 4 is one over
        "long.csv": (
            header + b"0,5,5\n0,2000,48\n1,2000,49\n",
            "trace row 4: prompt_len 2,000 + output_len 49",
        ),
        "million.csv": (
            header + b"0,5,5\n" * 1_000_000,
            "more than 10,000 requests (reading stopped at row 10,002)",
        ),
    }
    at = open_app(PAGE)
    for name, (data, reason) in bad.items():
        _upload_trace(at, name, data)
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and errors[0].startswith("Cannot simulate: ") and reason in errors[0], (
            name,
            errors,
        )
        assert not at.metric and not at.get("plotly_chart") and not at.get("download_button"), name
    _upload_trace(at, "good.csv", header + b"0,5,5\n0,2000,48\n")
    assert not at.error
    assert any(c.value.startswith("2 requests, KV capacity 15,728 token slots") for c in at.caption)


def test_trace_over_the_upload_limit_is_refused_before_it_is_read(monkeypatch):
    from ui.jobs import app_limits

    monkeypatch.setenv("PAGED_LAB_MAX_UPLOAD_BYTES", "100")
    app_limits.clear()
    try:
        at = open_app(PAGE)
        _upload_trace(at, "big.csv", b"arrival_time,prompt_len,output_len\n" + b"0,5,5\n" * 20)
        assert [e.value for e in at.error] == [
            "Cannot simulate: the trace is 155 bytes, over this server's limit of 100 bytes "
            "(PAGED_LAB_MAX_UPLOAD_BYTES); upload a smaller file"
        ]
    finally:
        monkeypatch.delenv("PAGED_LAB_MAX_UPLOAD_BYTES")
        app_limits.clear()


def _open_with(params: dict[str, str]):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def _query(at) -> dict[str, str]:
    return {k: (v[-1] if isinstance(v, list) else v) for k, v in at.query_params.items()}


def test_a_hybrid_run_sent_as_a_link_reproduces_the_run():
    """A hybrid gpt-oss-20b simulation set on the page writes every input to the URL; a fresh session opened on
    that URL shows the same inputs and the same numbers, which are those of `compare_policies` on the
    `SimulatorParams` the link describes."""
    from core.page_models.simulator import SimulatorParams, model_kv_groups
    from core.page_models.tasks import compare_policies

    at = open_app(PAGE)
    at.selectbox(key="model").set_value("gpt-oss-20b")
    at.number_input(key="num_requests").set_value(40)
    at.number_input(key="rate").set_value(4.0)
    at.number_input(key="seed").set_value(7)
    at.multiselect(key="policies").set_value(["paged", "orca-oracle"])
    at.checkbox(key="hybrid").check()
    _submit(at)
    link = _query(at)
    assert {k: link[k] for k in ("model", "num_requests", "rate", "seed", "hybrid", "policies")} == {
        "model": "gpt-oss-20b",
        "num_requests": "40",
        "rate": "4",
        "seed": "7",
        "hybrid": "1",
        "policies": "paged,orca-oracle",
    }
    steps = at.select_slider(key="heatmap_step").options
    at.select_slider(key="heatmap_step").set_value(steps[1]).run()
    link = _query(at)
    assert link["heatmap_step"] == str(steps[1])
    shown = [(m.label, m.value) for m in at.metric]

    again = _open_with(link)
    assert str(again.select_slider(key="heatmap_step").value) == steps[1]  # AppTest lists options as text
    assert not again.error
    assert again.selectbox(key="model").value == "gpt-oss-20b" and again.checkbox(key="hybrid").value
    assert list(again.multiselect(key="policies").value) == ["paged", "orca-oracle"]
    assert [(m.label, m.value) for m in again.metric] == shown
    assert _query(again) == link
    params = SimulatorParams(
        num_requests=40,
        rate=4.0,
        seed=7,
        model="gpt-oss-20b",
        policies=("paged", "orca-oracle"),
        kv_groups=model_kv_groups("gpt-oss-20b"),
    )
    _, summaries = compare_policies(params)
    assert ("Paged (vLLM): token states", f"{summaries['paged']['token_states_pct']:.1f}%") in shown
    assert ("Batched requests (avg)", f"{summaries['orca-oracle']['avg_batched_requests']:,.2f}") in shown


def test_bad_link_values_are_reported_and_replaced():
    at = _open_with({"model": "gpt-9", "policies": "paged,lru", "rate": "-1", "num_requests": "30"})
    errors = " ".join(e.value for e in at.error)
    for text in (
        "`model`",
        "'gpt-9' ignored",
        "`policies`",
        "distinct values among",
        "`rate`",
        "at least 0.01",
    ):
        assert text in errors
    assert at.number_input(key="num_requests").value == 30 and at.metric
    assert _query(at)["model"] == "opt-13b"
    kinds = [node.type for node in page_order(at.main)]  # the reasons above the answer run with the defaults
    assert kinds.index("error") < kinds.index("metric")


def test_capacity_from_a_gpu_sizes_the_load_to_its_memory():
    """Llama-3.1-8B on an L4 at the simulator's 2,048-token limit: the default load becomes a burst whose busiest
    step would hold 1.2x the pool, and the page says so; paging batches several times Oracle's requests and
    preempts, since memory binds. Unticked, the set load (1,000 requests at 2 req/s) runs."""
    from core.page_models.simulator import SimulatorParams, saturating_load

    at = _open_with(
        {"model": "llama-3.1-8b", "gpu": "l4", "capacity": "model", "policies": "paged,orca-oracle"}
    )
    load = saturating_load(SimulatorParams(model="llama-3.1-8b", gpu="l4", capacity_source="model"))
    assert load.saturates and load.peak_tokens <= 1.21 * load.capacity_tokens
    info = " ".join(i.value for i in at.info)
    assert f"{load.num_requests:,} requests at t = 0" in info and f"{load.capacity_tokens:,}" in info
    assert any(
        f"{load.num_requests:,} requests, KV capacity {load.capacity_tokens:,}" in c.value for c in at.caption
    )
    batched = [float(m.value.replace(",", "")) for m in at.metric if m.label == "Batched requests (avg)"]
    preemptions = [int(m.value.replace(",", "")) for m in at.metric if m.label == "Preemptions"]
    assert batched[0] > 3 * batched[1] and preemptions[0] > 0
    at.checkbox(key="saturate").uncheck()
    _submit(at)
    assert not at.info and any(c.value.startswith("1,000 requests, KV capacity") for c in at.caption)


def test_a_pool_the_workload_cannot_fill_is_said_so():
    from core.page_models.simulator import SimulatorParams, peak_tokens_per_request, saturating_load

    params = SimulatorParams(model="gpt-oss-20b", gpu="h100-80gb", capacity_source="model")
    load = saturating_load(params)
    assert not load.saturates and load.max_num_seqs == 1024 == load.num_requests
    burst = SimulatorParams(model="gpt-oss-20b", rate=float("inf")).requests()  # 1,000 ShareGPT-like, t = 0
    per_request = peak_tokens_per_request(burst)
    assert load.peak_tokens == round(1024 * per_request)
    assert load.peak_tokens < load.capacity_tokens == params.kv_capacity_tokens()


def test_peak_tokens_per_request_by_hand():
    """Prompts of 10 tokens, outputs 4 and 2, together: 20 tokens at t = 0, 22 at t = 1, then the short one
    finishes and 10 + 2 = 12 remain: the busiest step holds 22, 11 per request; with n = 2 samples each holds
    10 + 2t: 20 + 4 = 24 at t = 1, 12 per request. A sliding window caps what its layers hold."""
    from core.page_models.simulator import peak_tokens_per_request
    from core.serving.paged_memory import PagedKVGroup
    from core.serving.workload import Request

    assert peak_tokens_per_request([Request(0, 0.0, 10, 4), Request(1, 0.0, 10, 2)]) == 11.0
    assert peak_tokens_per_request([Request(0, 0.0, 10, 4, n=2), Request(1, 0.0, 10, 2, n=2)]) == 12.0
    # half the layers in a window of 5 tokens: at t = 1 the full half holds 11 + 11, the window half 5 + 5, an
    # average of 16 (t = 0: 15; t = 2, one request left: (12 + 5) / 2): 8 per request
    windowed = (PagedKVGroup("full", 6), PagedKVGroup("sliding_window", 6, 5))
    assert peak_tokens_per_request([Request(0, 0.0, 10, 4), Request(1, 0.0, 10, 2)], windowed) == 8.0
