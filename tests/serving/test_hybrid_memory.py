"""The hybrid paged policy: a sliding-window group stays bounded while a full group grows, worked by hand, the
batched replay agrees with the real block managers step by step, and hybrid on saves memory over hybrid off."""

import numpy as np
import pytest

from core.common import cdiv
from core.errors import InvalidArgumentError
from core.serving.memory_policies import Policy
from core.serving.simulator import COLUMNS, SimulatorConfig, simulate
from core.serving.step_time import StepTimeModel
from core.serving.workload import Request, fixed, sharegpt

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
    parts += s["free_slots"]
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
        (("full", 0, None), ("sliding_window", 1, 8)),
        (("sliding_window", 1, 0),),
    ],
)
def test_bad_kv_groups_are_rejected(groups):
    with pytest.raises(InvalidArgumentError):
        _hybrid(groups)


def test_parallel_samples_are_rejected_by_the_hybrid_policy():
    with pytest.raises(InvalidArgumentError, match="one sequence per request"):
        simulate([Request(0, 0.0, 10, 10, n=2)], _hybrid(), SimulatorConfig(step_time=FLAT))


def test_experiment_runs_the_paged_policy_hybrid():
    from core.page_models.simulator import SimulatorParams, run_comparison

    groups = (("full", 20, None), ("sliding_window", 20, 4096))
    params = SimulatorParams(num_requests=40, rate=4.0, policies=("paged",), kv_groups=groups)
    result = run_comparison(params)["paged"]
    assert result.policy.kv_groups == groups and result.capacity_slots == 2 * params.kv_capacity_tokens()


def test_snapshot_maps_each_groups_blocks_to_requests():
    """Requests 0 (40 + 80 tokens) and 1 (20 + 60) both prefill at step 0; one full and one window-32 group,
    block 16, each manager numbering a 128-block pool and taking free blocks first in first out. Step k appends
    position 39 + k of request 0 and 19 + k of request 1, so after step 30 they hold 70 and 50 tokens.
    Full group: prompts take 0, 1, 2 (request 0) and 3, 4 (request 1); then new logical blocks at position 48
    (request 0, step 9: block 5), 32 (request 1, step 13: 6), 64 (request 0, step 25: 7), 48 (request 1, step
    29: 8). Window group: the same prompt blocks; a block i is released once position p has (p - 31) // 16 > i:
    request 0 drops 0 at step 8 (p 47) and 1 at step 24 (p 63), request 1 drops 3 at step 28 (p 47); released
    blocks go to the back of the free list, so the takes at steps 9, 13, 25, 29 still get 5, 6, 7, 8. Held
    after step 30: request 0 keeps logical 2-4 = blocks 2, 5, 7 (fill 16, 16, 70 - 64 = 6), request 1 logical
    1-3 = blocks 4, 6, 8 (16, 16, 50 - 48 = 2). Free: 128 - 9 - 6 = 113."""
    config = SimulatorConfig(kv_capacity_tokens=1024, step_time=FLAT, max_snapshots=10**7)
    result = simulate([Request(0, 0.0, 40, 80), Request(1, 0.0, 20, 60)], _hybrid(), config)
    snap = next(s for s in result.snapshots if s.step == 30)
    assert list(snap.context_lens) == [70, 50] and snap.owner_request is None
    pool = snap.hybrid_pool
    assert pool.num_blocks == 128 and pool.group_size == 1 and pool.free_blocks == 113
    full, window = pool.groups
    assert (full.kind, full.window, window.kind, window.window) == ("full", None, "sliding_window", 32)
    assert list(full.block_ids) == list(range(9))
    assert list(full.owner_request) == [0, 0, 0, 1, 1, 0, 1, 0, 1]
    assert list(full.fill) == [16] * 7 + [6, 2]
    assert list(window.block_ids) == [2, 4, 5, 6, 7, 8]
    assert list(window.owner_request) == [0, 1, 0, 1, 0, 1]
    assert list(window.fill) == [16, 16, 16, 16, 6, 2]
    assert result.steps["free_blocks"].iloc[30] == 113


def test_unequal_groups_are_padded_to_the_largest():
    """vLLM's rule: every group's page holds group_size = 2 layers (the largest group), so the 1-layer window
    group is padded. 1,024 token slots of 5 real layers = 5,120 layer slots; a block is 16 tokens x 2 layers =
    32, so the pool has 160 blocks (not 3 x 64 = 192) and 2,560 group slots. One request of 40 + 80 tokens, window
    32 in both window groups: after the prefill 3 x 3 blocks are held (151 free); at length 100 the full group
    holds cdiv(100, 16) = 7 and each window group 99 // 16 - 68 // 16 + 1 = 3, 13 in all (147 free)."""
    groups = (("full", 2, None), ("sliding_window", 2, 32), ("sliding_window", 1, 32))
    config = SimulatorConfig(kv_capacity_tokens=1024, step_time=FLAT, max_snapshots=10**7)
    result = simulate([Request(0, 0.0, 40, 80)], _hybrid(groups), config)
    s = result.steps
    assert result.capacity_slots == 2560
    assert s["free_blocks"].iloc[0] == 151 and s["free_blocks"].iloc[100 - 40] == 147
    parts = s["token_states"] + s["reservation"] + s["internal_fragmentation"] + s["external_fragmentation"]
    parts += s["free_slots"]
    assert (parts == 2560).all() and s["free_blocks"].iloc[-1] == 160


def test_gemma_3_pool_is_vllms_block_count():
    """Gemma-3-27B: groups 10 (full) + 9, 9, 9, 9, 8, 8 (window 1,024), group size 10, 8 padding layers.
    15,728 token slots of 62 layers in blocks of 16 tokens x 10 layers: 15,728 x 62 // 160 = 6,094 blocks,
    equal to kv_cache_layout's num_blocks for the same bytes (available // page // group_size)."""
    from core.kv.layout import kv_cache_layout
    from core.page_models.simulator import model_kv_groups
    from core.planning.models import MODELS
    from core.serving.memory_policies import make_memory

    groups = model_kv_groups("gemma-3-27b")
    assert sorted(layers for _, layers, _ in groups) == [8, 8, 9, 9, 9, 9, 10]
    memory = make_memory(_hybrid(groups), 15_728, 0.0, 2048)
    assert memory.num_blocks == 6_094 and memory.group_size == 10
    layout = kv_cache_layout(MODELS["gemma-3-27b"], 1 << 34, max_model_len=2048)
    page = layout.page_bytes
    available = 15_728 * 62 * page // 16
    assert kv_cache_layout(MODELS["gemma-3-27b"], available, max_model_len=2048).num_blocks == 6_094
    requests = fixed(24, 1200, 200, rate=4.0)  # past the 1,024-token window: the window groups stay bounded
    result = simulate(requests, _hybrid(groups), SimulatorConfig(kv_capacity_tokens=15_728))
    assert result.requests["finish_time"].notna().all()
    assert result.steps["free_blocks"].iloc[-1] == 6_094
    busiest = max(result.snapshots, key=lambda s: len(s.context_lens))
    assert len(busiest.context_lens) >= 2 and (busiest.context_lens > 1200).all()
    snap = busiest.hybrid_pool
    *windows, full = snap.groups
    assert full.kind == "full" and len(full.block_ids) > len(windows[0].block_ids)
    assert len(windows[0].block_ids) <= (cdiv(1024, 16) + 1) * len(set(full.owner_request.tolist()))
    # the six window groups make the same moves, so their maps are equal and stored once
    assert all(w.block_ids is windows[0].block_ids and w.fill is windows[0].fill for w in windows)
    held = len(full.block_ids) + 6 * len(windows[0].block_ids)
    assert snap.free_blocks == 6_094 - held and held * 16 <= result.capacity_slots
