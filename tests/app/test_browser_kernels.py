"""A real Chromium visits the Kernels page on a live server: the check passes and every chart draws."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS


@pytest.mark.browser
def test_kernels_page_in_a_browser(streamlit_server, page):
    page.goto(streamlit_server)
    # Wait for the app's own navigation before clicking in it.
    nav = page.locator('[data-testid="stSidebarNav"]')
    expect(nav).to_contain_text("Block manager playground", timeout=60_000)
    page.get_by_role("link", name="Kernels", exact=True).click()
    expect(page.get_by_text("Kernels: paged vs contiguous attention")).to_be_visible(timeout=60_000)
    assert page.url.endswith("/kernels")
    expect(page.get_by_text("max abs error, torch")).to_be_visible(timeout=60_000)
    charts = page.locator('[data-testid="stPlotlyChart"] .main-svg')
    expect(charts.first).to_be_visible(timeout=60_000)
    expect(page.get_by_text("At 1,024 tokens: contiguous")).to_be_visible(timeout=60_000)
    page.wait_for_function(
        "document.querySelectorAll('[data-testid=\"stPlotlyChart\"]').length >= 4", timeout=60_000
    )
    expect(page.get_by_text("Sequence 0: 1,024 tokens in 64 logical blocks")).to_be_visible(timeout=60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    expect(nav).to_contain_text("Block manager playground")  # still the app's navigation
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "kernels.png"), full_page=True)

    # change a setting through the form and run again
    page.get_by_label("batch (sequences)").fill("2")
    page.get_by_role("button", name="Run check and sweep").click()
    expect(page.get_by_text("2 sequences x 1,024 tokens")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("max abs error, torch")).to_be_visible(timeout=60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
