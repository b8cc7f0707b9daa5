"""One real Chromium watching end to end while the protocol sessions load the server: it opens the Planner by
its URL and waits until every chart the page draws at its defaults is drawn (plotly's `.main-svg`)."""

import time

from tests.conftest import CHROMIUM, CHROMIUM_ARGS

DRAWN_CHARTS = (
    "Array.from(document.querySelectorAll('[data-testid=\"stPlotlyChart\"]'))"
    ".filter(chart => chart.querySelector('.main-svg')).length"
)


def watch_planner(base_url: str, charts: int, timeout_s: float) -> dict:
    """Seconds from navigation start to the Planner's title and to `charts` drawn charts; an "error" on failure."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            started = time.perf_counter()
            try:
                tab.goto(f"{base_url}/planner", timeout=timeout_s * 1000)
                tab.get_by_role("heading", name="Capacity planner", exact=True).wait_for(
                    timeout=timeout_s * 1000
                )
                title_s = time.perf_counter() - started
                tab.wait_for_function(f"{DRAWN_CHARTS} >= {charts}", timeout=timeout_s * 1000)
            except Exception as error:
                return {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            return {"title_s": round(title_s, 2), "charts_s": round(time.perf_counter() - started, 2)}
        finally:
            browser.close()
