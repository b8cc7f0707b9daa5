"""The load test at a size that fits CI: 3 concurrent Chromium sessions on Kernels, Simulator and Planner."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CHROMIUM, ROOT

SESSIONS = 3
# The target: the Planner's p95 time to a finished render under 5 s while the heavy jobs run. Here the
# sessions' Chromium renderers run on the server's cores: on 2 cores three of them booting the frontend and
# drawing plotly charts at once take most of the CPU (measured: ~8 CPU-seconds of Chromium per session), so the
# end-to-end target is asserted where there are cores for browsers and server alike, and bounded loosely on
# fewer. What the server itself controls is asserted everywhere: its share of each Planner render (request to
# script finished, read off the websocket) stays under 5 s while the sweeps and simulations run (measured
# 0.2-1.6 s on 2 cores; before the worker pool whole Planner renders took ~65 s).
PLANNER_P95_S = 5.0 if (os.cpu_count() or 1) >= 8 else 50.0
PLANNER_SERVER_P95_S = 5.0
PEAK_RSS_BYTES = 3 * 1024**3


@pytest.mark.browser
def test_concurrent_sessions_finish_without_error_and_the_planner_stays_fast():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs it")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    # its own process: the suite's session-wide Playwright already runs an event loop in this one
    completed = subprocess.run(
        [sys.executable, "-m", "tests.load.run", "--sessions", str(SESSIONS)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    figures = json.loads(completed.stdout)
    assert figures["errors"] == [], figures
    assert all(page["renders"] == SESSIONS for page in figures["pages"].values()), figures
    assert figures["pages"]["planner"]["p95_s"] < PLANNER_P95_S, figures
    assert figures["pages"]["planner"]["server_p95_s"] < PLANNER_SERVER_P95_S, figures
    assert 0 < figures["peak_rss_bytes"] < PEAK_RSS_BYTES, figures
