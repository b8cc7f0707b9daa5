"""The server under load, started and stopped by the load test: one `streamlit run app.py`, or the team host
(`python -m hosting`: replicas behind nginx with a shared worker pool). Both bind 127.0.0.1 only.

Also what the load test reads off the server's process tree in /proc: resident memory (sampled for its peak) and
CPU seconds (user + system, every process under the root, including the job workers).
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hosting.launcher import app_command, healthy
from tests.conftest import ROOT

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT_S = 600.0  # the team host says ready after its warm-up: every page's default jobs computed


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it (children of every thread), from /proc."""
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                stack.extend(int(c) for c in (task / "children").read_text().split())
    return found


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and every process under it (0 for ones that already exited)."""
    total = 0
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{child}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid` and every live process under it."""
    total = 0
    for child in descendants(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / CLOCK_TICKS


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


def start_server(
    port: int,
    log_path: Path,
    env: dict[str, str],
    replicas: int | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> subprocess.Popen:
    """`streamlit run app.py` (replicas None) or `python -m hosting --replicas R` on 127.0.0.1:port; returns
    once /_stcore/health answers ok through it (for the host: once it says ready, after its warm-up). Raises
    RuntimeError (the server stopped) when it does not within `ready_timeout_s`."""
    if replicas is None:
        command = app_command(port)
    else:
        command = [sys.executable, "-m", "hosting", "--port", str(port), "--replicas", str(replicas)]
    log = open(log_path, "w")  # noqa: SIM115 (closed with the process)
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + ready_timeout_s
    ready = replicas is None or "hosting: ready"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if healthy(port) and (ready is True or ready in log_path.read_text()):
            return process
        time.sleep(0.25)
    stop_server(process)
    raise RuntimeError(f"the server did not start; see {log_path}")


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 60 s (the team host stops its parts one group after another, each given up to
    10 s; killed, it could not remove its runtime directory)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
