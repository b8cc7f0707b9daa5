"""A real Chromium asks the Live page where a prompt is cached on a running `core.serve --model tiny` (vLLM's block
hashes on its KV events): the prompt sent before is found, block for block (a prompt never sent is checked in
tests/live/test_prompt_lookup.py)."""

import urllib.parse

import pytest
from playwright.sync_api import expect

from core.serve.launcher import LoopbackServer
from tests.conftest import ARTIFACTS

expect.set_options(timeout=180_000)

SENT = [*range(1, 81), 7, 8, 9]  # 83 tokens: 5 full blocks of 16


@pytest.mark.browser
def test_live_page_finds_a_prompt_sent_before(streamlit_server, page):
    server = LoopbackServer("tiny", num_blocks=256)
    try:
        base = {
            "metrics": f"{server.url}/metrics",
            "events": f"tcp://127.0.0.1:{server.events_port}",
            "replay": f"tcp://127.0.0.1:{server.replay_port}",
            "every": "3",
            "lookup_as": "token ids",
        }
        status, _ = server.post("/v1/completions", {"prompt": SENT, "max_tokens": 2})
        assert status == 200  # before the page subscribes: the replay buffer brings its blocks
        query = urllib.parse.urlencode({**base, "lookup": " ".join(map(str, SENT))})
        page.goto(f"{streamlit_server}/live?{query}")
        expect(page.get_by_text("Where is my prompt cached").first).to_be_visible()
        expect(
            page.get_by_text("caches the first 5 of the prompt's 5 full blocks: 80 of its 83 tokens")
        ).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "live_prompt_lookup.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        server.stop()
