"""One real Chromium watching end to end while the protocol sessions load the server: it opens the Planner by
its URL and waits until every chart the page draws at its defaults is drawn (plotly's `.main-svg`).

A person's browser runs on their own machine; here it shares the server's cores, where it takes about one core
for the seconds it loads Streamlit's and plotly's scripts and draws (docs/benchmarks.md, "Load test", has the figures).
So the browser runs at `WATCH_NICENESS`: it draws with the CPU the server leaves, rather than taking it from the
sessions whose server seconds are measured meanwhile. `niceness=0` measures the two competing.
"""

import contextlib
import os
import time

from tests.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.load.server import descendants

WATCH_NICENESS = 10

DRAWN_CHARTS = (
    "Array.from(document.querySelectorAll('[data-testid=\"stPlotlyChart\"]'))"
    ".filter(chart => chart.querySelector('.main-svg')).length"
)


def _renice_new_children(before: set[int], niceness: int) -> None:
    """Every process under this one that is not in `before` (Playwright's driver and the browser it started,
    whose zygote forks the renderers that inherit its niceness; not the server under test) at `niceness`."""
    for pid in set(descendants(os.getpid())) - before - {os.getpid()}:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, niceness)


def watch_planner(base_url: str, charts: int, timeout_s: float, niceness: int = WATCH_NICENESS) -> dict:
    """Seconds from navigation start to the Planner's title and to `charts` drawn charts (and the browser's
    niceness); an "error" on failure."""
    from playwright.sync_api import sync_playwright

    before = set(descendants(os.getpid()))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        _renice_new_children(before, niceness)
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
            charts_s = time.perf_counter() - started
            return {"title_s": round(title_s, 2), "charts_s": round(charts_s, 2), "niceness": niceness}
        finally:
            browser.close()
