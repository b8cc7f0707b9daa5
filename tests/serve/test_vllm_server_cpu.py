"""`VLLMServer.cpu_seconds`: the CPU time of every process in the server's group, read from /proc, checked against
the CPU time a child reports for itself."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.serve.vllm_server import VLLMServeConfig, VLLMServer

NAME = Path(sys.executable).name[:15]  # /proc's name of a process: its executable's, 15 characters at most
BURN = "import time, os; t = time.process_time(); exec('while time.process_time() - t < 0.6: pass'); time.sleep(30)"


def test_cpu_seconds_sums_the_server_groups_processes_by_name(tmp_path):
    server = VLLMServer(VLLMServeConfig(model_dir=str(tmp_path)), log_path=tmp_path / "log")
    assert server.cpu_seconds() == {}  # not started
    # a stand-in for `vllm serve`: a group leader whose child burns 0.6 s of CPU, then idles
    server.process = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -c {BURN!r} & wait"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while (used := server.cpu_seconds()).get(NAME, 0.0) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert used[NAME] == pytest.approx(0.6, abs=0.15)  # the child's own process_time, in clock ticks
        assert used["bash"] < 0.1 and set(used) == {"bash", NAME}
    finally:
        server.stop()
    assert server.cpu_seconds() == {}
