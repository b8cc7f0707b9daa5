"""A shared Planner URL opened in a real Chromium shows the what-if it encodes."""

from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.plan import plan
from tests.conftest import wait_for_script_done

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WAIT_MS = 60_000  # a loaded 2-core machine renders the first run in well over expect's default 5 s


@pytest.mark.browser
def test_shared_url_reproduces_the_what_if(streamlit_server, page):
    params = {
        "a_model": "qwen2.5-72b",
        "a_gpu": "h200-141gb",
        "a_gpus": "2",
        "a_tp": "2",
        "a_kvdtype": "bf16",
        "a_ctx": "8192",
        "a_block": "32",
        "b_model": "llama-3.1-8b",
        "b_gpu": "l4",
        "b_gpus": "1",
        "b_tp": "1",
        "b_ctx": "8192",
        "b_kvdtype": "auto",
        "compare": "1",
        "wl": "alpaca",
        "wl_n": "500",
    }
    page.goto(f"{streamlit_server}/planner?{urlencode(params)}")
    expected_a = plan(
        MODELS["qwen2.5-72b"],
        GPUS["h200-141gb"],
        tensor_parallel=2,
        kv_dtype="bf16",
        max_model_len=8192,
        block_size=32,
    )
    expected_b = plan(MODELS["llama-3.1-8b"], GPUS["l4"], max_model_len=8192)
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text("Scenario A: Qwen2.5-72B on 2 × H200 SXM 141GB")).to_be_visible(timeout=WAIT_MS)
    expect(main.get_by_text("Scenario B: Llama-3.1-8B on 1 × L4")).to_be_visible(timeout=WAIT_MS)
    expect(main.get_by_text(expected_a.verdict)).to_be_visible(timeout=WAIT_MS)
    values = main.locator('[data-testid="stMetricValue"]')
    expect(values.get_by_text(f"{expected_a.kv_tokens:,}", exact=True)).to_be_visible(timeout=WAIT_MS)
    expect(values.get_by_text(f"{expected_b.kv_tokens:,}", exact=True)).to_be_visible(timeout=WAIT_MS)
    # The widgets show the URL's values, and the charts are drawn.
    expect(page.get_by_role("combobox", name="KV cache dtype").first).to_have_value("bf16", timeout=WAIT_MS)
    expect(page.get_by_role("combobox", name="Block size (tokens)").first).to_have_value(
        "32", timeout=WAIT_MS
    )
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible(timeout=WAIT_MS)
    expect(page.locator('[data-testid="stPlotlyChart"]')).to_have_count(4, timeout=WAIT_MS)
    # The URL keeps the what-if after the page has rewritten it with every field.
    for key in ("a_model=qwen2.5-72b", "a_block=32", "b_gpu=l4", "wl=alpaca"):
        assert key in page.url
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "planner_shared_url.png"), full_page=True)


@pytest.mark.browser
def test_bad_shared_url_shows_reasons(streamlit_server, page):
    page.goto(f"{streamlit_server}/planner?a_model=gpt-9&a_ctx=-5&compare=0")
    main = page.locator('[data-testid="stMain"]')
    alerts = main.locator('[data-testid="stAlert"]')
    expect(alerts.filter(has_text="a_model").filter(has_text="'gpt-9' ignored: unknown value")).to_be_visible(
        timeout=60_000
    )
    # the message of the input's one check, as `python -m core.planning --max-model-len -5` prints it
    ctx = alerts.filter(has_text="a_ctx").filter(has_text="--max-model-len (tokens) must be between 16 and")
    expect(ctx).to_be_visible(timeout=WAIT_MS)
    expect(main.get_by_text("Scenario A: Llama-3.1-70B on 4 × H100 SXM 80GB")).to_be_visible(timeout=WAIT_MS)
    assert page.locator('[data-testid="stException"]').count() == 0


@pytest.mark.browser
def test_the_answer_comes_first(streamlit_server, page):
    """At 1500 x 1000 the default page (two scenarios) shows both verdicts and the main chart (memory per GPU) on
    the first screen, above the inputs."""
    page.set_viewport_size({"width": 1500, "height": 1000})
    page.goto(f"{streamlit_server}/planner")
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text("Scenario A: Llama-3.1-70B on 4 × H100 SXM 80GB").first).to_be_visible(
        timeout=WAIT_MS
    )
    chart = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="memory per GPU (GiB")
    expect(chart.locator(".main-svg").first).to_be_visible(timeout=WAIT_MS)
    expect(main.get_by_text("Scenario B: Llama-3.1-70B on 2 × H200 SXM 141GB").first).to_be_visible()
    wait_for_script_done(page, WAIT_MS)
    expect(page.locator('[data-testid="stPlotlyChart"]')).to_have_count(4, timeout=WAIT_MS)
    box = chart.bounding_box()
    assert box is not None and box["y"] + box["height"] < 1000, box  # the whole chart on the first screen
    inputs = page.get_by_role("combobox", name="Model").first.bounding_box()
    assert inputs is not None and inputs["y"] > box["y"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "planner_first_screen.png"))
