"""The counted paged policy makes exactly the full paged policy's schedule: every recorded step and request time
alike, under pressure (preemption by recompute and by swap) and without."""

import pandas as pd
import pytest

from core.errors import InvalidArgumentError
from core.planning.cost.step_time import opt_13b_a100
from core.serving.memory_policies import Policy, paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request, sharegpt, uniform


@pytest.mark.parametrize(
    ("requests", "config"),
    [
        (sharegpt(300, rate=4.0, seed=1), {}),  # the paper's cache, memory-bound: recompute preemptions
        (sharegpt(200, rate=20.0, seed=2), {"kv_capacity_tokens": 6_000, "preemption_mode": "swap"}),
        (
            uniform(150, (5, 300), (1, 200), rate=8.0, seed=3),
            {"kv_capacity_tokens": 3_000, "max_num_seqs": 24, "max_num_batched_tokens": 256},
        ),
    ],
)
def test_counted_policy_replays_the_paged_schedule(requests, config):
    config = SimulatorConfig(step_time=opt_13b_a100(), **config)
    full = simulate(requests, paged(16), config)
    counted = simulate(requests, paged(16, counted=True), config)
    assert full.steps["preemptions"].sum() > 0  # memory pressure: the cases that could diverge
    pd.testing.assert_frame_equal(full.steps, counted.steps)
    pd.testing.assert_frame_equal(full.requests, counted.requests)
    assert counted.snapshots and all(s.pool is None for s in counted.snapshots)


def test_counted_policy_refuses_what_it_cannot_count():
    with pytest.raises(InvalidArgumentError, match="counted applies"):
        Policy("paged", 16, enable_prefix_caching=True, counted=True)
    with pytest.raises(InvalidArgumentError, match="counted applies"):
        Policy("orca-max", counted=True)
    with pytest.raises(InvalidArgumentError, match="one sequence per request"):
        simulate(
            [Request(0, 0.0, 10, 10, n=2)], paged(16, counted=True), SimulatorConfig(step_time=opt_13b_a100())
        )
