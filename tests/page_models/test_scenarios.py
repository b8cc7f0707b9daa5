"""core.page_models.scenarios: every script against hand-worked block tables and free counts, and replay == play."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidArgumentError
from core.page_models.playground import Playground, PlaygroundConfig
from core.page_models.scenarios import (
    REFUSED,
    SCENARIOS,
    Scenario,
    Step,
    add,
    append,
    cpp_status_lines,
    fork,
    free,
    get_scenario,
    play_step,
    replay,
    script,
)

# Per step 0..n: (free blocks, block tables). Worked by hand from the allocator's rules: free blocks are taken
# oldest-freed first, a sequence releases its blocks last to first, copy-on-write takes the next free block.
EXPECTED = {
    "seed-demo": [
        (8, {}),
        (6, {"1": (0, 1)}),  # 24 tokens = 2 blocks of 16
        (5, {"1": (0, 1), "2": (2,)}),  # 16 tokens = 1 block
        (7, {"2": (2,)}),
    ],
    "seed-bugs": [
        (8, {}),
        (6, {"1": (0, 1)}),
        (6, {"1": (0, 1), "2": (0, 1)}),
        (0, {"1": (0, 1), "2": (0, 1), "3": (2, 3, 4, 5, 6, 7)}),
        (0, {"1": (0, 1), "2": (0, 1), "3": (2, 3, 4, 5, 6, 7)}),  # copy-on-write refused: nothing changed
        (6, {"1": (0, 1), "2": (0, 1)}),
        (5, {"1": (0, 1), "2": (0, 7)}),  # 3 released 7, 6, ..., 2: block 7 is taken first
        (5, {"1": (0, 1), "2": (0, 7)}),  # unknown sequence refused
    ],
    "parallel-sampling": [
        (16, {}),
        (13, {"s0": (0, 1, 2)}),
        (13, dict.fromkeys(("s0", "s1", "s2", "s3"), (0, 1, 2))),
        (12, {"s0": (0, 1, 3), "s1": (0, 1, 2), "s2": (0, 1, 2), "s3": (0, 1, 2)}),
        (11, {"s0": (0, 1, 3), "s1": (0, 1, 4), "s2": (0, 1, 2), "s3": (0, 1, 2)}),
        (10, {"s0": (0, 1, 3), "s1": (0, 1, 4), "s2": (0, 1, 5), "s3": (0, 1, 2)}),
        (10, {"s0": (0, 1, 3), "s1": (0, 1, 4), "s2": (0, 1, 5), "s3": (0, 1, 2)}),  # last reader: no copy
        (6, {"s0": (0, 1, 3, 6), "s1": (0, 1, 4, 7), "s2": (0, 1, 5, 8), "s3": (0, 1, 2, 9)}),
        (8, {"s0": (0, 1, 3, 6), "s2": (0, 1, 5, 8), "s3": (0, 1, 2, 9)}),
    ],
    "beam-search": [
        (16, {}),
        (14, {"s0": (0, 1)}),  # 6 tokens in blocks of 4
        (14, {"s0": (0, 1), "s1": (0, 1)}),
        (13, {"s0": (0, 2), "s1": (0, 1)}),
        (13, {"s0": (0, 2), "s1": (0, 1)}),
        (13, {"s0": (0, 2), "s1": (0, 1), "s2": (0, 2)}),
        (14, {"s0": (0, 2), "s2": (0, 2)}),
        (12, {"s0": (0, 2, 3), "s2": (0, 2, 4)}),
        (13, {"s2": (0, 2, 4)}),
        (16, {}),
    ],
    "prefix-caching": [
        (8, {}),
        (5, {"s0": (0, 1, 2)}),
        (4, {"s0": (0, 1, 2), "s1": (0, 1, 3)}),
        (5, {"s1": (0, 1, 3)}),
        (8, {}),
        (5, {"s2": (0, 1, 4)}),  # blocks 0 and 1 revived from the cache
        (8, {}),
        (0, {"s3": (5, 6, 7, 2, 3, 4, 1, 0)}),  # uncached first, then cached 1, 0 evicted
        (8, {}),
        (5, {"s4": (0, 1, 4)}),  # s3 released 0, 1, 4, ... last to first: evicted in that order
    ],
    "running-out": [
        (6, {}),
        (2, {"s0": (0, 1, 2, 3)}),
        (2, {"s0": (0, 1, 2, 3)}),
        (0, {"s0": (0, 1, 2, 3), "s1": (4, 5)}),
        (0, {"s0": (0, 1, 2, 3), "s1": (4, 5)}),
        (0, {"s0": (0, 1, 2, 3), "s1": (4, 5)}),
        (2, {"s0": (0, 1, 2, 3)}),
        (1, {"s0": (0, 1, 2, 3, 5)}),
    ],
    "running-out-window": [  # window 32: token p reads p-31..p, so blocks before (p - 31) // 16 are released
        (6, {}),
        (2, {"s0": (0, 1, 2, 3)}),
        (2, {"s0": (0, 1, 2, 3)}),
        (0, {"s0": (0, 1, 2, 3), "s1": (4, 5)}),
        (0, {"s0": (0, 1, 2, 3), "s1": (4, 5)}),
        (1, {"s0": (-1, -1, 2, 3, 0), "s1": (4, 5)}),  # p = 64: (64 - 31) // 16 = 2 blocks released, 0 reused
        (1, {"s0": (-1, -1, -1, 3, 0, 1), "s1": (4, 5)}),  # p = 79 releases block 2, p = 80 takes block 1
        (3, {"s0": (-1, -1, -1, 3, 0, 1)}),
    ],
}


def test_every_scenario_has_hand_worked_expectations():
    assert set(EXPECTED) == set(SCENARIOS)
    for key, scenario in SCENARIOS.items():
        assert len(EXPECTED[key]) == scenario.num_steps + 1, key


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_replay_gives_the_tables_and_free_counts_the_narration_states(key):
    scenario = SCENARIOS[key]
    for step, (free_blocks, tables) in enumerate(EXPECTED[key]):
        playground = replay(scenario, step)
        snapshot = playground.snapshot()
        assert snapshot.num_free_blocks == free_blocks, (key, step)
        assert {s: snapshot.table(s) for s in snapshot.seq_ids} == tables, (key, step)
        assert playground.verify() == 0.0  # every sequence reads back the K/V written for it
        if step:  # the narration states the free count it shows
            stated = re.findall(
                r"(?:all )?(\d+)(?: of \d+)? (?:blocks )?(?:are )?free", scenario.narration(step)
            )
            assert set(stated) == {str(free_blocks)}, (key, step, stated)


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_refusals_happen_exactly_where_the_script_says(key):
    scenario = SCENARIOS[key]
    playground = Playground(scenario.config, scenario.seed)
    for step in scenario.steps:
        before = len(playground.history)
        play_step(playground, step)
        outcomes = [entry.ok for entry in playground.history[before:]]
        assert len(outcomes) == len(step.actions)
        assert outcomes == [True] * (len(outcomes) - 1) + [not step.refused], step.narration


def test_the_seed_bugs_are_refused_with_the_reason_and_change_nothing():
    scenario = get_scenario("seed-bugs")
    full = replay(scenario, 3)
    refused = replay(scenario, 4)
    assert refused.history[-1].message.startswith("out of KV blocks")
    assert refused.manager.ref_count(1) == 2  # still shared: nothing was copied
    assert refused.snapshot().num_tokens == full.snapshot().num_tokens
    unknown = replay(scenario, 7)
    assert unknown.history[-1].message == "unknown sequence '9'; live sequences: ['1', '2'] (2 in all)"
    assert unknown.snapshot().num_tokens == replay(scenario, 6).snapshot().num_tokens == {"1": 24, "2": 25}


def test_cpp_status_lines_match_what_the_seed_program_prints():
    # The teaching C++ main() (g++ -std=c++17) prints these two statuses, after sequence 2 and after freeing 1.
    scenario = get_scenario("seed-demo")
    assert cpp_status_lines(replay(scenario, 2).manager) == (
        "Total blocks: 8",
        "Free blocks: 5",
        "Active sequences: 2",
    )
    assert cpp_status_lines(replay(scenario, 3).manager) == (
        "Total blocks: 8",
        "Free blocks: 7",
        "Active sequences: 1",
    )


def test_parallel_samples_share_the_prompt_and_copy_only_the_last_block():
    playground = replay(get_scenario("parallel-sampling"), 7)
    assert [playground.manager.ref_count(b) for b in (0, 1)] == [4, 4]
    assert playground.waste().stored_tokens == 2 * 16 + 4 * (49 - 32)  # prompt blocks stored once
    prefix = replay(get_scenario("prefix-caching"), 9).manager.prefix_cache_stats
    windowed = replay(get_scenario("running-out-window"), 6)
    assert windowed.manager.num_held_blocks("s0") == 3 and windowed.manager.num_tokens("s0") == 81
    assert (prefix.queries_tokens, prefix.hits_tokens, prefix.evictions_blocks) == (
        40 + 45 + 40 + 128 + 40,
        64,
        5,
    )


def test_bad_steps_and_names_are_refused_with_the_range():
    scenario = get_scenario("seed-demo")
    with pytest.raises(InvalidArgumentError, match="between 0 and 3"):
        replay(scenario, 4)
    with pytest.raises(InvalidArgumentError, match="between 0 and 3"):
        scenario.narration(-1)
    with pytest.raises(InvalidArgumentError, match="seed-demo"):
        get_scenario("nope")
    with pytest.raises(InvalidArgumentError, match="allowed: add"):
        add(4).__class__("swap")


def test_a_script_table_builds_the_steps_written_out():
    steps = script(
        ("add", (24, "1"), "one"),
        ("fork", ["1"] * 2, "two"),
        ("append", [("1", 8), "2"], "three", REFUSED),
        ("add", (128, None, False), "four"),
        ("free", "1", "five"),
    )
    assert steps == (
        Step("one", (add(24, "1"),)),
        Step("two", (fork("1"), fork("1"))),
        Step("three", (append("1", 8), append("2", 1)), refused=True),
        Step("four", (add(128, shared_prefix=False),)),
        Step("five", (free("1"),)),
    )
    with pytest.raises(InvalidArgumentError, match="allowed: add, append, fork, free"):
        script(("swap", "1", "no"))
    with pytest.raises(InvalidArgumentError, match="allowed: nothing or 'refused'"):
        script(("free", "1", "no", "maybe"))


# ---- replay to step k equals playing steps 1..k on one playground ----------------------------------------------


def assert_same_playground(a: Playground, b: Playground) -> None:
    sa, sb = a.snapshot(), b.snapshot()
    for name in ("owner", "ref_count", "fill", "is_free", "is_cached", "free_order"):
        assert getattr(sa, name).tolist() == getattr(sb, name).tolist(), name
    assert (sa.seq_ids, sa.block_tables, sa.num_tokens) == (sb.seq_ids, sb.block_tables, sb.num_tokens)
    assert a.history == b.history
    assert a.color_index == b.color_index
    assert a.manager.prefix_cache_stats == b.manager.prefix_cache_stats
    for x, y in zip(
        a.paged.cache.key_cache + a.paged.cache.value_cache,
        b.paged.cache.key_cache + b.paged.cache.value_cache,
        strict=True,
    ):
        assert torch.equal(x, y)
    assert {s: a.manager.token_ids(s) for s in sa.seq_ids} == {s: b.manager.token_ids(s) for s in sb.seq_ids}


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_replay_to_every_step_equals_stepwise_play(key):
    scenario = SCENARIOS[key]
    live = Playground(scenario.config, scenario.seed)
    assert_same_playground(replay(scenario, 0), live)
    for k, step in enumerate(scenario.steps, start=1):
        play_step(live, step)
        assert_same_playground(replay(scenario, k), live)


SEQS = ("s0", "s1", "s2", "s3", "x")
ACTIONS = st.one_of(
    st.builds(add, st.integers(1, 40), shared_prefix=st.booleans()),
    st.builds(append, st.sampled_from(SEQS), st.integers(1, 9)),
    st.builds(fork, st.sampled_from(SEQS)),
    st.builds(free, st.sampled_from(SEQS)),
)


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(st.lists(ACTIONS, min_size=1, max_size=3), min_size=1, max_size=8),
    caching=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 12)),
)
def test_replay_equals_stepwise_play_for_random_scripts(steps, caching, window):
    config = PlaygroundConfig(
        num_blocks=6,
        block_size=4,
        head_dim=4,
        num_kv_heads=1,
        enable_prefix_caching=caching,
        system_prompt_len=8,
        sliding_window=window,
    )
    scenario = Scenario("random", "random", "", config, tuple(Step("", tuple(a)) for a in steps))
    live = Playground(config)
    for k, step in enumerate(scenario.steps, start=1):
        play_step(live, step)
        assert_same_playground(replay(scenario, k), live)
        assert live.verify() == 0.0
