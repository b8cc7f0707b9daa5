"""Nothing leaves the host: a real Chromium opens every page of a live server and records every request the pages
make; all of them go to 127.0.0.1 (no font host for the favicon or icons, no CDN, no telemetry)."""

import time
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
QUIET_MS = 500  # no request in flight and none started for this long: the page has fetched what it drew


def wait_until_quiet(page, pending: set, started: list[float], timeout_ms: float = 30_000) -> None:
    """Until no request of the page is in flight and none started for QUIET_MS (late fetches of what was just
    drawn: icons, fonts), polling every 50 ms; fails after `timeout_ms`."""
    deadline = time.monotonic() + timeout_ms / 1000
    while pending or time.monotonic() - started[0] < QUIET_MS / 1000:
        assert time.monotonic() < deadline, f"requests still in flight: {sorted(r.url for r in pending)}"
        page.wait_for_timeout(50)  # lets Playwright deliver the request events meanwhile


def test_every_request_stays_on_the_host(streamlit_server, page):
    requests: list[str] = []
    pending: set = set()  # requests started and neither finished nor failed yet
    started = [time.monotonic()]  # when the last request started

    def on_request(request) -> None:
        requests.append(request.url)
        pending.add(request)
        started[0] = time.monotonic()

    page.context.on("request", on_request)
    page.context.on("requestfinished", lambda request: pending.discard(request))
    page.context.on("requestfailed", lambda request: pending.discard(request))
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
        wait_until_quiet(page, pending, started)  # late fetches (icons, fonts) of what was just drawn
    assert any(url.startswith(streamlit_server) for url in requests)
    elsewhere = sorted({url for url in requests if urlsplit(url).hostname != "127.0.0.1"})
    assert not elsewhere, elsewhere
