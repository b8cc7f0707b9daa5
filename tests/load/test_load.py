"""The protocol load test at a size that fits CI: 6 people at once on one server (each opening Kernels,
Simulator and Planner and typing one value on each, twice over), with one real Chromium opening the Planner
meanwhile.

The bounds are the issue's targets for 20 people, here for 6, the same on any number of cores: the protocol
client costs ~20 ms of CPU per render, so what is measured is the server (the Chromium is one browser, not one
per session).

The watching Chromium shares the same 2 cores with the server and the 6 clients, so how long it takes to *draw*
the Planner's charts is mostly its own CPU (loading Streamlit's and plotly's scripts, drawing), not the server's:
the test requires the server's answer (the page title) within the 5 s target and all four charts drawn, and
reports the drawing time (`watch.charts_s`) rather than bounding it (docs/benchmarks.md, "Load test", has the figures).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CHROMIUM, ROOT
from tests.load.run import PAGE_P95_S as PAGE_SERVER_P95_S
from tests.load.run import PLANNER_P95_S as PLANNER_SERVER_P95_S

SESSIONS = 6
# Each session visits its pages twice: 24 renders a page, so the p95 is not the slowest render alone (of 12 renders
# it is mostly the slowest: one stall of the CI machine failed a run at 1.12 s where runs here measure 0.3 s)
ROUNDS = 2
WATCHED_PLANNER_TITLE_S = 5.0
PEAK_RSS_BYTES = 3 * 1024**3


def _load(*args: str, env: dict[str, str] | None = None) -> dict:
    # its own process: the suite's session-wide Playwright already runs an event loop in this one
    completed = subprocess.run(
        [sys.executable, "-m", "tests.load.run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert completed.returncode in (0, 1), completed.stderr[-4000:]
    return json.loads(completed.stdout)


# Its bounds are latencies on this machine: the other pytest-xdist worker's tests wait meanwhile (tests/conftest.py)
@pytest.mark.exclusive
@pytest.mark.browser
def test_six_people_at_once_get_every_page_fast_without_errors():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs it")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    figures = _load(
        "--sessions", str(SESSIONS), "--rounds", str(ROUNDS), "--edit", "--watch", "--cpu-renders", "1"
    )
    # what a failure prints: every page's figures and the machine's load, not the CPU description
    said = {key: figures[key] for key in ("pages", "watch", "burst_wall_s", "burst_server_cpu_s", "failures")}
    said["load_average_1m"] = (figures["load_average_1m_before"], figures["load_average_1m"])
    assert figures["failure_count"] == 0, said
    for name, page in figures["pages"].items():
        assert page["renders"] == 2 * SESSIONS * ROUNDS, (name, said)
        assert page["charts_min"] >= 4, (name, said)
        assert page["errors"] == [], (name, said)
        assert page["server_p95_s"] <= PAGE_SERVER_P95_S, (name, said)
    assert figures["pages"]["planner"]["server_p95_s"] <= PLANNER_SERVER_P95_S, said
    watch = figures["watch"]
    assert watch.get("title_s", 1e9) <= WATCHED_PLANNER_TITLE_S, said
    assert watch.get("charts_s", 1e9) < 600, said  # every chart drawn (no bound: the browser's own CPU)
    assert 0 < figures["peak_rss_bytes"] <= PEAK_RSS_BYTES, figures["peak_rss_bytes"]


def test_fresh_mode_starts_a_new_warmed_host_and_reports_every_page(shared_host_cache):
    """`--fresh`: a new team host with 2 replicas that said ready only after its warm-up, one warm-up pass, then
    the burst (2 people here; the 20-person target is measured by hand, see the README's host guide). Not
    `exclusive`: it bounds no latency (only that every render arrived whole), so the other worker runs meanwhile."""
    # the new host's processes are new; its result cache is the suite's hosts' (their defaults computed once)
    figures = _load(
        "--sessions",
        "2",
        "--fresh",
        "--cpu-renders",
        "1",
        env={"PAGED_LAB_CACHE_DIR": str(shared_host_cache)},
    )
    assert figures["mode"] == "fresh" and figures["replicas"] == 2 and figures["edits"] is None, figures
    assert figures["failure_count"] == 0, figures
    for name, page in figures["pages"].items():
        assert page["renders"] == 2 and page["charts_min"] >= 4 and page["errors"] == [], (name, figures)
    assert set(figures["warm_cpu_ms_per_render"]) == {"kernels", "simulator", "planner"}, figures
    assert figures["warm_up_s"] > 0 and 0 < figures["startup_s"] <= 600, figures
    log = (ROOT / figures["server_log"]).read_text()
    assert log.index("hosting: warm-up done") < log.index("hosting: ready"), log[-3000:]
    assert f"cache {shared_host_cache})" in log, log[-3000:]  # PAGED_LAB_CACHE_DIR: --cache-dir's default
