"""A real Chromium runs the Simulator page: the default comparison draws, then a small custom run replaces it."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS

expect.set_options(timeout=60_000)


@pytest.mark.browser
def test_simulator_page_runs_a_small_simulation(streamlit_server, page):
    page.goto(streamlit_server)
    page.locator('[data-testid="stSidebarNav"] a', has_text="Serving simulator").click()
    expect(page.get_by_text("Paged (vLLM): token states")).to_be_visible()
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "simulator_default.png"), full_page=True)

    page.get_by_text("Workload, model, policies and scheduler settings").click()
    requests = page.get_by_label("Requests", exact=True)
    requests.fill("150")
    rate = page.get_by_label("Arrival rate (requests/s, Poisson)")
    rate.fill("8")
    page.get_by_role("button", name="Run simulation").click()
    expect(page.get_by_text("150 requests, KV capacity 15,728 token slots")).to_be_visible()
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').nth(4)).to_be_visible()
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
    page.screenshot(path=str(ARTIFACTS / "simulator_small_run.png"), full_page=True)
