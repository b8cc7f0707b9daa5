"""Nothing leaves the host: a real Chromium opens every page of a live server and records every request the pages
make; all of them go to 127.0.0.1 (no font host for the favicon or icons, no CDN, no telemetry)."""

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.conftest import wait_for_script_done

pytestmark = pytest.mark.browser
PAGES = {  # sidebar link -> a heading that shows the page ran
    "Kernels": "Kernels: paged vs contiguous attention",
    "Serving simulator": None,
    "Capacity planner": None,
    "SLO planner": None,
    "Engine": None,
    "About this server": "About this server",
}
RUN_MS = 180_000


def test_every_request_stays_on_the_host(streamlit_server, page):
    requests: list[str] = []
    page.context.on("request", lambda request: requests.append(request.url))
    page.goto(streamlit_server)
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible(timeout=RUN_MS)
    wait_for_script_done(page, RUN_MS)
    icon = page.locator('link[rel~="icon"]')
    expect(icon).to_have_count(1)
    assert urlsplit(icon.get_attribute("href") or "").hostname in (None, "127.0.0.1")  # served by us
    for link, heading in PAGES.items():
        page.get_by_role("link", name=link, exact=True).click()
        if heading:
            expect(page.get_by_role("heading", name=heading)).to_be_visible(timeout=RUN_MS)
        expect(page.get_by_role("main").get_by_role("heading", level=1).first).to_be_visible(timeout=RUN_MS)
        wait_for_script_done(page, RUN_MS)
        page.wait_for_timeout(1_000)  # late fetches (icons, fonts) of what was just drawn
    assert any(url.startswith(streamlit_server) for url in requests)
    elsewhere = sorted({url for url in requests if urlsplit(url).hostname != "127.0.0.1"})
    assert not elsewhere, elsewhere
