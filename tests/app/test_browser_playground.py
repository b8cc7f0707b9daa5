"""A real browser: Debian's Chromium, driven by Playwright, against `streamlit run app.py` on 127.0.0.1."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS, wait_for_script_done

pytestmark = pytest.mark.browser
FIRST_RUN_MS = 60_000  # a fresh server's first run imports torch: seconds on a busy machine
STEP_MS = 30_000  # one rerun (a replay, three figures) on a busy 2-core machine


def free_blocks(page):
    """The first metric's value (the free-block count): a locator to wait on with `expect(...).to_have_text`."""
    return page.locator('[data-testid="stMetric"]').first.locator('[data-testid="stMetricValue"]')


def test_append_and_fork_in_a_real_browser(streamlit_server, page):
    page.set_viewport_size({"width": 1500, "height": 1000})
    page.goto(streamlit_server)
    expect(page.get_by_text("Block manager playground").first).to_be_visible(timeout=FIRST_RUN_MS)
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible(timeout=FIRST_RUN_MS)
    expect(free_blocks(page)).to_have_text("37 / 48", timeout=STEP_MS)
    # the picture comes first: the block pool starts within the first 1,000 px screen
    heatmap = page.locator('[data-testid="stPlotlyChart"]').first
    expect(heatmap).to_contain_text("Physical blocks")
    box = heatmap.bounding_box()
    assert box is not None and box["y"] < 1000, box

    page.get_by_label("Tokens to append").fill("40")  # s0 holds 73 tokens: 40 more = 113 = 8 blocks (+3)
    page.get_by_label("Tokens to append").press("Enter")
    wait_for_script_done(page, STEP_MS)
    page.get_by_role("button", name="Append").click()
    expect(free_blocks(page)).to_have_text("34 / 48", timeout=STEP_MS)

    wait_for_script_done(page, STEP_MS)
    page.get_by_role("button", name="Fork").click()  # sharing takes no block; a new sequence appears
    expect(page.get_by_text("Last action: fork s0 → s3: done")).to_be_visible(timeout=STEP_MS)
    expect(free_blocks(page)).to_have_text("34 / 48", timeout=STEP_MS)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)


def test_a_scenario_link_steps_and_plays_in_a_real_browser(streamlit_server, page):
    page.set_viewport_size({"width": 1500, "height": 1000})
    page.goto(f"{streamlit_server}/?scenario=seed-demo&step=1")
    expect(page.get_by_text("Step 1 of 3.")).to_be_visible(timeout=FIRST_RUN_MS)
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible(timeout=FIRST_RUN_MS)
    expect(page.locator('[data-testid="stMetricValue"]').first).to_have_text(
        "6 / 8", timeout=STEP_MS
    )  # 24 tokens: 2 blocks
    wait_for_script_done(
        page, STEP_MS
    )  # the layout is read once the run has drawn everything above the chart
    chart = page.locator('[data-testid="stPlotlyChart"]').first
    page.wait_for_function(  # a scenario, too, opens on the pool: the chart's top within the first screen
        "el => el.getBoundingClientRect().top + window.scrollY < 1000",
        arg=chart.element_handle(),
        timeout=STEP_MS,
    )
    expect(page.get_by_text("Free blocks: 6")).to_be_visible(
        timeout=STEP_MS
    )  # the C++ status lines beside our metrics

    page.get_by_role("button", name="Next", exact=True).click()
    expect(page.get_by_text("Step 2 of 3.")).to_be_visible(timeout=STEP_MS)
    expect(page.locator('[data-testid="stMetricValue"]').first).to_have_text("5 / 8", timeout=STEP_MS)
    page.wait_for_url("**step=2**", timeout=STEP_MS)

    wait_for_script_done(page, STEP_MS)
    page.get_by_role("button", name="Back", exact=True).click()
    expect(page.get_by_text("Step 1 of 3.")).to_be_visible(timeout=STEP_MS)
    wait_for_script_done(page, STEP_MS)
    page.get_by_role("button", name="Play", exact=True).click()  # one step per rerun, up to the last
    expect(page.get_by_text("Step 3 of 3.")).to_be_visible(timeout=30_000)
    expect(page.locator('[data-testid="stMetricValue"]').first).to_have_text("7 / 8", timeout=STEP_MS)
    page.wait_for_url("**step=3**", timeout=STEP_MS)

    wait_for_script_done(page, STEP_MS)
    page.get_by_role("button", name="Continue by hand from this step").click()
    expect(page.get_by_text("Last action: free 1: done")).to_be_visible(timeout=STEP_MS)
    # until the run ends, the scenario view's stale "Add sequence" shows beside the new one
    wait_for_script_done(page, STEP_MS)
    add = page.get_by_role("button", name="Add sequence")
    expect(add).to_have_count(1, timeout=STEP_MS)
    add.click()  # 37 tokens = 3 blocks of 16
    expect(page.locator('[data-testid="stMetricValue"]').first).to_have_text("4 / 8", timeout=STEP_MS)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground_scenario.png"), full_page=True)
