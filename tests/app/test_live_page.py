"""The Live page under AppTest, reading vLLM-format metric text served by a tiny http.server on 127.0.0.1, and KV
events from an in-process ZMQ publisher: figures, fleet sums, errors as messages, the operator's host limit."""

import time

import pytest

from tests.conftest import open_page_with
from tests.live.exposition import EngineState, vllm_exposition
from tests.live.metrics_server import MetricsServer
from tests.live.zmq_vllm import FakeVllmPublisher

PAGE = "app_pages/live.py"


@pytest.fixture(autouse=True)
def loopback_hosts(monkeypatch, request):
    """The test servers listen on random loopback ports: the operator allows loopback (any port) here."""
    from ui.jobs import app_limits

    request.addfinalizer(app_limits.clear)
    monkeypatch.setenv("PAGED_LAB_LIVE_HOSTS", "127.0.0.1")
    app_limits.clear()


@pytest.fixture(scope="module")
def server():
    two_engines = vllm_exposition(
        {
            "0": EngineState(usage=0.2, running=2, waiting=0, queries=100, hits=10),
            "1": EngineState(usage=0.6, running=5, waiting=4, queries=300, hits=150),
        }
    )
    s = MetricsServer(
        {
            "/metrics": two_engines,
            "/other": vllm_exposition({"0": EngineState(usage=0.5, running=1, waiting=1)}, legacy=True),
            "/html": "<html><body><h1>502 Bad Gateway</h1></body></html>",
        }
    )
    yield s
    s.close()


def live(params: dict[str, str]):
    return open_page_with(PAGE, params, timeout=60)


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def test_one_server_two_engines_summed(server):
    at = live({"metrics": server.url(), "watch": "0"})
    assert not at.error and not at.warning
    assert metric(at, "KV cache usage") == "40.0%"  # equal pools: the mean of 20% and 60%
    assert metric(at, "Running / waiting") == "7 / 4"
    assert metric(at, "Prefix-cache hit rate (overall)") == "40.0%"  # 160 / 400 tokens
    assert metric(at, "KV blocks (num_gpu_blocks)") == "2,000"
    assert len(at.get("plotly_chart")) >= 5  # usage, requests, hit rate, preemptions, latency
    assert "`None`" not in [
        m.value for m in at.markdown
    ]  # no plan named: a caption, nothing written by magic
    assert at.query_params["metrics"] in (server.url(), [server.url()])


def test_fleet_of_two_servers_and_failures_are_messages(server):
    urls = "\n".join([server.url(), server.url("/other"), server.url("/html"), server.url("/missing")])
    at = live({"metrics": urls, "watch": "0"})
    assert metric(at, "Running / waiting") == "8 / 5"  # the two servers that answered, summed
    warnings = " ".join(w.value for w in at.warning)
    assert "HTML" in warnings and "HTTP 404" in warnings
    assert any("pre-0.9" in c.value for c in at.caption)


def test_refused_addresses_and_unreachable_servers(server):
    at = live(
        {"metrics": "file:///etc/passwd http://127.0.0.1:9/metrics", "events": "tcp://*:5557", "watch": "0"}
    )
    errors = " ".join(e.value for e in at.error)
    assert "file:///etc/passwd" in errors and "tcp://" in errors
    assert any("connection refused" in w.value for w in at.warning)


def test_operator_host_list_and_off(server, monkeypatch):
    from ui.jobs import app_limits

    monkeypatch.setenv("PAGED_LAB_LIVE_HOSTS", "10.1.2.3")
    app_limits.clear()
    at = live({"metrics": server.url(), "watch": "0"})
    assert any("PAGED_LAB_LIVE_HOSTS" in e.value for e in at.error) and not at.get("plotly_chart")
    monkeypatch.setenv("PAGED_LAB_LIVE_HOSTS", "off")
    app_limits.clear()
    at = live({"metrics": server.url()})
    assert any("turned the Live page off" in i.value for i in at.info)


def test_by_default_only_the_lab_servers_loopback_ports(server, monkeypatch):
    """PAGED_LAB_LIVE_HOSTS unset: the test server's loopback port is not one the lab server uses, so it is refused
    before anything connects; the lab server's own controls stay (its ports are the default)."""
    from ui.jobs import app_limits

    monkeypatch.delenv("PAGED_LAB_LIVE_HOSTS")
    app_limits.clear()
    hits = server.hits
    at = live({"metrics": server.url(), "watch": "0"})
    errors = " ".join(e.value for e in at.error)
    assert "address 127.0.0.1 is a loopback address not in PAGED_LAB_LIVE_HOSTS" in errors, errors
    assert server.hits == hits and not at.get("plotly_chart")
    assert at.button(key="lab_start") is not None


def test_predicted_against_observed(server):
    at = live({"metrics": server.url(), "model": "llama-3.1-8b", "gpu": "h100-80gb", "watch": "0"})
    assert any(s.value == "Predicted against observed" for s in at.subheader)
    assert any("block_size 16" in c.value for c in at.caption)
    assert any("against the plan" in m.value or "agree" in m.value for m in at.markdown)


def test_cached_block_tree_from_events(server):
    from core.kv.events import BlockStored

    pub = FakeVllmPublisher()
    try:
        params = {
            "metrics": server.url(),
            "events": pub.endpoint,
            "replay": pub.replay_endpoint,
            "watch": "0",
        }
        at = live(params)
        pub.wait_subscribed()
        pub.publish([BlockStored([1, 2, 3], None, list(range(12)), 4, None, "GPU", None)])
        pub.publish([BlockStored([4], 2, [0] * 4, 4, None, "GPU", None)])
        for _ in range(20):
            at.run()
            table = at.dataframe[0].value
            if table["cached blocks"].iloc[0] == 4:
                break
            time.sleep(0.1)
        assert not at.exception
        assert table["cached blocks"].iloc[0] == 4 and table["batches"].iloc[0] == 2
        assert any("What it cannot show" in m.value for m in at.markdown)
        assert len(at.get("plotly_chart")) >= 6  # the metrics figures and the icicle
    finally:
        pub.close()


def _two_ranks():
    """Publishers of ranks 0 and 1 on consecutive ports (rank r listens on the endpoint's port + r)."""
    import zmq

    for _ in range(20):
        first = FakeVllmPublisher(replay=False)
        port = int(first.endpoint.rsplit(":", 1)[1])
        try:
            return first, FakeVllmPublisher(replay=False, port=port + 1)
        except zmq.ZMQError:
            first.close()
    raise AssertionError("no two consecutive free ports")


def test_where_each_prefix_lives_over_two_ranks(server):
    """Rank 0 caches a 3-block prefix; rank 1 the same tokens under other hashes (another process's seed) and a
    prefix of its own: 3 blocks held twice, matched by tokens."""
    from core.kv.events import BlockStored

    ranks = _two_ranks()
    try:
        at = live({"metrics": server.url(), "events": ranks[0].endpoint, "ranks": "2", "watch": "0"})
        for pub in ranks:
            pub.wait_subscribed()
        ranks[0].publish([BlockStored([1, 2, 3], None, list(range(12)), 4, None, "GPU", None)])
        ranks[1].publish([BlockStored([7, 8, 9], None, list(range(12)), 4, None, "GPU", None)])
        ranks[1].publish([BlockStored([5], None, [50, 51, 52, 53], 4, None, "GPU", None)])
        for _ in range(30):
            at.run()
            if len(at.dataframe) > 1 and at.dataframe[1].value["cached blocks"].tolist() == [3, 4]:
                break
            time.sleep(0.1)
        assert not at.exception
        table = at.dataframe[1].value
        assert table["cached blocks"].tolist() == [3, 4] and table["also cached elsewhere"].tolist() == [3, 3]
        assert table["prefixes (first blocks)"].tolist() == [1, 2]
        assert any(
            "3 of 4 distinct cached blocks are held by several replicas" in c.value for c in at.caption
        )
    finally:
        for pub in ranks:
            pub.close()


def test_one_click_lab_server_with_load(monkeypatch):
    """The button starts core.serve (tiny model, free loopback ports) with a mixed load and points the page at it;
    the page then reads its metrics and its KV events; the stop button ends it."""
    from core.serve import launcher
    from core.serve.launcher import free_port

    monkeypatch.setattr(launcher, "DEFAULT_PORTS", (free_port(), free_port(), free_port()))
    try:
        at = live({"watch": "0"})
        at.radio(key="lab_model").set_value("tiny")
        at.run()
        at.button(key="lab_start").click()
        at.run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        # the run that started it shows the stop button at once, not the start button it was drawn with
        assert [b.key for b in at.button if b.key in ("lab_start", "lab_stop")] == ["lab_stop"]
        expected = f"http://127.0.0.1:{launcher.DEFAULT_PORTS[0]}/metrics"
        assert str(at.query_params["metrics"]).strip("[]'") == expected
        table, status = None, ""

        def cached_and_counted() -> bool:
            # the load runs: cached blocks show, and the status counts the requests answered (it counts a request
            # when its answer is back, which can come after its blocks are cached)
            nonlocal table, status
            table = at.dataframe[0].value if at.dataframe else None
            status = " ".join(c.value for c in at.caption if "mixed chat load has sent" in c.value)
            cached = table is not None and table["cached blocks"].iloc[0] > 0
            return cached and status != "" and "has sent 0 requests" not in status

        for _ in range(60):
            time.sleep(0.5)
            at.run()
            if cached_and_counted():
                break
        assert cached_and_counted(), (table, status)
        # the lab server's pool, read from its /metrics
        assert metric(at, "KV blocks (num_gpu_blocks)") == "1,024"
        at.button(key="lab_stop").click()
        at.run()
        assert not at.exception
        assert [b.key for b in at.button if b.key in ("lab_start", "lab_stop")] == ["lab_start"]
    finally:
        launcher.stop_all()


def test_planned_vs_observed_section():
    """Two polls of core.serve's own exporter (a llama-3.1-8b served name, planned on one H100): before any traffic,
    then after 24 finished requests. The first run has one poll (the section waits), the second plans the window."""
    from core.serve.exporter import FinishedRequest, ServerMetrics

    metrics = ServerMetrics(
        "meta-llama/Llama-3.1-8B", block_size=16, num_gpu_blocks=4000, prefix_caching=False, dtype="bfloat16"
    )
    s = MetricsServer({"/metrics": metrics.render()})
    try:
        at = live({"metrics": s.url(), "pvo_seqs": "16", "pvo_tokens": "2048"})
        assert any(c.value == "Planned vs observed needs two polls of the server." for c in at.caption)
        for i in range(24):
            first, last = 0.05 + 0.002 * i, 0.05 + 0.002 * i + 0.02 * 49
            metrics.ttft.observe(first)
            for _ in range(49):
                metrics.itl.observe(0.02)
            metrics.request_finished("length", FinishedRequest(0.0, 0.01, first, last, 500, 50))
        s.httpd.routes["/metrics"] = metrics.render()
        at.run()
        assert not at.exception, at.exception
        assert any(h.value == "Planned vs observed latency" for h in at.subheader)
        assert not at.error, [e.value for e in at.error]
        assert any("Planned with llama-3.1-8b on 1 x h100-80gb" in c.value for c in at.caption)
    finally:
        s.close()
