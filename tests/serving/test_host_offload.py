"""The simulator's host KV tier (vLLM's native offloading) on a hand-worked schedule: a prefix evicted from HBM
is loaded from the host tier instead of prefilled, its bytes cross the link while another request's step runs
(vLLM overlaps the load with other requests' steps), and a slow link turns the gain into a loss."""

import math

import pytest

from core.errors import InvalidArgumentError
from core.planning.cost.step_model import StepTimeModel
from core.serving.host_offload import HostOffload
from core.serving.memory_policies import paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request

# 10 ms a step plus 2 ms a new token (1e9 FLOPs at half of 1e12 FLOP/s); 1,000 B of K/V a token
MODEL = StepTimeModel(0.0, 1000.0, 1e9, 0.0, 1e18, 1e12, overhead_s=0.010)
REQUESTS = [
    Request(0, 0.0, 64, 1, prefix_group=0, prefix_len=64),  # 4 blocks of 16, cached in HBM and the host tier
    Request(1, 1.0, 64, 1, prefix_group=1, prefix_len=64),  # 6-block pool: evicts blocks 3 and 2 of request 0
    Request(2, 2.0, 64, 1, prefix_group=0, prefix_len=64),  # blocks 0-1 from HBM, block 2 from the host
    Request(3, 2.0, 16, 1),  # a fresh prompt arriving with it
]


def run(offload):
    config = SimulatorConfig(kv_capacity_tokens=96, step_time=MODEL, offload=offload, watermark=0.0)
    return simulate(REQUESTS, paged(16, enable_prefix_caching=True), config).requests


def test_without_a_tier_the_evicted_blocks_are_prefilled_again():
    r = run(None)
    assert list(r["prefix_hit_tokens"]) == [0, 0, 32, 0] and list(r["host_hit_tokens"]) == [0, 0, 0, 0]
    # at t=2 one step prefills request 2's 32 missing tokens and request 3's 16: 10 + 48 x 2 ms
    assert r["first_token_time"][2] == pytest.approx(2.106) and r["first_token_time"][3] == pytest.approx(
        2.106
    )


def test_a_host_hit_is_loaded_while_another_request_runs():
    r = run(HostOffload(160, bandwidth_bytes_per_s=1.6e6))
    assert list(r["prefix_hit_tokens"]) == [0, 0, 48, 0] and list(r["host_hit_tokens"]) == [0, 0, 16, 0]
    # request 3 prefills alone (10 + 16 x 2 ms) while request 2's 16 tokens x 1,000 B cross at 1.6 MB/s (10 ms);
    # request 2 then prefills its last 16 tokens in the next step: 2.042 + 0.042
    assert r["first_token_time"][3] == pytest.approx(2.042)
    assert r["first_token_time"][2] == pytest.approx(2.084)


def test_a_link_slower_than_recomputing_is_a_loss():
    r = run(HostOffload(160, bandwidth_bytes_per_s=1.6e4))  # 16,000 B take 1 s
    assert r["host_hit_tokens"][2] == 16
    assert r["first_token_time"][2] == pytest.approx(3.042)  # load done at 3.0, then its 16-token step
    assert r["first_token_time"][2] - 2.0 > 0.106  # slower than prefilling again without a tier


def test_lru_and_arc_both_run_and_a_tier_needs_prefix_caching():
    assert run(HostOffload(160, "arc", 1.6e6))["host_hit_tokens"][2] == 16
    config = SimulatorConfig(kv_capacity_tokens=96, step_time=MODEL, offload=HostOffload(160))
    with pytest.raises(InvalidArgumentError, match="prefix caching"):
        simulate(REQUESTS, paged(16), config)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"host_capacity_tokens": -1}, "host_capacity_tokens must be at least 0"),
        ({"host_capacity_tokens": 16, "policy": "mru"}, "offload policy must be one of lru, arc"),
        ({"host_capacity_tokens": 16, "bandwidth_bytes_per_s": math.nan}, "must be a finite number"),
        ({"host_capacity_tokens": 16, "bandwidth_bytes_per_s": 0}, "must be greater than 0"),
    ],
)
def test_bad_offload_values_are_one_plain_error_each(kwargs, says):
    with pytest.raises(InvalidArgumentError, match=says.replace("(", r"\(")):
        HostOffload(**kwargs)
