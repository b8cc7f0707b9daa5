"""The Simulator page model's host tier: vLLM's capacity arithmetic by hand, one plain error per bad value, and
a run where prefixes that left HBM come back from the host tier (paged only)."""

import math
from dataclasses import replace

import pytest

from core.errors import InvalidArgumentError
from core.page_models.simulator import SimulatorParams, run_comparison

RUN = SimulatorParams(
    num_requests=120,
    rate=1.0,
    prefix_len=512,
    prefix_fraction=0.3,
    capacity_source="raw",
    raw_capacity_tokens=4096,
    enable_prefix_caching=True,
    policies=("paged", "orca-oracle"),
)


def test_host_tier_capacity_is_vllms_arithmetic_by_hand():
    # OPT-13B: 2 (K, V) x 40 layers x 5,120 x 2 bytes = 819,200 B a token; a 16-token block is 13,107,200 B
    # (a multiple of 4,096); 2 GiB = 2,147,483,648 B hold 163 whole blocks = 2,608 tokens
    offload = replace(RUN, kv_offload_gib=2.0).config().offload
    assert offload.host_capacity_tokens == 2_608 and offload.policy == "lru"
    assert replace(RUN, kv_offload_gib=0.0).config().offload is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kv_offload_gib": -1.0}, r"between 0 and .*, got -1.0"),
        ({"kv_offload_gib": math.nan}, "host KV tier"),
        ({"kv_offload_gib": math.inf}, "host KV tier"),
        ({"kv_offload_gib": 2.0, "offload_policy": "fifo"}, "lru, arc"),
        ({"kv_offload_gib": 2.0, "enable_prefix_caching": False}, "needs prefix caching"),
    ],
)
def test_bad_host_tier_values_are_one_plain_error(changes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        replace(RUN, **changes).config()


def test_prefixes_evicted_from_hbm_come_back_from_the_host_tier():
    without = run_comparison(RUN)["paged"].requests
    results = run_comparison(replace(RUN, kv_offload_gib=4.0))
    paged, orca = results["paged"].requests, results["orca-oracle"].requests
    assert int(without["host_hit_tokens"].sum()) == 0
    host = int(paged["host_hit_tokens"].sum())
    assert host > 0 and host % 16 == 0  # whole blocks
    # a request's hit is HBM's then the host tier's; on requests never preempted (a re-admission after a
    # preemption reloads its prompt + output from the tier, and host_hit_tokens then counts that reload) the
    # host share is part of the prefix hit, and here a 512-token system prompt that left HBM came back once
    first = paged[paged["preemptions"] == 0]
    assert (first["host_hit_tokens"] <= first["prefix_hit_tokens"]).all()
    assert int(first["host_hit_tokens"].sum()) == 512
    assert int(paged["prefix_hit_tokens"].sum()) > int(without["prefix_hit_tokens"].sum())
    assert int(orca["host_hit_tokens"].sum()) == 0  # the contiguous allocators run without a tier
