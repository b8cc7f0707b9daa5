"""Addresses a user types are checked before any connection; fetching is bounded and every failure is typed."""

import socket

import pytest

from core.errors import InvalidArgumentError, LiveEndpointError
from core.limits import LimitExceededError, Limits
from core.live.addresses import check_events_endpoint, check_metrics_url, endpoint_for_rank
from core.live.fetch import fetch_metrics_text
from tests.live.metrics_server import MetricsServer

LOOPBACK = Limits(live_hosts="127.0.0.1")  # loopback, any port: the test's own servers


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://127.0.0.1/metrics",
        "gopher://127.0.0.1:70/",
        "127.0.0.1:8000/metrics",
        "http:///metrics",
        "http://user:pw@127.0.0.1/metrics",
        "http://127.0.0.1:99999/metrics",
        "http://127.0.0.1/me trics",
        "",
        "x" * 600,
    ],
)
def test_only_plain_http_urls(url):
    with pytest.raises(InvalidArgumentError):
        check_metrics_url(url, LOOPBACK)


def test_url_host_and_port():
    u = check_metrics_url(" https://VLLM.internal/metrics ", Limits(live_hosts="vllm.internal"))
    assert (u.url, u.host, u.port) == ("https://VLLM.internal/metrics", "vllm.internal", 443)
    assert check_metrics_url("http://[::1]:8000/metrics", Limits(live_hosts="[::1]")).host == "[::1]"


@pytest.mark.parametrize(
    "endpoint", ["tcp://*:5557", "ipc:///tmp/x", "inproc://x", "tcp://127.0.0.1", "tcp://h:0", "http://h:1"]
)
def test_only_tcp_endpoints(endpoint):
    with pytest.raises(InvalidArgumentError):
        check_events_endpoint(endpoint, LOOPBACK)


def test_operator_host_list_and_off():
    limits = Limits(live_hosts="127.0.0.1:8000,vllm.internal")
    check_metrics_url("http://127.0.0.1:8000/metrics", limits)
    check_events_endpoint("tcp://vllm.internal:5557", limits)
    for bad in ("http://127.0.0.1:8001/metrics", "http://169.254.169.254/latest/meta-data"):
        with pytest.raises(LimitExceededError, match="PAGED_LAB_LIVE_HOSTS") as caught:
            check_metrics_url(bad, limits)
        assert caught.value.variable == "PAGED_LAB_LIVE_HOSTS"
    with pytest.raises(LimitExceededError, match="turned off"):
        check_metrics_url("http://127.0.0.1:8000/metrics", Limits(live_hosts="off"))
    base = check_events_endpoint("tcp://vllm.internal:5557", limits)
    assert endpoint_for_rank(base, 3, limits).address == "tcp://vllm.internal:5560"


@pytest.fixture
def server():
    s = MetricsServer({"/metrics": "vllm:num_requests_running 1.0\n", "/big": b"x" * 2_000})
    yield s
    s.close()


def test_fetch_ok_and_failures(server):
    assert fetch_metrics_text(check_metrics_url(server.url(), LOOPBACK)) == "vllm:num_requests_running 1.0\n"
    with pytest.raises(LiveEndpointError, match="HTTP 404"):
        fetch_metrics_text(check_metrics_url(server.url("/nope"), LOOPBACK))
    with pytest.raises(
        LiveEndpointError, match="HTTP 302"
    ):  # never followed: it could leave the allowed hosts
        fetch_metrics_text(check_metrics_url(server.url("/redirect"), LOOPBACK))
    with pytest.raises(LiveEndpointError, match=r"within 0\.5 s"):
        fetch_metrics_text(check_metrics_url(server.url("/slow"), LOOPBACK), timeout_s=0.5)
    with pytest.raises(LiveEndpointError, match="more than 1,000 bytes"):
        fetch_metrics_text(check_metrics_url(server.url("/big"), LOOPBACK), max_bytes=1_000)


def test_fetch_refused():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LiveEndpointError, match="connection refused") as caught:
        fetch_metrics_text(check_metrics_url(f"http://127.0.0.1:{port}/metrics", LOOPBACK))
    assert caught.value.failure == "refused"
