"""A real Chromium on the Live page pointed at the real vLLM (its CPU build serving SmolLM2 as "smollm2", a name no
planner preset has): the page plans the server from the config.json its /v1/models names, with no preset refusal:
planned vs observed latency, and the planner's blocks in the server's own KV space beside its override."""

import threading
import urllib.parse

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS

expect.set_options(timeout=240_000)  # the server, its load, the page and the fit share two cores


@pytest.mark.browser
def test_live_page_plans_the_real_vllm(real_vllm, streamlit_server, page):
    stop = threading.Event()

    def load(worker: int) -> None:
        i = 0
        while not stop.is_set():
            prompt = [100 + worker * 1000 + 7 * i + j for j in range(24 + 8 * (i % 3))]
            real_vllm.complete(prompt, max_tokens=4 + 4 * (i % 3))
            i += 1

    senders = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(2)]
    for sender in senders:
        sender.start()
    try:
        query = urllib.parse.urlencode(
            {"metrics": f"{real_vllm.url}/metrics", "every": "2", "pvo_window": "600"}
        )
        page.goto(f"{streamlit_server}/live?{query}")
        expect(page.get_by_role("heading", name="Predicted against observed")).to_be_visible()
        expect(page.get_by_text("--num-gpu-blocks-override 128")).to_be_visible()
        expect(page.get_by_role("heading", name="Planned vs observed latency")).to_be_visible()
        caption = page.get_by_text("Planned with smollm2 (bfloat16,")
        expect(caption).to_be_visible()
        expect(caption).to_contain_text("on this machine's CPU")
        assert page.get_by_text("not a planner preset").count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(ARTIFACTS / "live_real_vllm.png"), full_page=True)
    finally:
        page.screenshot(path=str(ARTIFACTS / "live_real_vllm_last.png"), full_page=True)
        stop.set()
        for sender in senders:
            sender.join(60)
