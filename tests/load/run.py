"""Load test: N concurrent headless-Chromium sessions against a real server on 127.0.0.1.

Each session opens the Kernels, Simulator and Planner pages (session i starts at page i mod 3, so Planner renders
overlap the other sessions' heavy jobs): the first by its URL (a full page load), the next two from the sidebar
as a person would (the same Streamlit session). It waits for each page's finished render: the page's title,
its script no longer running, and every chart it draws at its defaults drawn. Before the clock starts, one
untimed visit warms the server (its first script run imports torch and starts the worker pool, once per
server). Prints one JSON object: sessions, per page p50 / p95 / max seconds to a finished render, peak RSS of
the server with every descendant process (the workers), errors.

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
# url path -> (the page's title, plotly charts it draws at its defaults when its results are in)
PAGES = {
    "kernels": ("Kernels: paged vs contiguous attention", 4),
    "simulator": ("Serving simulator", 5),
    "planner": ("Capacity planner", 4),
}
WARM_UP_PAGE = "planner"
STATUS_WIDGET = '[data-testid="stStatusWidget"]'
DRAWN_CHARTS = (
    "Array.from(document.querySelectorAll('[data-testid=\"stPlotlyChart\"]'))"
    ".filter(chart => chart.querySelector('.main-svg')).length"
)


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


class ScriptRuns:
    """The script runs of one tab's Streamlit session, read off its websocket: when the browser asked for a run
    (BackMsg rerun_script) and when the server said it finished (ForwardMsg script_finished), in
    time.perf_counter() seconds. The server's share of a render, apart from the browser's drawing."""

    SMALL = 512  # script_finished and rerun_script frames are tiny: larger frames (deltas) are not parsed

    def __init__(self, tab):
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        self.events: list[tuple[float, str]] = []
        self._kinds = ((BackMsg, "rerun_script"), (ForwardMsg, "script_finished"))
        tab.on("websocket", self._watch)

    def _watch(self, socket) -> None:
        socket.on("framesent", lambda payload: self._record(payload, 0))
        socket.on("framereceived", lambda payload: self._record(payload, 1))

    def _record(self, payload, direction: int) -> None:
        if not isinstance(payload, bytes) or len(payload) > self.SMALL:
            return
        message_type, kind = self._kinds[direction]
        with contextlib.suppress(Exception):
            if message_type.FromString(payload).WhichOneof("type") == kind:
                self.events.append((time.perf_counter(), kind))

    def seconds(self, start: float, end: float) -> float:
        """Seconds the server ran this tab's scripts between `start` and `end` (each run from its request to
        its script_finished; a run still going at `end` counts up to `end`)."""
        total, asked = 0.0, None
        for moment, kind in self.events:
            if not start <= moment <= end:
                continue
            if kind == "rerun_script" and asked is None:
                asked = moment
            elif kind == "script_finished" and asked is not None:
                total, asked = total + moment - asked, None
        return total + (end - asked if asked is not None else 0.0)

    def first_request(self, start: float, end: float) -> float | None:
        """Seconds from `start` until the browser first asked for a script run (a full page load: the frontend
        booting), None when it did not ask within [start, end]."""
        asked = [moment for moment, kind in self.events if kind == "rerun_script" and start <= moment <= end]
        return asked[0] - start if asked else None


async def _finished_render(tab, name: str) -> None:
    """Until page `name` shows its title, its script has stopped running and all its charts are drawn. The title
    comes first: until then the previous page's (stale) elements may still be on screen."""
    title, charts = PAGES[name]
    await tab.get_by_role("heading", name=title, exact=True).wait_for(timeout=PAGE_TIMEOUT_MS)
    await tab.wait_for_selector(STATUS_WIDGET, state="detached", timeout=PAGE_TIMEOUT_MS)
    await tab.wait_for_function(f"{DRAWN_CHARTS} >= {charts}", timeout=PAGE_TIMEOUT_MS)


async def _open(tab, base_url: str, name: str, first: bool) -> None:
    if first:
        await tab.goto(f"{base_url}/{name}", timeout=PAGE_TIMEOUT_MS)
    else:
        await tab.locator(f'[data-testid="stSidebarNav"] a[href$="/{name}"]').click(timeout=PAGE_TIMEOUT_MS)
    await _finished_render(tab, name)


async def _session(browser, base_url: str, index: int, clock: float, renders: list, errors: list) -> None:
    """One person: the three pages in turn; each finished render is appended to `renders` as
    {"session", "page", "start_s" (seconds after `clock`), "s" (seconds to the finished render),
    "server_s" (of which the server ran the page's script: `ScriptRuns.seconds`)}."""
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = await context.new_page()
    runs = ScriptRuns(tab)
    names = list(PAGES)
    order = names[index % 3 :] + names[: index % 3]
    try:
        for position, name in enumerate(order):
            start = time.perf_counter()
            await _open(tab, base_url, name, first=position == 0)
            end = time.perf_counter()
            seconds, server_s = end - start, runs.seconds(start, end)
            asked_s = runs.first_request(start, end)
            renders.append(
                {
                    "session": index,
                    "page": name,
                    "start_s": round(start - clock, 2),
                    "s": round(seconds, 2),
                    "server_s": round(server_s, 2),
                    "asked_s": None if asked_s is None else round(asked_s, 2),
                }
            )
            exceptions = await tab.locator('[data-testid="stException"]').count()
            failures = await tab.locator('[data-testid="stAlertContentError"]').all_inner_texts()
            if exceptions or failures:
                errors.append({"session": index, "page": name, "exceptions": exceptions, "errors": failures})
    except Exception as error:  # a timeout or a crash: recorded, the other sessions go on
        errors.append({"session": index, "error": f"{type(error).__name__}: {str(error)[:300]}"})
    finally:
        await context.close()


async def _warm_up(browser, base_url: str) -> None:
    context = await browser.new_context()
    try:
        await _open(await context.new_page(), base_url, WARM_UP_PAGE, first=True)
    finally:
        await context.close()


async def _drive(base_url: str, sessions: int) -> tuple[list, list]:
    from playwright.async_api import async_playwright

    renders: list[dict] = []
    errors: list = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            await _warm_up(browser, base_url)
            clock = time.perf_counter()
            await asyncio.gather(
                *(_session(browser, base_url, i, clock, renders, errors) for i in range(sessions))
            )
        finally:
            await browser.close()
    return renders, errors


def _spread(prefix: str, values: list[float]) -> dict[str, float]:
    return {
        f"{prefix}p50_s": round(statistics.median(values), 2),
        f"{prefix}p95_s": round(_percentile(values, 95), 2),
        f"{prefix}max_s": round(max(values), 2),
    }


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
        renders, errors = asyncio.run(_drive(f"http://127.0.0.1:{port}", sessions))
    finally:
        peak = sampler.stop()
        stop_server(server)
    pages = {}
    for name in PAGES:
        mine = [r for r in renders if r["page"] == name]
        if mine:
            pages[name] = {"renders": len(mine), **_spread("", [r["s"] for r in mine])}
            pages[name].update(_spread("server_", [r["server_s"] for r in mine]))
    return {
        "sessions": sessions,
        "pages": pages,
        "peak_rss_bytes": peak,
        "peak_rss_gib": round(peak / 1024**3, 2),
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_count": os.cpu_count(),
        "errors": errors,
        "renders": sorted(renders, key=lambda r: r["start_s"]),
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
