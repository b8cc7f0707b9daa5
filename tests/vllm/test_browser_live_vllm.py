"""A real Chromium on the Live page pointed at the real vLLM (its CPU build serving SmolLM2 as "smollm2", a name no
planner preset has): the page plans the server from the config.json its /v1/models names, with no preset refusal:
planned vs observed latency, and the planner's blocks in the server's own KV space beside its override. The page
binds the events socket vLLM connects to, finds a text prompt sent before (tokenized by vLLM's /tokenize) in the
prompt lookup, and labels the cached-block tree's prefixes with vLLM's /detokenize of their tokens."""

import threading
import time
import urllib.parse

import pytest
import zmq
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS

expect.set_options(timeout=240_000)  # the server, its load, the page and the fit share two cores
TEXT = (
    "Paged attention keeps the KV cache in fixed-size blocks, so requests that share a system prompt share its "
    "blocks and skip its prefill. "
) * 3


@pytest.mark.browser
def test_live_page_plans_the_real_vllm(real_vllm, streamlit_server, page):
    stop = threading.Event()

    def load(worker: int) -> None:
        i = 0
        while not stop.is_set():
            if worker == 0 and i % 10 == 0:  # the prompt to look up; the first may precede vLLM's connection
                real_vllm.complete(TEXT, max_tokens=1)
            prompt = [100 + worker * 1000 + 7 * i + j for j in range(24 + 8 * (i % 3))]
            real_vllm.complete(prompt, max_tokens=2 + 2 * (i % 3))  # short: the plan waits for 20 to finish
            i += 1

    senders = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(4)]
    try:
        watched = {
            "metrics": f"{real_vllm.url}/metrics",
            "every": "2",
            "pvo_window": "600",
            "dtype": real_vllm.dtype,  # the server's --dtype, which its /metrics do not say
        }
        events = {
            "events": real_vllm.events_endpoint,
            "events_bind": "1",
            "replay": real_vllm.replay_endpoint,
            "topic": real_vllm.topic,
            "lookup": TEXT,
            "lookup_as": "text",
        }
        page.goto(f"{streamlit_server}/live?{urllib.parse.urlencode(watched | events)}")
        expect(page.get_by_role("heading", name="Predicted against observed")).to_be_visible()
        # The page has polled the server once: the load starts now. The window it plans begins at that poll (what
        # finished before it counts for nothing), and senders started with the page kept vLLM busy on one of the
        # two cores while the page imported and drew.
        for sender in senders:
            sender.start()
        expect(
            page.get_by_text(f"--num-gpu-blocks-override {real_vllm.num_gpu_blocks_override}")
        ).to_be_visible()
        expect(page.get_by_role("heading", name="Planned vs observed latency")).to_be_visible()
        caption = page.get_by_text(f"Planned with smollm2 ({real_vllm.dtype},")
        expect(caption).to_be_visible()
        expect(caption).to_contain_text("on this machine's CPU")
        blocks = len(real_vllm.post("/tokenize", {"model": real_vllm.model, "prompt": TEXT})["tokens"]) // 32
        expect(page.get_by_text(f"caches the first {blocks} of the prompt's {blocks} full")).to_be_visible()
        chart_text = page.locator('[data-testid="stPlotlyChart"] text', has_text="Paged attention keeps")
        expect(chart_text.first).to_be_visible()
        assert page.get_by_text("not a planner preset").count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(ARTIFACTS / "live_real_vllm.png"), full_page=True)
    finally:
        page.screenshot(path=str(ARTIFACTS / "live_real_vllm_last.png"), full_page=True)
        stop.set()
        # the session keeps its bound socket until the server drops it: switching the page to connect closes it
        # here (a reload would start a new session and leave the old one's socket bound), so the next test can
        # bind vLLM's endpoint
        page.get_by_text("Bind the events socket here (vLLM connects)").click()
        _wait_until_bindable(real_vllm.events_endpoint, timeout_s=120)
        for sender in senders:
            if sender.ident is not None:
                sender.join(60)


def _wait_until_bindable(endpoint: str, timeout_s: float) -> None:
    """Until this process can bind `endpoint` (the page released it); fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = zmq.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
        finally:
            sock.close()
