"""Regenerate the screenshots of the README and docs/pages: python docs/make_screenshots.py (needs /usr/bin/chromium).

Starts `streamlit run app.py` on 127.0.0.1, opens each page at its defaults in Debian's Chromium, waits for its
charts, saves docs/<page>.png, and stops the server.
"""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
# page -> (url path, viewport height in pixels): Streamlit scrolls inside its main container, so a full-page
# screenshot is only as tall as the viewport.
PAGES = {
    "playground": ("", 1100),
    "kernels": ("kernels", 2000),
    "simulator": ("simulator", 2600),
    "planner": ("planner", 2900),
}
PORT = 8599


def main() -> None:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.port",
            str(PORT),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/_stcore/health", timeout=1)
                break
            except OSError:
                time.sleep(0.25)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            for name, (path, height) in PAGES.items():
                page = browser.new_page(viewport={"width": 1500, "height": height})
                page.goto(f"http://127.0.0.1:{PORT}/{path}")
                page.wait_for_selector('[data-testid="stPlotlyChart"] .main-svg', timeout=120_000)
                page.wait_for_function(
                    "!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000
                )
                time.sleep(2)
                page.screenshot(path=str(ROOT / "docs" / f"{name}.png"))
                page.close()
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
