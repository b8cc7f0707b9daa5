"""The playground page's scenarios under AppTest: picker, Back / Next / Play, slider, URL, leaving the script."""

import pytest
from streamlit.testing.v1 import AppTest

from core.page_models.scenarios import SCENARIOS
from tests.conftest import open_app, open_page_with
from ui.playground.url import position_from_params


def open_with_url(**params) -> AppTest:
    return open_page_with(None, params)


def free_blocks_shown(at) -> int:
    return int(at.metric[0].value.split("/")[0].replace(",", ""))


def narration(at) -> str:
    return at.info[0].value


def test_pick_a_scenario_and_step_through_it():
    at = open_app("app_pages/playground.py")
    assert free_blocks_shown(at) == 37  # free play opens on the demo scene, as before
    at.selectbox(key="pg_scenario").set_value("seed-demo").run()
    assert not at.exception
    assert free_blocks_shown(at) == 8 and narration(at).startswith("**Step 0 of 3.**")
    assert at.code[0].value == "Total blocks: 8\nFree blocks: 8\nActive sequences: 0"
    assert dict(at.query_params) == {"scenario": "seed-demo", "step": "0"}
    # no block table yet: a sentence, not an empty table (the one table left is the action history)
    assert len(at.dataframe) == 1 and any(
        c.value.startswith("No sequence holds blocks yet") for c in at.caption
    )
    # hand-worked: 24 tokens = 2 blocks, 16 = 1, free seq 1
    for step, free, live in ((1, 6, 1), (2, 5, 2), (3, 7, 1)):
        at.button(key="pg_next").click().run()
        assert not at.exception
        assert free_blocks_shown(at) == free
        assert narration(at).startswith(f"**Step {step} of 3.**")
        assert f"Free blocks: {free}" in at.code[0].value
        assert at.query_params["step"] == str(step)
        assert len(at.get("plotly_chart")) == 3
        assert len(at.dataframe[0].value) == live  # the block tables: one row per live sequence
    assert at.button(key="pg_next").disabled
    at.button(key="pg_back").click().run()
    assert free_blocks_shown(at) == 5 and at.slider(key="pg_step").value == 2
    assert at.code[0].value == "Total blocks: 8\nFree blocks: 5\nActive sequences: 2"  # what the C++ prints
    at.slider(key="pg_step").set_value(1).run()
    assert free_blocks_shown(at) == 6 and at.query_params["step"] == "1"
    assert not at.exception


def test_a_link_opens_a_scenario_at_a_step():
    at = open_with_url(scenario="seed-bugs", step="4")
    assert at.selectbox(key="pg_scenario").value == "seed-bugs"
    assert free_blocks_shown(at) == 0
    assert "refused, as the script expects: out of KV blocks" in at.warning[0].value
    assert not at.error
    at = open_with_url(scenario="seed-bugs", step="7")
    assert "live sequences: ['1', '2']" in at.warning[0].value
    assert free_blocks_shown(at) == 5


@pytest.mark.parametrize(
    ("params", "expected", "message"),
    [
        ({"scenario": "nope", "step": "2"}, ("free", 0), "unknown value"),
        ({"scenario": "seed-demo", "step": "99"}, ("seed-demo", 3), "past the last step"),
        ({"scenario": "seed-demo", "step": "-1"}, ("seed-demo", 0), "at least 0"),
        ({"scenario": "seed-demo", "step": "two"}, ("seed-demo", 0), "whole number"),
    ],
)
def test_bad_url_values_are_refused_with_the_reason(params, expected, message):
    assert position_from_params(params)[:2] == expected
    at = open_with_url(**params)
    assert message in at.error[0].value
    assert at.selectbox(key="pg_scenario").value == expected[0]
    if expected[0] != "free":
        assert at.slider(key="pg_step").value == expected[1]
        fixed = {"scenario": expected[0], "step": str(expected[1])}
        assert dict(at.query_params) == fixed  # the URL now holds what is shown
    else:
        assert free_blocks_shown(at) == 37 and "scenario" not in at.query_params


def test_play_runs_to_the_last_step_and_stops():
    at = open_with_url(scenario="seed-demo", step="1")
    at.button(key="pg_play").click().run()  # one step per rerun, a short pause between
    assert not at.exception
    assert at.slider(key="pg_step").value == 3 and free_blocks_shown(at) == 7
    assert at.button(key="pg_play").label == "Play"


def test_leave_the_script_and_go_on_by_hand():
    at = open_with_url(scenario="parallel-sampling", step="2")  # 4 samples share blocks 0, 1, 2
    assert free_blocks_shown(at) == 13
    at.selectbox(key="target").set_value("s3").run()
    at.button(key="append").click().run()  # leaves the script: s3's first token copies block 2
    assert not at.exception
    assert at.selectbox(key="pg_scenario").value == "free"
    assert "scenario" not in at.query_params
    assert free_blocks_shown(at) == 12
    assert "copy-on-write of block 2" in at.caption[0].value
    at.button(key="add").click().run()  # 37 tokens = 3 more blocks, named after the script's s0..s3
    assert free_blocks_shown(at) == 9
    assert "add s4" in at.caption[0].value
    # the script itself is untouched: going back to it shows step 0 of a fresh replay
    at.selectbox(key="pg_scenario").set_value("parallel-sampling").run()
    assert free_blocks_shown(at) == 16


def test_take_over_button_keeps_the_pool_of_that_step():
    at = open_with_url(scenario="prefix-caching", step="4")  # all free, blocks 0 and 1 cached
    at.button(key="pg_take_over").click().run()
    assert not at.exception
    assert at.selectbox(key="pg_scenario").value == "free"
    assert free_blocks_shown(at) == 8
    at.number_input(key="prompt_len").set_value(40).run()
    at.button(key="add").click().run()  # the system prompt's cached blocks are revived
    assert "2 prefix blocks from cache" in at.caption[0].value
    assert free_blocks_shown(at) == 5


def test_every_scenario_step_renders_without_error():
    at = open_app("app_pages/playground.py")
    for key, scenario in SCENARIOS.items():
        at.selectbox(key="pg_scenario").set_value(key).run()
        for step in range(scenario.num_steps + 1):
            at.slider(key="pg_step").set_value(step).run()
            assert not at.exception, (key, step)
            assert not at.error, (key, step)
            assert narration(at).startswith(f"**Step {step} of {scenario.num_steps}.**")


def test_a_sliding_window_pool_from_the_settings():
    at = open_app("app_pages/playground.py")
    at.number_input(key="cfg_blocks").set_value(8)  # form values are sent with the submit click
    at.number_input(key="cfg_window").set_value(16)
    at.checkbox(key="cfg_demo").uncheck()
    next(b for b in at.button if b.label == "Apply and reset pool").click().run()
    assert not at.exception and free_blocks_shown(at) == 8
    at.number_input(key="prompt_len").set_value(32).run()
    at.button(key="add").click().run()  # 32 tokens = blocks 0 and 1
    at.number_input(key="append_count").set_value(17).run()
    at.button(key="append").click().run()  # 49 tokens; token 48 reads 33..48: blocks 0 and 1 released
    assert not at.exception
    assert free_blocks_shown(at) == 8 - 2  # held: block 2 (full) and block 3 (1 token)
    assert "0→· 1→· 2→2 3→3" in at.dataframe[0].value["block table"].tolist()
