"""The Live page's prompt lookup, bind toggle and silent-PUB warning under AppTest: KV events from an in-process
ZMQ publisher (tests/live/zmq_vllm) carrying vLLM's block hashes of a prompt, metrics from a tiny http.server."""

import time

import pytest

from core.kv.block_hash import vllm_block_hashes
from core.kv.events import BlockStored
from core.serve.launcher import free_port
from tests.conftest import open_page_with
from tests.live.exposition import EngineState, vllm_exposition
from tests.live.metrics_server import MetricsServer
from tests.live.zmq_vllm import FakeVllmPublisher

PAGE = "app_pages/live.py"
PROMPT = list(range(1000, 1100))  # 100 tokens: 6 full blocks of 16


@pytest.fixture(autouse=True)
def loopback_hosts(monkeypatch, request):
    from ui.jobs import app_limits

    request.addfinalizer(app_limits.clear)
    monkeypatch.setenv("PAGED_LAB_LIVE_HOSTS", "127.0.0.1")
    app_limits.clear()


@pytest.fixture(scope="module")
def metrics():
    s = MetricsServer({"/metrics": vllm_exposition({"0": EngineState(usage=0.2, running=1, waiting=0)})})
    yield s
    s.close()


def live(params: dict[str, str]):
    return open_page_with(PAGE, params, timeout=60)


def rerun_until(at, done, tries=40):
    for _ in range(tries):
        at.run()
        assert not at.exception, at.exception
        if done(at):
            return
        time.sleep(0.1)
    raise AssertionError("the page never showed it")


def test_lookup_counts_the_leading_blocks_the_server_announced(metrics):
    hashes = vllm_block_hashes(PROMPT, 16)
    pub = FakeVllmPublisher()
    try:
        at = live(
            {
                "metrics": metrics.url(),
                "events": pub.endpoint,
                "replay": pub.replay_endpoint,
                "watch": "0",
                "lookup": ", ".join(map(str, PROMPT[:90])),
                "lookup_as": "token ids",
            }
        )
        pub.wait_subscribed()
        pub.publish([BlockStored(hashes[:4], None, PROMPT[:64], 16, None, "GPU", None)])
        pub.publish([BlockStored(hashes[:2], None, PROMPT[:32], 16, None, "CPU", None)])
        sentence = (
            "rank 0 (GPU, group 0) caches the first 4 of the prompt's 5 full blocks: 64 of its 90 tokens"
        )
        rerun_until(at, lambda at: any(sentence in m.value for m in at.markdown))
        table = next(d.value for d in at.dataframe if "leading blocks cached" in d.value.columns)
        assert table[["group · medium", "leading blocks cached"]].values.tolist() == [
            ["0 · CPU", 2],
            ["0 · GPU", 4],
        ]
        # the server's /detokenize is not there (the metrics stub): labels fall back to hashes, said once
        assert any("labelled by hash" in c.value for c in at.caption)
        at.query_params["lookup"] = "hello"
        at.query_params["lookup_as"] = "text"
        at.run()  # text goes to the server's /tokenize, which the stub does not serve: a message, no traceback
        assert not at.exception and any("cannot be looked up" in e.value for e in at.error)
    finally:
        pub.close()


def test_bind_toggle_and_a_silent_pub_socket_is_explained(metrics, monkeypatch):
    from core.live.subscriber import KVEventSubscriber

    monkeypatch.setattr(KVEventSubscriber, "SILENT_PROBE_S", 0.0)
    pub = FakeVllmPublisher()
    try:
        at = live(
            {"metrics": metrics.url(), "events": pub.endpoint, "replay": pub.replay_endpoint, "watch": "0"}
        )
        pub.wait_subscribed()
        pub.publish([BlockStored([1, 2], None, list(range(8)), 4, None, "GPU", None)], send=False)
        rerun_until(at, lambda at: any("PUB socket is silent" in w.value for w in at.warning))
        assert at.dataframe[0].value["cached blocks"].iloc[0] == 2  # kept from the replay meanwhile
    finally:
        pub.close()
    port = free_port()
    at = live(
        {"metrics": metrics.url(), "events": f"tcp://127.0.0.1:{port}", "events_bind": "1", "watch": "0"}
    )
    assert at.dataframe[0].value["endpoint"].iloc[0] == f"tcp://127.0.0.1:{port} (bound here)"
    assert at.query_params["events_bind"] == ["1"] or at.query_params["events_bind"] == "1"
