"""The playground page with a host tier under AppTest: the URL builds it, both grids are drawn, and every bad
value is one plain error."""

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import open_page_with


def open_with_url(**params) -> AppTest:
    return open_page_with(None, params)


def test_a_link_puts_a_host_tier_behind_the_pool_and_both_grids_are_drawn():
    at = open_with_url(host_blocks="64", host_block="32", host_policy="arc")
    assert not at.error
    charts = at.get("plotly_chart")
    assert len(charts) == 4  # HBM grid, host grid, and the two history charts
    assert "2 GPU blocks loaded" in at.markdown[1].value  # the demo's last action: the prompt came back up
    host_caption = next(c.value for c in at.caption if c.value.startswith("Host tier:"))
    # hand-worked (tests/page_models/test_playground_host_tier.py): 32 tokens loaded; 27 host blocks of 32 tokens
    assert host_caption.startswith("Host tier: 32 prompt tokens loaded from it; 27 of 64 host blocks hold KV")
    assert dict(at.query_params) == {"host_blocks": "64", "host_block": "32", "host_policy": "arc"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"host_blocks": "-4"},
            "`host_blocks` (host tier size (host blocks)) = '-4' ignored: must be at least 0",
        ),
        ({"host_blocks": "nan"}, "`host_blocks` (host tier size (host blocks)) = 'nan' ignored"),
        ({"host_blocks": "64", "host_block": "24"}, "must be a multiple of the GPU block size 16, got 24"),
        ({"host_blocks": "64", "host_policy": "fifo"}, "`host_policy` (host tier eviction) = 'fifo' ignored"),
    ],
)
def test_each_bad_url_value_is_one_plain_error(params, message):
    at = open_with_url(**params)
    assert len(at.error) == 1 and message in at.error[0].value
    assert len(at.get("plotly_chart")) == (
        4 if "host_policy" in params else 3
    )  # a bad policy keeps LRU's tier


def test_settings_refuse_a_host_block_that_is_not_a_multiple_of_the_gpu_block():
    at = open_with_url()
    at.toggle(key="cfg_caching").set_value(True)
    at.number_input(key="cfg_host_blocks").set_value(16)
    at.number_input(key="cfg_host_block").set_value(24)
    at.button(key="FormSubmitter:pool-Apply and reset pool").click().run()
    assert len(at.error) == 1
    assert at.error[0].value.startswith("Settings not applied: the host block size must be a multiple")
    at.number_input(key="cfg_host_block").set_value(32)
    at.button(key="FormSubmitter:pool-Apply and reset pool").click().run()
    assert not at.error and len(at.get("plotly_chart")) == 4
    assert at.query_params["host_blocks"] == "16" and at.query_params["host_block"] == "32"
