"""The Live page pointed at a running vLLM 0.32 (its CPU build) under AppTest: it binds the events socket vLLM
connects to, finds a prompt sent before (text tokenized by vLLM's /tokenize) and labels the tree's prefixes with
vLLM's /detokenize of the tokens its events carry."""

import json
import time

import pytest

PAGE = "app_pages/live.py"
TEXT = (
    "A paged KV cache hands out fixed-size blocks on demand, so requests that share a system prompt share its "
    "blocks and skip its prefill. "
) * 3


@pytest.fixture(autouse=True)
def loopback_hosts(monkeypatch, request):
    from ui.jobs import app_limits

    request.addfinalizer(app_limits.clear)
    monkeypatch.setenv("PAGED_LAB_LIVE_HOSTS", "127.0.0.1")
    app_limits.clear()


def test_live_page_finds_the_prompt_and_labels_the_tree(real_vllm):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.switch_page(PAGE)
    params = {
        "metrics": real_vllm.url + "/metrics",
        "events": real_vllm.events_endpoint,
        "events_bind": "1",
        "replay": real_vllm.replay_endpoint,
        "topic": real_vllm.topic,
        "watch": "0",
        "lookup": TEXT,
        "lookup_as": "text",
    }
    for key, value in params.items():
        at.query_params[key] = value
    try:
        _watch_and_check(at, real_vllm)
    finally:  # the page's socket is bound on vLLM's endpoint: free it for the next test (a session ends later)
        at.session_state["_live_watch"].close()


def _watch_and_check(at, real_vllm):
    at.run()
    assert not at.exception, at.exception
    deadline, sent = time.monotonic() + 180, 0
    while time.monotonic() < deadline:
        if (
            sent < 3
        ):  # the first may go out before vLLM's PUB connects to the page's socket: the replay fills in
            real_vllm.complete(TEXT, max_tokens=1)
            sent += 1
        at.run()
        assert not at.exception, at.exception
        found = [m.value for m in at.markdown if "caches the first" in m.value]
        labels = _tree_labels(at)
        if found and any(label.startswith("A paged KV") for label in labels):
            break
        time.sleep(1)
    blocks = len(real_vllm.post("/tokenize", {"model": real_vllm.model, "prompt": TEXT})["tokens"]) // 32
    assert (
        found and f"rank 0 (GPU, group 0) caches the first {blocks} of the prompt's {blocks} full" in found[0]
    )
    table = at.dataframe[0].value
    assert (
        table["endpoint"].iloc[0].endswith("(bound here)") and table["cached blocks"].iloc[0] >= blocks >= 2
    )
    assert any(label.startswith("A paged KV") for label in labels), labels[:10]
    assert not any("PUB socket is silent" in w.value for w in at.warning)


def _tree_labels(at) -> list[str]:
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        for trace in spec.get("data", []):
            if trace.get("type") == "icicle":
                return list(trace.get("labels", []))
    return []
