"""Load test: N concurrent headless-Chromium sessions against a real server on 127.0.0.1.

Each session opens the Kernels, Simulator and Planner pages (session i starts at page i mod 3, so Planner renders
overlap the other sessions' heavy jobs) and waits for each page's finished render: its charts drawn and the
script no longer running. Prints one JSON object: sessions, per page p50 / p95 / max seconds to a finished
render, peak RSS of the server with every descendant process (the workers), errors.

    python -m tests.load.run --sessions 10

Bounded: loopback only, at most 40 sessions, every wait has a timeout. Exits 1 when any session saw an error.
"""

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tests.conftest import CHROMIUM, CHROMIUM_ARGS, ROOT, _free_port

MAX_SESSIONS = 40
PAGE_TIMEOUT_MS = 240_000
# url path -> plotly charts the page draws at its defaults when its results are in
PAGES = {"kernels": 4, "simulator": 5, "planner": 1}
STATUS_WIDGET = '[data-testid="stStatusWidget"]'


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                stack.extend(int(c) for c in (task / "children").read_text().split())
    return found


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and every process under it, from /proc (0 for ones that already exited)."""
    total = 0
    for child in _descendants(pid):
        try:
            for line in Path(f"/proc/{child}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class RssSampler(threading.Thread):
    """Samples the process tree's RSS every `interval_s` until stopped; `peak` is the largest sample."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.interval_s, self.peak = pid, interval_s, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, tree_rss_bytes(self.pid))
            self._stop_event.wait(self.interval_s)

    def stop(self) -> int:
        self._stop_event.set()
        self.join(timeout=5)
        return self.peak


def start_server(port: int, log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """`streamlit run app.py` on 127.0.0.1:port; returns once /_stcore/health answers ok."""
    log = open(log_path, "w")  # noqa: SIM115 (closed with the process)
    process = subprocess.Popen(
        [
            sys.executable, "-m", "streamlit", "run", "app.py",
            "--server.headless", "true", "--server.port", str(port),
            "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
        ],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                if response.read().decode().strip() == "ok":
                    return process
        except OSError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.25)
    process.kill()
    raise RuntimeError(f"streamlit did not start; see {log_path}")


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


async def _finished_render(tab, charts: int) -> None:
    """Until the page has drawn `charts` plotly charts and its script has stopped running."""
    await tab.wait_for_function(
        f"document.querySelectorAll('[data-testid=\"stPlotlyChart\"] .main-svg').length >= {charts}",
        timeout=PAGE_TIMEOUT_MS,
    )
    await tab.wait_for_selector(STATUS_WIDGET, state="detached", timeout=PAGE_TIMEOUT_MS)


async def _session(browser, base_url: str, index: int, timings: dict, errors: list) -> None:
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = await context.new_page()
    names = list(PAGES)
    order = names[index % 3 :] + names[: index % 3]
    try:
        for name in order:
            start = time.perf_counter()
            await tab.goto(f"{base_url}/{name}", timeout=PAGE_TIMEOUT_MS)
            await _finished_render(tab, PAGES[name])
            timings[name].append(time.perf_counter() - start)
            exceptions = await tab.locator('[data-testid="stException"]').count()
            failures = await tab.locator('[data-testid="stAlertContentError"]').all_inner_texts()
            if exceptions or failures:
                errors.append({"session": index, "page": name, "exceptions": exceptions, "errors": failures})
    except Exception as error:  # a timeout or a crash: recorded, the other sessions go on
        errors.append({"session": index, "error": f"{type(error).__name__}: {str(error)[:300]}"})
    finally:
        await context.close()


async def _drive(base_url: str, sessions: int) -> tuple[dict, list]:
    from playwright.async_api import async_playwright

    timings: dict[str, list[float]] = {name: [] for name in PAGES}
    errors: list = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            await asyncio.gather(*(_session(browser, base_url, i, timings, errors) for i in range(sessions)))
        finally:
            await browser.close()
    return timings, errors


def _percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run(sessions: int, env: dict[str, str] | None = None) -> dict:
    """Start a server, drive `sessions` concurrent browser sessions, stop the server; returns the figures."""
    if not 1 <= sessions <= MAX_SESSIONS:
        raise ValueError(f"sessions must be between 1 and {MAX_SESSIONS}, got {sessions}")
    port = _free_port()
    log_path = ROOT / "tests" / "artifacts" / f"load_server_{port}.log"
    log_path.parent.mkdir(exist_ok=True)
    server = start_server(port, log_path, {**os.environ, **(env or {})})
    sampler = RssSampler(server.pid)
    sampler.start()
    started = time.perf_counter()
    try:
        timings, errors = asyncio.run(_drive(f"http://127.0.0.1:{port}", sessions))
    finally:
        peak = sampler.stop()
        stop_server(server)
    pages = {
        name: {
            "renders": len(values),
            "p50_s": round(statistics.median(values), 2),
            "p95_s": round(_percentile(values, 95), 2),
            "max_s": round(max(values), 2),
        }
        for name, values in timings.items()
        if values
    }
    return {
        "sessions": sessions,
        "pages": pages,
        "peak_rss_bytes": peak,
        "peak_rss_gib": round(peak / 1024**3, 2),
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_count": os.cpu_count(),
        "errors": errors,
        "server_log": str(log_path.relative_to(ROOT)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sessions", type=int, default=3, help=f"concurrent browser sessions (1-{MAX_SESSIONS})"
    )
    args = parser.parse_args(argv)
    figures = run(args.sessions)
    print(json.dumps(figures, indent=2))
    return 1 if figures["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
