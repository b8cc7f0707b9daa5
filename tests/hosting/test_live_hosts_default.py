"""A team host started the default way (`python -m hosting`, PAGED_LAB_LIVE_HOSTS unset) lets the Live page read
only the lab-started core.serve's loopback ports: a metrics URL on any other address is refused before anything
connects (the server at that address sees no request), and the launcher's log says what the page may reach."""

import asyncio
import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest

from core.hosts import DEFAULT_LIVE_HOSTS
from core.limits import Limits
from hosting.live_hosts import live_hosts_notice
from hosting.protocol import ProtocolSession
from tests.conftest import ROOT, _free_port
from tests.live.metrics_server import MetricsServer

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (.ci/run installs it)"
)


def test_a_default_host_refuses_a_metrics_url_it_was_not_given(tmp_path):
    server = MetricsServer({"/metrics": "vllm:num_requests_running 1.0\n"})  # a real server it must not reach
    port, log = _free_port(), tmp_path / "host.log"
    env = {k: v for k, v in os.environ.items() if k != "PAGED_LAB_LIVE_HOSTS"}
    process = subprocess.Popen(
        [sys.executable, "-m", "hosting", "--port", str(port), "--replicas", "1", "--no-warm"],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while "hosting: ready" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        assert (
            f"the Live page may read only the lab-started core.serve ({DEFAULT_LIVE_HOSTS})"
            in log.read_text()
        )
        urls = f"{server.url()} http://169.254.169.254/latest/meta-data http://10.0.0.5:8000/metrics"
        query = urllib.parse.urlencode({"metrics": urls, "events": "tcp://10.0.0.5:5557", "watch": "0"})

        async def live():
            async with ProtocolSession(f"http://127.0.0.1:{port}", timeout_s=120) as session:
                return await session.open("live", query)

        with concurrent.futures.ThreadPoolExecutor(1) as one:  # a fresh event loop, as test_host.py does
            render = one.submit(asyncio.run, live()).result()
        assert not render.exceptions, render
        refused = [e for e in render.errors if "refused" in e and "PAGED_LAB_LIVE_HOSTS" in e]
        assert len(refused) == 4, render.errors  # three metrics URLs and the events endpoint
        text = " ".join(refused)
        for expected in (
            "address 127.0.0.1 is a loopback address",
            "169.254.169.254 is a link-local address",
            "10.0.0.5 is a private address",
        ):
            assert expected in text, text
        assert server.hits == 0  # nothing connected to it
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        server.close()


def test_the_launcher_warns_when_the_operator_allows_any_host():
    assert live_hosts_notice(Limits()) == (
        False,
        f"hosting: the Live page may read only the lab-started core.serve ({DEFAULT_LIVE_HOSTS}); set "
        "PAGED_LAB_LIVE_HOSTS to add your vLLM hosts",
    )
    warning, line = live_hosts_notice(Limits(live_hosts="*,vllm.internal:8000"))
    assert warning and "WARNING" in line and "any public address" in line
    warning, line = live_hosts_notice(Limits(live_hosts="169.254.0.0/16"))
    assert warning and "169.254.169.254" in line
    assert live_hosts_notice(Limits(live_hosts="vllm.internal:8000,10.0.0.5")) == (
        False,
        "hosting: the Live page may read PAGED_LAB_LIVE_HOSTS=vllm.internal:8000,10.0.0.5",
    )
    assert live_hosts_notice(Limits(live_hosts="off"))[0] is False
