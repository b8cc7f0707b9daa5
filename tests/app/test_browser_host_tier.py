"""A real browser (Debian's Chromium, Playwright) draws both KV tiers: the Playground's HBM grid beside the host
tier's, with blocks come up from the tier marked, and the Simulator's prompt tokens by tier."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.browser
FIRST_RUN_MS = 60_000  # a fresh server's first run imports torch: seconds on a busy machine
RUN_MS = 90_000  # a simulation of 120 requests under two policies on a busy 2-core machine


def test_playground_and_simulator_draw_both_tiers(streamlit_server, page):
    page.set_viewport_size({"width": 1500, "height": 1100})
    page.goto(f"{streamlit_server}/?host_blocks=64&host_block=32&host_policy=arc")
    expect(page.get_by_text("HBM (left) and the host tier (right).")).to_be_visible(timeout=FIRST_RUN_MS)
    charts = page.locator('[data-testid="stPlotlyChart"]')
    expect(charts.nth(0)).to_contain_text("HBM blocks", timeout=FIRST_RUN_MS)
    expect(charts.nth(1)).to_contain_text("Host tier (64 × 32 tokens, ARC)", timeout=FIRST_RUN_MS)
    expect(charts.nth(1)).to_contain_text("holding KV (27 in all)")  # the legend
    expect(charts.nth(1)).to_contain_text("↑ loaded by the last action")
    expect(
        charts.nth(0).locator("text", has_text="↑").first
    ).to_be_visible()  # a GPU block the hit came up into
    expect(charts.nth(1).locator("text", has_text="↑").first).to_be_visible()  # the host block it came from
    hbm, host = charts.nth(0).bounding_box(), charts.nth(1).bounding_box()
    assert hbm and host and host["x"] > hbm["x"] + hbm["width"] / 2, (hbm, host)  # side by side
    expect(page.get_by_text("Host tier: 32 prompt tokens loaded from it")).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-host-tier.png"), full_page=True)

    query = (
        "num_requests=120&rate=1&prefix_len=512&prefix_fraction=0.3&capacity=raw&raw_capacity=4096"
        "&prefix_caching=1&policies=paged,orca-oracle&kv_offload_gib=4&offload_policy=lru"
    )
    page.goto(f"{streamlit_server}/simulator?{query}")
    expect(page.get_by_text("Two KV tiers: HBM and host memory")).to_be_visible(timeout=RUN_MS)
    chart = page.locator('[data-testid="stPlotlyChart"]', has_text="Prompt tokens by KV tier (paged)")
    expect(chart).to_contain_text("loaded from the host tier", timeout=RUN_MS)
    expect(chart).to_contain_text("simulated time (s)")
    expect(chart).to_contain_text("prompt tokens, cumulative")
    expect(page.get_by_text("(5,232 tokens, LRU)")).to_be_visible()
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "simulator-host-tier.png"), full_page=True)
