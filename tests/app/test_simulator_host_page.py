"""The Simulator page with a host KV tier under AppTest: the per-tier chart is drawn, bad values are one plain
error each."""

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import open_page_with

PAGE = "app_pages/simulator.py"
SMALL = {
    "num_requests": "120",
    "rate": "1",
    "prefix_len": "512",
    "prefix_fraction": "0.3",
    "capacity": "raw",
    "raw_capacity": "4096",
    "prefix_caching": "1",
    "policies": "paged,orca-oracle",
}


def open_simulator(**params) -> AppTest:
    return open_page_with(PAGE, params, timeout=180)


def test_a_host_tier_draws_the_prompt_tokens_by_tier():
    at = open_simulator(**SMALL, kv_offload_gib="4", offload_policy="arc")
    assert not at.error
    assert "Two KV tiers: HBM and host memory" in [h.value for h in at.subheader]
    text = next(m.value for m in at.markdown if m.value.startswith("The paged pool's prompts"))
    assert "from the 4 GiB host tier (5,232 tokens, ARC)" in text  # 4 GiB / 13,107,200 B = 327 blocks of 16
    assert at.query_params["kv_offload_gib"] == "4" and at.query_params["offload_policy"] == "arc"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kv_offload_gib": "-2"}, "`kv_offload_gib` (host KV tier, GiB) = '-2' ignored: must be at least 0"),
        (
            {"kv_offload_gib": "nan"},
            "`kv_offload_gib` (host KV tier, GiB) = 'nan' ignored: expected a finite",
        ),
        (
            {"kv_offload_gib": "4", "prefix_caching": "0"},
            "Cannot simulate: a host KV tier needs prefix caching",
        ),
    ],
)
def test_each_bad_host_tier_value_is_one_plain_error(params, message):
    at = open_simulator(**{**SMALL, **params})
    assert len(at.error) == 1 and message in at.error[0].value
