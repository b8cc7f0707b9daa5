"""A real Chromium runs the Engine page: the tiny-model generation draws, then a beam-search run replaces it; on
the real model, a chat turn at 1500 x 1000 with the block heatmap in the first screen and its title clear of its
x-axis title."""

import pytest
from playwright.sync_api import expect

from tests.conftest import ARTIFACTS, fill_form_number, wait_for_script_done
from tests.real_model import real_model_path

expect.set_options(timeout=120_000)  # the first run also builds the C kernel
TURN_MS = 180_000  # one chat turn of the real model, with its 4 samples
# A chart's top and height and its title's and x-axis title's edges, in page coordinates (px from the top of the
# page: a viewport position plus what the window and every scrolling container above it have scrolled), read at once
LAYOUT_JS = """chart => {
    const top = element => {
        let scrolled = window.scrollY;
        for (let above = element.parentElement; above; above = above.parentElement) scrolled += above.scrollTop;
        return element.getBoundingClientRect().top + scrolled;
    };
    const title = chart.querySelector('.gtitle'), axisTitle = chart.querySelector('.xtitle');
    return {chart_top: top(chart), chart_height: chart.getBoundingClientRect().height,
            title_bottom: top(title) + title.getBoundingClientRect().height, axis_title_top: top(axisTitle)};
}"""


@pytest.mark.browser
def test_engine_page_runs_a_tiny_generation(streamlit_server, page):
    page.goto(f"{streamlit_server}/engine?source=tiny")
    tokens = page.locator('[data-testid="stMetric"]').filter(has_text="Tokens generated")
    expect(tokens).to_contain_text("384")  # 3 prompts x n = 4 samples x 32 tokens
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').first).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "engine_default.png"), full_page=True)

    wait_for_script_done(page, 120_000)
    fill_form_number(page, "Parallel samples (n)", "1")
    fill_form_number(page, "Beam width (> 1: beam search, n must be 1)", "2")
    fill_form_number(page, "New tokens per output (max_tokens)", "6")
    page.get_by_role("button", name="Generate").click()
    # 3 prompts x 2 beams x 6 tokens
    expect(tokens).to_contain_text("36")
    expect(page.locator('[data-testid="stPlotlyChart"] .main-svg').nth(3)).to_be_visible()
    wait_for_script_done(page, 120_000)  # an error drawn later in this run would be missed by an early count
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    expect(page.locator('[data-testid="stAlertContentError"]')).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "engine_beam_search.png"), full_page=True)


@pytest.mark.browser
def test_a_chat_turn_on_the_real_model_with_the_heatmap_in_the_first_screen(streamlit_server, browser):
    real_model_path()
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{streamlit_server}/engine")
        messages = page.locator('[data-testid="stChatMessage"]')
        # The whole test took 25 s in a full suite run, 52 s alone and cold, on a shared 2-core machine: each wait is
        # bounded at 180 s, so a hung model fails this test in minutes instead of holding CI for 30 (3 x 600 s).
        expect(messages).to_have_count(2, timeout=TURN_MS)  # the default question and its 4 samples
        expect(messages.nth(1)).to_contain_text("sample 4:")
        # measure once the run is over: while the script still runs, Streamlit may redraw the chart
        wait_for_script_done(page, TURN_MS)
        # the heatmap by its title, not as the first chart: a rerun replaces it for a moment with its placeholder
        # (`st.empty`), and a full run once measured the attention-time chart below it instead
        heatmap = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="Physical blocks after step")
        expect(heatmap).to_have_count(1)
        expect(heatmap.locator(".main-svg").first).to_be_visible()
        expect(heatmap.locator(".xtitle")).to_be_visible()
        # One reading of the layout, in page coordinates: the chat scrolls itself to its end while the page runs,
        # so two boxes read one after the other in viewport coordinates may straddle a scroll (a full run read the
        # title 86 px lower than the axis title that way), and a viewport position says nothing of the first screen.
        layout = heatmap.evaluate(LAYOUT_JS)
        # the main chart is in the first screen
        assert layout["chart_top"] + layout["chart_height"] / 2 < 1000, layout
        assert layout["title_bottom"] <= layout["axis_title_top"], layout  # no overlap
        page.screenshot(path=str(ARTIFACTS / "engine_chat_first_screen.png"))

        chat = page.get_by_test_id("stChatInputTextArea")
        chat.fill("Name three primary colors.")
        chat.press("Enter")
        expect(messages).to_have_count(4, timeout=TURN_MS)
        expect(messages.nth(2)).to_contain_text("Name three primary colors.")
        expect(messages.nth(3)).to_contain_text("sample 4:", timeout=TURN_MS)
        page.wait_for_url("**q=Name+three+primary+colors.**", timeout=60_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(ARTIFACTS / "engine_chat.png"), full_page=True)
    finally:
        context.close()
