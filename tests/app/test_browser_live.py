"""A real Chromium watches a running `core.serve --model tiny` on the Live page: requests flow, the page polls and
draws its metrics and the cached-block tree from its KV events."""

import threading
import urllib.parse

import pytest
from playwright.sync_api import expect

from core.serve.launcher import LoopbackServer
from tests.conftest import ARTIFACTS

expect.set_options(timeout=180_000)  # a loaded CI machine: the server, its load and the page share the CPU


@pytest.mark.browser
def test_live_page_watches_core_serve(streamlit_server, page):
    server = LoopbackServer("tiny", num_blocks=256)
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            prompt = [*range(1, 33), 100 + i % 7, 7]
            server.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "ignore_eos": True})
            i += 1

    sender = threading.Thread(target=load, daemon=True)
    sender.start()
    try:
        query = urllib.parse.urlencode(
            {
                "metrics": f"{server.url}/metrics",
                "events": f"tcp://127.0.0.1:{server.events_port}",
                "replay": f"tcp://127.0.0.1:{server.replay_port}",
                "every": "5",
                "model": "llama-3.1-8b",
            }
        )
        page.goto(f"{streamlit_server}/live?{query}")
        blocks = page.locator('[data-testid="stMetric"]').filter(has_text="KV blocks (num_gpu_blocks)")
        expect(blocks).to_contain_text("256")
        expect(page.get_by_text("Cached blocks (KV cache events)")).to_be_visible()
        # the icicle appears once the polled events hold blocks; usage, requests, hit rate, preemptions,
        # latency, the tree, the plan comparison and planned vs observed (any served model now, its config read
        # from the server, not presets only) are all charts
        charts = page.locator('[data-testid="stPlotlyChart"]')
        expect(charts).to_have_count(8)
        expect(page.get_by_role("heading", name="Planned vs observed latency")).to_be_visible()
        expect(charts.nth(6).locator(".main-svg").first).to_be_visible()
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(ARTIFACTS / "live_core_serve.png"), full_page=True)
    finally:
        page.screenshot(path=str(ARTIFACTS / "live_core_serve_last.png"), full_page=True)
        stop.set()
        sender.join(30)
        server.stop()
