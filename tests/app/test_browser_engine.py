"""A real Chromium runs the Engine page: the default tiny-model generation draws, then a beam-search run replaces it."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS, wait_for_script_done

expect.set_options(timeout=120_000)  # the first run also builds the C kernel


@pytest.mark.browser
def test_engine_page_runs_a_tiny_generation(streamlit_server, page):
    page.goto(streamlit_server)
    page.locator('[data-testid="stSidebarNav"] a', has_text="Engine").click()
    tokens = page.locator('[data-testid="stMetric"]').filter(has_text="Tokens generated")
    expect(tokens).to_contain_text("144")  # 3 prompts x n = 2 samples x 24 tokens
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "engine_default.png"), full_page=True)

    page.get_by_label("Parallel samples (n)").fill("1")
    page.get_by_label("Beam width (> 1: beam search, n must be 1)").fill("2")
    page.get_by_label("New tokens per output (max_tokens)").fill("6")
    page.get_by_role("button", name="Generate").click()
    # 3 prompts x 2 beams x 6 tokens
    expect(tokens).to_contain_text("36")
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').nth(3)).to_be_visible()
    wait_for_script_done(page, 120_000)  # an error drawn later in this run would be missed by an early count
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    expect(page.locator('[data-testid="stAlertContentError"]')).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "engine_beam_search.png"), full_page=True)
