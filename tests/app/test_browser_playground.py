"""A real browser: Debian's Chromium, driven by Playwright, against `streamlit run app.py` on 127.0.0.1."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.browser


def free_blocks(page) -> int:
    value = (
        page.locator('[data-testid="stMetric"]').first.locator('[data-testid="stMetricValue"]').inner_text()
    )
    return int(value.split("/")[0].replace(",", ""))


def test_append_and_fork_in_a_real_browser(streamlit_server, page):
    page.goto(streamlit_server)
    expect(page.get_by_text("Block manager playground").first).to_be_visible()
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible()
    assert free_blocks(page) == 37

    page.get_by_label("Tokens to append").fill("40")  # s0 holds 73 tokens: 40 more = 113 = 8 blocks (+3)
    page.get_by_label("Tokens to append").press("Enter")
    page.get_by_role("button", name="Append").click()
    expect(page.locator('[data-testid="stMetricValue"]').first).to_have_text("34 / 48")

    page.get_by_role("button", name="Fork").click()  # sharing takes no block; a new sequence appears
    expect(page.get_by_text("Last action: fork s0 → s3: done")).to_be_visible()
    assert free_blocks(page) == 34
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
