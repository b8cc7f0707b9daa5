"""Where the Live page may connect (core/hosts.py) and how it connects there (core/live/addresses.py, fetch.py,
subscriber.py): address classes against the IANA special-purpose registries (RFC 6890 and its updates, written
out here, not read from `ipaddress`), the default, name/address/network/`*` entries, DNS answers checked address
by address and the connection pinned to the checked address, and errors that never echo what answered."""

import socket
import threading

import pytest

from core.errors import LimitConfigError, LiveAddressRefusedError, LiveEndpointError
from core.hosts import DEFAULT_LIVE_HOSTS, HostPolicy, address_class, parse_ip
from core.limits import Limits
from core.live.addresses import check_events_endpoint, check_metrics_url, resolve_checked
from core.live.fetch import fetch_metrics_text
from core.live.metrics import parse_vllm_metrics
from core.live.subscriber import KVEventSubscriber
from tests.live.metrics_server import MetricsServer

# (address, its class): the IANA IPv4 / IPv6 special-purpose address registries, by hand
CLASSES = [
    ("8.8.8.8", "public"),
    ("1.1.1.1", "public"),
    ("2606:4700:4700::1111", "public"),
    ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"),
    ("::1", "loopback"),
    ("10.0.0.5", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("fd12:3456::1", "private"),
    ("fc00::1", "private"),
    ("169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("100.64.0.1", "shared"),
    ("100.127.255.254", "shared"),
    ("fec0::1", "site-local"),
    ("240.0.0.1", "reserved"),
    ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:8.8.8.8", "public"),
    ("64:ff9b::a00:5", "private"),  # NAT64 of 10.0.0.5
    ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 of 169.254.169.254
    ("192.0.2.1", "private"),
    ("198.18.0.1", "private"),  # documentation, benchmarking: not routable
]


@pytest.mark.parametrize(("text", "kind"), CLASSES)
def test_address_classes(text, kind):
    assert address_class(parse_ip(text)) == kind


def test_the_default_is_the_lab_servers_loopback_ports():
    policy = Limits().live_policy
    assert (
        policy.default and policy.text == DEFAULT_LIVE_HOSTS == "127.0.0.1:8000,127.0.0.1:5557,127.0.0.1:5558"
    )
    for port in (8000, 5557, 5558):
        policy.admit("127.0.0.1", port, "x")
    for host, port, kind in [
        ("127.0.0.1", 8001, "loopback"),
        ("[::1]", 8000, "loopback"),
        ("10.0.0.5", 8000, "private"),
        ("169.254.169.254", 80, "link-local"),
        ("8.8.8.8", 8000, "public"),
        ("[::ffff:127.0.0.1]", 9000, "loopback"),
        ("0.0.0.0", 8000, "unspecified"),
    ]:
        with pytest.raises(LiveAddressRefusedError) as caught:
            policy.admit(host, port, "the metrics URL's host")
        assert caught.value.address_class == kind and caught.value.variable == "PAGED_LAB_LIVE_HOSTS"
        assert f"is a {kind} address" in str(caught.value) or f"is an {kind} address" in str(caught.value)
    with pytest.raises(LiveAddressRefusedError, match="not among the hosts") as caught:
        policy.admit("localhost", 8000, "x")  # a name is refused before any lookup: no entry could allow it
    assert caught.value.address_class == "name"


def test_entries_names_addresses_networks_and_any_public():
    policy = HostPolicy.parse("*, vllm.internal:8000, 10.1.0.0/16, [::1]:9000, 192.168.0.7")
    policy.permit("vllm.internal", "10.9.9.9", 8000, "x")  # a listed name may be private
    policy.permit("vllm.internal", "127.0.0.1", 8000, "x")  # or loopback
    policy.permit("anything.example", "10.1.200.3", 1234, "x")  # inside a listed network, any port
    policy.permit("anything.example", "93.184.215.14", 443, "x")  # '*': public
    policy.permit("[::1]", "::1", 9000, "x")
    policy.permit("192.168.0.7", "192.168.0.7", 5, "x")  # an address without a port: every port
    refused = [
        ("vllm.internal", "169.254.169.254", 8000, "link-local"),  # a name never reaches link-local
        ("vllm.internal", "10.9.9.9", 8001, "private"),  # the name's port only
        ("anything.example", "10.2.0.1", 80, "private"),  # '*' is public only
        ("anything.example", "127.0.0.1", 80, "loopback"),
        ("[::1]", "::1", 9001, "loopback"),
        ("x", "::ffff:10.1.2.3", 80, None),  # mapped: the IPv4 address counts, and 10.1/16 allows it
    ]
    for host, ip, port, kind in refused:
        if kind is None:
            policy.permit(host, ip, port, "x")
            continue
        with pytest.raises(LiveAddressRefusedError) as caught:
            policy.permit(host, ip, port, "x")
        assert caught.value.address_class == kind
    policy.admit("any.name", 80, "x")  # '*' (and a network) admit names before the lookup
    assert HostPolicy.parse("off").off
    with pytest.raises(LiveAddressRefusedError, match="turned off"):
        HostPolicy.parse("off").admit("127.0.0.1", 8000, "x")


@pytest.mark.parametrize(
    "bad", ["http://x", "host:0", "host:99999", "[::1", "a b", "10.0.0.0/33", "*:80", "-x"]
)
def test_bad_entries_are_refused_naming_the_variable(bad):
    with pytest.raises(LimitConfigError, match="PAGED_LAB_LIVE_HOSTS") as caught:
        Limits.from_mapping({"PAGED_LAB_LIVE_HOSTS": bad})
    assert caught.value.variable == "PAGED_LAB_LIVE_HOSTS"


@pytest.fixture
def dns(monkeypatch):
    """A fake resolver: name -> the addresses each successive lookup answers (the last answer repeats)."""
    answers: dict[str, list[list[str]]] = {}
    calls: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        calls.append(host)
        replies = answers[host]
        reply = replies.pop(0) if len(replies) > 1 else replies[0]
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in reply
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers, calls


def test_every_resolved_address_is_checked(dns):
    answers, _ = dns
    answers["meta.example"] = [["169.254.169.254"]]
    answers["split.example"] = [["93.184.215.14", "10.0.0.5"]]  # one public, one private: refused whole
    policy = HostPolicy.parse("*")
    with pytest.raises(LiveAddressRefusedError, match=r"169\.254\.169\.254 is a link-local address"):
        resolve_checked("meta.example", 80, policy, "the metrics URL's host")
    with pytest.raises(LiveAddressRefusedError, match=r"10\.0\.0\.5 is a private address"):
        resolve_checked("split.example", 80, policy, "x")
    with pytest.raises(LiveEndpointError, match="unresolvable") as caught:
        resolve_checked("no-such-host.invalid", 80, policy, "x")
    assert caught.value.failure == "unresolvable"


def test_the_fetch_connects_to_the_checked_address_with_the_name_as_host(dns):
    """A name that answers 127.0.0.1 once and the cloud metadata address afterwards (DNS rebinding) is looked up once per fetch and
    the request goes to the address that was checked, with the name in the Host header."""
    answers, calls = dns
    server = MetricsServer({"/metrics": "vllm:num_requests_running 3.0\n"})
    try:
        answers["lab.example"] = [["127.0.0.1"], ["169.254.169.254"]]
        limits = Limits(live_hosts="lab.example")
        url = check_metrics_url(f"http://lab.example:{server.port}/metrics", limits)
        assert calls == []  # checking what was typed looks nothing up
        text = fetch_metrics_text(url)
        assert parse_vllm_metrics(text).num_requests_running == 3.0
        assert calls == ["lab.example"] and server.host_headers == [f"lab.example:{server.port}"]
        with pytest.raises(LiveAddressRefusedError, match=r"169\.254\.169\.254 is a link-local address"):
            fetch_metrics_text(url)  # the name now points at the metadata service: refused, nothing sent
        assert server.hits == 1
    finally:
        server.close()


def test_errors_name_the_failure_class_never_what_answered():
    server = MetricsServer(
        {
            "/metrics": "<html><body>internal admin: password hunter2</body></html>",
            "/junk": "password=hunter2 {{{\n",
        }
    )
    banner = socket.socket()
    banner.bind(("127.0.0.1", 0))
    banner.listen()

    def serve_banner():  # a non-HTTP service: it greets with a secret and hangs up
        conn, _ = banner.accept()
        conn.recv(1024)
        conn.sendall(b"SSH-2.0-hunter2-secret-banner\r\n")
        conn.close()

    thread = threading.Thread(target=serve_banner, daemon=True)
    thread.start()
    limits = Limits(live_hosts="127.0.0.1")
    try:
        failures = {}
        for path in ("/secret-error", "/redirect", "/nope"):
            with pytest.raises(LiveEndpointError) as caught:
                fetch_metrics_text(check_metrics_url(server.url(path), limits))
            failures[path] = caught.value
        with pytest.raises(LiveEndpointError) as caught:
            fetch_metrics_text(
                check_metrics_url(f"http://127.0.0.1:{banner.getsockname()[1]}/metrics", limits)
            )
        failures["banner"] = caught.value
        assert {k: e.failure for k, e in failures.items()} == {
            "/secret-error": "http-status",
            "/redirect": "redirect",
            "/nope": "http-status",
            "banner": "not-http",
        }
        assert "HTTP 500" in str(failures["/secret-error"]) and "HTTP 302" in str(failures["/redirect"])
        for path in ("/metrics", "/junk"):  # what a refused parse says names the line, not its content
            with pytest.raises(Exception, match="not a Prometheus exposition") as caught:
                parse_vllm_metrics(fetch_metrics_text(check_metrics_url(server.url(path), limits)))
            failures[path] = caught.value
        for error in failures.values():
            text = str(error)
            assert "hunter2" not in text and "10.255.255.1" not in text and "no such path" not in text, text
    finally:
        server.close()
        banner.close()


def test_the_subscriber_connects_to_the_checked_address(dns):
    answers, calls = dns
    answers["events.example"] = [["127.0.0.1"]]
    limits = Limits(live_hosts="events.example")
    endpoint = check_events_endpoint("tcp://events.example:5557", limits)
    sub = KVEventSubscriber(endpoint)
    try:
        assert sub._pub_address == "tcp://127.0.0.1:5557" and calls == ["events.example"]
        assert sub.endpoint.address == "tcp://events.example:5557"  # shown as written
    finally:
        sub.close()
    answers["meta.example"] = [["169.254.169.254"]]
    with pytest.raises(LiveAddressRefusedError, match="link-local"):
        KVEventSubscriber(check_events_endpoint("tcp://meta.example:5557", Limits(live_hosts="meta.example")))
