"""The hybrid paged policy: a sliding-window group stays bounded while a full group grows, worked by hand, the
batched replay agrees with the real block managers step by step, and hybrid on saves memory over hybrid off."""

import numpy as np
import pytest

from core.common import cdiv
from core.errors import InvalidArgumentError
from core.serving.memory_policies import Policy
from core.serving.simulator import COLUMNS, SimulatorConfig, simulate
from core.serving.step_time import StepTimeModel
from core.serving.workload import Request, sharegpt

FLAT = StepTimeModel(0.0, 0.0, 0.0, 0.0, 1e12, 1e15, overhead_s=0.010)
GROUPS = (("full", 1, None), ("sliding_window", 1, 32))


def _hybrid(groups=GROUPS):
    return Policy("paged", 16, kv_groups=groups)


def test_window_group_stays_bounded_while_the_full_group_grows():
    """One request, 40 prompt + 80 output tokens, block 16, window 32; one full and one window group share a
    2 x (1,024 // 16) = 128-block pool. After the prefill each group holds cdiv(40, 16) = 3 blocks. After the
    decode that appends position p (length p + 1), the full group holds cdiv(p + 1, 16) and the window group
    the blocks from (p - 31) // 16 to p // 16: e.g. at length 100, full 7 and window 6 - 4 + 1 = 3, 10 in all."""
    config = SimulatorConfig(kv_capacity_tokens=1024, step_time=FLAT, max_snapshots=10**7)
    result = simulate([Request(0, 0.0, 40, 80)], _hybrid(), config)
    s = result.steps
    assert len(s) == 80 and s["free_blocks"].iloc[0] == 128 - 6
    held = 128 - s["free_blocks"].to_numpy()[:-1]  # the last row is after the request is freed
    expected = []
    for length in range(41, 119):  # rows 1-78; row 79 (length 119) ends after the request is freed
        p = length - 1
        full = cdiv(length, 16)
        window = p // 16 - max(0, p - 31) // 16 + 1
        assert window <= cdiv(32, 16) + 1
        expected.append(full + window)
    assert list(held[1:]) == expected
    assert expected[100 - 41] == 10
    assert s["free_blocks"].iloc[-1] == 128 and s["token_states"].iloc[-1] == 0
    parts = s["token_states"] + s["reservation"] + s["internal_fragmentation"] + s["external_fragmentation"]
    assert (parts == 2 * 1024).all() and result.capacity_slots == 2048


def test_batched_replay_equals_step_by_step_for_the_hybrid_policy():
    requests = sharegpt(80, rate=3.0, seed=2)
    policy = _hybrid((("full", 2, None), ("sliding_window", 2, 64), ("sliding_window", 2, 64)))
    fast = simulate(requests, policy, SimulatorConfig(kv_capacity_tokens=4_000))
    slow = simulate(requests, policy, SimulatorConfig(kv_capacity_tokens=4_000, max_snapshots=10**7))
    assert len(fast.steps) == len(slow.steps) and fast.summary["preemptions"] > 0
    for column in COLUMNS:
        assert np.allclose(fast.steps[column], slow.steps[column]), column
    assert fast.requests["finish_time"].notna().all()
    assert fast.steps["tokens_generated"].sum() == sum(r.output_len for r in requests)


def test_hybrid_on_batches_more_than_hybrid_off():
    """A gpt-oss-like model (half its layers slide over 128 tokens) on the same bytes: the window groups free
    their old blocks, so more requests fit at once and fewer are preempted."""
    requests = sharegpt(300, rate=8.0, seed=0)
    config = SimulatorConfig(kv_capacity_tokens=8_192)
    on = simulate(requests, _hybrid((("full", 12, None), ("sliding_window", 12, 128))), config).summary
    off = simulate(requests, Policy("paged", 16), config).summary
    assert on["avg_batched_requests"] > 1.2 * off["avg_batched_requests"]
    assert on["preemptions"] < off["preemptions"]


@pytest.mark.parametrize(
    "groups",
    [
        (),
        (("full", 1, 8),),
        (("sliding_window", 1, None),),
        (("mamba", 1, None),),
        (("full", 1, None), ("sliding_window", 2, 8)),
    ],
)
def test_bad_kv_groups_are_rejected(groups):
    with pytest.raises(InvalidArgumentError):
        _hybrid(groups)


def test_parallel_samples_are_rejected_by_the_hybrid_policy():
    with pytest.raises(InvalidArgumentError, match="one sequence per request"):
        simulate([Request(0, 0.0, 10, 10, n=2)], _hybrid(), SimulatorConfig(step_time=FLAT))


def test_experiment_runs_the_paged_policy_hybrid():
    from core.serving.experiment import SimulatorParams, run_comparison

    groups = (("full", 20, None), ("sliding_window", 20, 4096))
    params = SimulatorParams(num_requests=40, rate=4.0, policies=("paged",), kv_groups=groups)
    result = run_comparison(params)["paged"]
    assert result.policy.kv_groups == groups and result.capacity_slots == 2 * params.kv_capacity_tokens()
