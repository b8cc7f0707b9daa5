"""The hybrid paged policy on one pool: a sliding-window group stays bounded while a full group grows, worked by
hand; the batched replay agrees with the pool step by step (samples and prefix caching too); samples share their
prompt blocks, shared prefixes hit the cache, and hybrid on saves memory over hybrid off."""

import numpy as np
import pytest

from core.common import cdiv
from core.errors import InvalidArgumentError
from core.planning.cost.step_model import StepTimeModel
from core.planning.cost.step_time import opt_13b_a100
from core.serving.memory_policies import Policy
from core.serving.paged_memory import PagedKVGroup, check_kv_groups
from core.serving.simulator import COLUMNS, SimulatorConfig, simulate
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
    fast = simulate(requests, policy, SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=4_000))
    slow = simulate(
        requests,
        policy,
        SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=4_000, max_snapshots=10**7),
    )
    assert len(fast.steps) == len(slow.steps) and fast.summary["preemptions"] > 0
    for column in COLUMNS:
        assert np.allclose(fast.steps[column], slow.steps[column]), column
    assert fast.requests["finish_time"].notna().all()
    assert fast.steps["tokens_generated"].sum() == sum(r.output_len for r in requests)


def test_hybrid_on_batches_more_than_hybrid_off():
    """A gpt-oss-like model (half its layers slide over 128 tokens) on the same bytes: the window groups free
    their old blocks, so more requests fit at once and fewer are preempted."""
    requests = sharegpt(300, rate=8.0, seed=0)
    config = SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=8_192)
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


def test_kv_groups_are_typed_once_at_the_edge():
    """A (kind, num_layers, window) triple becomes a `PagedKVGroup` in `check_kv_groups` (what `Policy` and
    `SimulatorParams` call), a typed group passes as it is; a model's groups come typed from vLLM's layout
    (Gemma 2 9B: 21 sliding-window layers over 4,096 tokens and 21 full, as in
    tests/planning/catalog/test_kv_layout.py)."""
    from core.page_models.simulator import model_kv_groups

    window = PagedKVGroup("sliding_window", 2, 64)
    assert check_kv_groups((("full", 2, None), window)) == (PagedKVGroup("full", 2), window)
    assert Policy("paged", 16, kv_groups=[("full", 2, None), ("sliding_window", 2, 64)]).kv_groups == (
        PagedKVGroup("full", 2, None),
        window,
    )
    assert model_kv_groups("gemma-2-9b") == (
        PagedKVGroup("sliding_window", 21, 4096),
        PagedKVGroup("full", 21),
    )
    assert model_kv_groups("opt-13b") is None
    with pytest.raises(InvalidArgumentError, match="kind must be one of"):
        PagedKVGroup("mamba", 1)


def test_parallel_samples_share_their_prompt_blocks_in_every_group():
    """gpt-oss-20b's groups (12 full layers, 12 sliding over 128 tokens), block 16, one request of 100 prompt
    tokens with n = 2: after the prefill the two samples share the prompt's cdiv(100, 16) = 7 blocks in each
    group (14 blocks, not 28); the first decode copies the shared, partly filled last block in each group (2 more);
    the two samples then grow a block each per group every 16 tokens (the window of 128 still reads all)."""
    from core.page_models.simulator import model_kv_groups

    groups = model_kv_groups("gpt-oss-20b")
    assert sorted(g.kind for g in groups) == ["full", "sliding_window"]
    config = SimulatorConfig(kv_capacity_tokens=4096, step_time=FLAT, max_snapshots=10**7)
    result = simulate([Request(0, 0.0, 100, 40, n=2)], _hybrid(groups), config)
    s = result.steps
    num_blocks = result.capacity_slots // 16
    held = num_blocks - s["free_blocks"].to_numpy()
    assert held[0] == 2 * 7  # after the prefill step: shared prompt blocks only
    assert held[1] == 2 * 7 + 2  # the first decode (length 100 -> 101) copies the last block in each group
    assert held[12] == 2 * 7 + 2  # row t appends position 99 + t: position 111 still fits the 7th block
    assert held[13] == 2 * 7 + 2 + 2 * 2  # position 112 starts each sample's 8th block, in each group
    snap = next(x for x in result.snapshots if x.step == 0)
    assert (snap.pool.ref_count == 2).sum() == 14 and set(
        snap.pool.group[snap.pool.ref_count > 0].tolist()
    ) == {0, 1}
    assert s["tokens_generated"].sum() == 2 * 40 and s["free_blocks"].iloc[-1] == num_blocks


def test_prefix_caching_hits_for_a_hybrid_model():
    """Requests sharing a 64-token system prompt on the hybrid policy with prefix caching: every request after
    the first finds the prefix in the cache of every group (64 tokens = 4 full blocks of 16, the window of 128
    still reads them all), so the run has hits and prefills fewer tokens than without caching."""
    requests = [Request(i, 0.5 * i, 100, 20, prefix_group=0, prefix_len=64) for i in range(6)]
    config = SimulatorConfig(kv_capacity_tokens=4096, step_time=FLAT)
    groups = (("full", 2, None), ("sliding_window", 2, 128))
    cached = simulate(requests, Policy("paged", 16, True, kv_groups=groups), config)
    plain = simulate(requests, _hybrid(groups), config)
    assert cached.summary["prefix_hit_tokens"] == 5 * 64
    assert plain.summary["prefix_hit_tokens"] == 0
    assert plain.steps["prefill_tokens"].sum() - cached.steps["prefill_tokens"].sum() == 5 * 64


@pytest.mark.parametrize("caching", [False, True])
def test_batched_replay_equals_step_by_step_with_samples_and_caching(caching):
    """n = 2 samples and shared prefixes under memory pressure: the batched decode (`decode_steps`, predicted by
    `decode_metrics`) records the same rows as one step at a time."""
    requests = sharegpt(60, rate=4.0, seed=3, n=2, prefix_len=48, prefix_fraction=0.5)
    policy = Policy("paged", 16, caching, kv_groups=(("full", 2, None), ("sliding_window", 2, 64)))
    fast = simulate(requests, policy, SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=3_000))
    slow = simulate(
        requests,
        policy,
        SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=3_000, max_snapshots=10**7),
    )
    assert len(fast.steps) == len(slow.steps) and fast.summary["preemptions"] > 0
    for column in COLUMNS:
        assert np.allclose(fast.steps[column], slow.steps[column]), column
    assert (fast.summary["prefix_hit_tokens"] > 0) == caching


def test_experiment_runs_the_paged_policy_hybrid():
    from core.page_models.simulator import SimulatorParams, run_comparison

    groups = (("full", 20, None), ("sliding_window", 20, 4096))
    params = SimulatorParams(num_requests=40, rate=4.0, policies=("paged",), kv_groups=groups)
    result = run_comparison(params)["paged"]
    assert params.kv_groups == (PagedKVGroup("full", 20), PagedKVGroup("sliding_window", 20, 4096))
    assert result.policy.kv_groups == params.kv_groups
    assert result.capacity_slots == 2 * params.kv_capacity_tokens()


def test_snapshot_shows_every_group_in_one_id_space():
    """Requests 0 (40 + 80 tokens) and 1 (20 + 60) both prefill at step 0; one full and one window-32 group,
    block 16, one 128-block pool. Step k appends position 39 + k of request 0 and 19 + k of request 1, so after
    step 30 they hold 70 and 50 tokens. Full group: request 0 holds cdiv(70, 16) = 5 blocks (the last with
    70 - 64 = 6 tokens), request 1 cdiv(50, 16) = 4 (last 50 - 48 = 2). Window group: a block i is released once
    the next position p has (p - 31) // 16 > i: request 0 (p = 70) keeps logical blocks 2-4, request 1 (p = 50)
    1-3, three each with the same last fills. Every held block id is in exactly one group; free: 128 - 9 - 6."""
    config = SimulatorConfig(kv_capacity_tokens=1024, step_time=FLAT, max_snapshots=10**7)
    result = simulate([Request(0, 0.0, 40, 80), Request(1, 0.0, 20, 60)], _hybrid(), config)
    snap = next(s for s in result.snapshots if s.step == 30)
    assert list(snap.context_lens) == [70, 50] and snap.block_tables is None
    assert len(snap.owner_request) == 128 and (snap.owner_request >= 0).sum() == 15
    held = snap.owner_request >= 0
    assert set(snap.pool.group[held].tolist()) == {0, 1} and (snap.pool.group[~held] == -1).all()
    for group, per_request in ((0, {0: 5, 1: 4}), (1, {0: 3, 1: 3})):
        mine = held & (snap.pool.group == group)
        assert {r: int((snap.owner_request[mine] == r).sum()) for r in (0, 1)} == per_request
        assert sorted(snap.pool.fill[mine].tolist()) == sorted(
            [2, 6] + [16] * (sum(per_request.values()) - 2)
        )
    assert (snap.pool.ref_count[held] == 1).all() and result.steps["free_blocks"].iloc[30] == 113


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
    from core.planning.catalog.models import MODELS
    from core.serving.memory_policies import make_memory

    groups = model_kv_groups("gemma-3-27b")
    assert sorted(g.num_layers for g in groups) == [8, 8, 9, 9, 9, 9, 10]
    memory = make_memory(_hybrid(groups), 15_728, 0.0, 2048)
    assert memory.num_blocks == 6_094 and memory.group_size == 10
    layout = kv_cache_layout(MODELS["gemma-3-27b"], 1 << 34, max_model_len=2048)
    page = layout.page_bytes
    available = 15_728 * 62 * page // 16
    assert kv_cache_layout(MODELS["gemma-3-27b"], available, max_model_len=2048).num_blocks == 6_094
    requests = fixed(24, 1200, 200, rate=4.0)  # past the 1,024-token window: the window groups stay bounded
    result = simulate(
        requests, _hybrid(groups), SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=15_728)
    )
    assert result.requests["finish_time"].notna().all()
    assert result.steps["free_blocks"].iloc[-1] == 6_094
    busiest = max(result.snapshots, key=lambda s: len(s.context_lens))
    assert len(busiest.context_lens) >= 2 and (busiest.context_lens > 1200).all()
    held = busiest.owner_request >= 0
    per_group = np.bincount(busiest.pool.group[held], minlength=7)
    full = next(i for i, g in enumerate(groups) if g.kind == "full")
    windows = [g for i, g in enumerate(per_group) if i != full]
    requests_held = len(set(busiest.owner_request[held].tolist()))
    assert per_group[full] > windows[0] and len(set(windows)) == 1  # the window groups make the same moves
    assert windows[0] <= (cdiv(1024, 16) + 1) * requests_held
    assert (
        held.sum() == 6_094 - result.steps["free_blocks"].iloc[busiest.step]
        and held.sum() * 16 <= 15_728 * 62 // 10
    )
