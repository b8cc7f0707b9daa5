"""A real Chromium visits the Kernels page on a live server: the answer and its chart on the first screen, the
check passes, every chart draws, and the URL carries every input (a link reproduces the run)."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS, fill_form_number, wait_for_script_done

pytestmark = pytest.mark.browser
RUN_MS = 120_000  # a fresh server's first run imports torch and spawns a worker; the sweep times 4 contexts
CHARTS = '[data-testid="stPlotlyChart"]'


def test_kernels_page_in_a_browser(streamlit_server, page):
    page.set_viewport_size({"width": 1500, "height": 1000})
    page.goto(streamlit_server)
    # Wait for the app's own navigation before clicking in it.
    nav = page.locator('[data-testid="stSidebarNav"]')
    expect(nav).to_contain_text("Block manager playground", timeout=60_000)
    page.get_by_role("link", name="Kernels", exact=True).click()
    expect(page.get_by_text("Kernels: paged vs contiguous attention")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Paged / contiguous latency at 1,024 tokens")).to_be_visible(timeout=RUN_MS)
    charts = page.locator(CHARTS)
    expect(charts).to_have_count(4, timeout=RUN_MS)  # overhead, latency, bandwidth, block map
    wait_for_script_done(page, RUN_MS)
    expect(page.locator(f"{CHARTS} .main-svg").first).to_be_visible(timeout=RUN_MS)  # plotly has drawn
    # the answer comes first: the overhead chart starts within the first 1,000 px screen
    overhead = charts.first
    expect(overhead).to_contain_text("Paging overhead")
    box = overhead.bounding_box()
    assert box is not None and box["y"] < 1000, box
    expect(overhead).to_contain_text("median of 11 runs")
    expect(page.get_by_text("max abs error, torch")).to_be_visible()
    expect(page.get_by_text("Sequence 0: 1,024 tokens in 64 logical blocks")).to_be_visible()
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    expect(nav).to_contain_text("Block manager playground")  # still the app's navigation
    for key, value in (("batch", "4"), ("ctx", "1024"), ("heads", "32"), ("dtype", "float32")):
        assert f"{key}={value}" in page.url
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "kernels.png"), full_page=True)

    # change a setting through the form and run again: the URL follows
    fill_form_number(page, "batch (sequences)", "2")
    page.get_by_role("button", name="Run check and sweep").click()
    expect(page.get_by_text("2 sequences x 1,024 tokens")).to_be_visible(timeout=RUN_MS)
    page.wait_for_url("**batch=2**", timeout=RUN_MS)
    link = page.url
    wait_for_script_done(page, RUN_MS)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)

    # the link opens the same run in a fresh tab
    other = page.context.new_page()
    other.set_viewport_size({"width": 1500, "height": 1000})
    other.goto(link)
    expect(other.get_by_text("2 sequences x 1,024 tokens")).to_be_visible(timeout=RUN_MS)
    wait_for_script_done(other, RUN_MS)
    expect(other.get_by_label("batch (sequences)")).to_have_value("2")
    expect(other.locator(CHARTS)).to_have_count(4, timeout=RUN_MS)
    expect(other.locator('[data-testid="stException"]')).to_have_count(0)
