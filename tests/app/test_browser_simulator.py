"""A real Chromium runs the Simulator page: the default comparison draws, then a small custom run replaces it."""

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS, fill_form_number, wait_for_script_done

expect.set_options(timeout=60_000)


@pytest.mark.browser
def test_simulator_page_runs_a_small_simulation(streamlit_server, page):
    page.goto(streamlit_server)
    page.locator('[data-testid="stSidebarNav"] a', has_text="Serving simulator").click()
    expect(page.get_by_text("Paged (vLLM): token states")).to_be_visible()
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible()
    wait_for_script_done(page, 60_000)
    page.screenshot(path=str(ARTIFACTS / "simulator_default.png"), full_page=True)

    page.get_by_text("Workload, model, policies and scheduler settings").click()
    fill_form_number(page, "Requests", "150")
    fill_form_number(page, "Arrival rate (requests/s, Poisson)", "8", shown="8.00")
    page.get_by_role("button", name="Run simulation").click()
    expect(page).to_have_url(re.compile(r"num_requests=150\b"))
    expect(page.get_by_text("150 requests, KV capacity 15,728 token slots")).to_be_visible()
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').nth(4)).to_be_visible()
    wait_for_script_done(page, 60_000)
    expect(page.locator('[data-testid="stPlotlyChart"]')).to_have_count(5)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
    page.screenshot(path=str(ARTIFACTS / "simulator_small_run.png"), full_page=True)


@pytest.mark.browser
def test_a_shared_simulator_link_opens_on_its_run_with_the_chart_first(streamlit_server, page):
    """A hybrid gpt-oss-20b run sent as a link: at 1500 x 1000 the verdict and the main chart are on the first
    screen, the settings hold the link's values, and the page keeps the link."""
    page.set_viewport_size({"width": 1500, "height": 1000})
    query = "model=gpt-oss-20b&hybrid=1&num_requests=60&rate=4&seed=3&policies=paged,orca-oracle"
    page.goto(f"{streamlit_server}/simulator?{query}")
    expect(page.get_by_text("Paged (vLLM): token states")).to_be_visible()
    expect(page.get_by_text("60 requests, KV capacity 15,728 token slots")).to_be_visible()
    chart = page.locator('[data-testid="stPlotlyChart"]').first
    expect(chart.locator(".main-svg").first).to_be_visible()
    wait_for_script_done(page, 60_000)
    box = chart.bounding_box()
    assert box is not None and box["y"] < 1000, box
    page.screenshot(path=str(ARTIFACTS / "simulator_first_screen.png"))
    for key in ("model=gpt-oss-20b", "hybrid=1", "num_requests=60", "policies=paged%2Corca-oracle"):
        assert key in page.url, page.url
    page.get_by_text("Workload, model, policies and scheduler settings").click()
    expect(page.get_by_label("Requests", exact=True)).to_have_value("60")
    assert page.locator('[data-testid="stException"]').count() == 0
