"""The Scheduler driven phase by phase (schedule / allocate / postprocess), as a real engine drives it: a
hand-worked schedule with a recompute preemption, the same with swapping, the protocols, and misuse."""

import pytest

from core.errors import InvalidArgumentError
from core.kv.buddy_allocator import BuddyAllocator
from core.sched.scheduler import Scheduler, SequenceGroup
from core.serving.memory_policies import ContiguousMemory, MemoryMetrics, PagedMemory, orca_oracle, paged
from core.serving.simulator import SimulatedGroup
from core.serving.workload import Request


def _two_requests():
    """Two requests of 4 prompt + 8 output tokens in 4 blocks of 4 tokens (watermark 0)."""
    memory = PagedMemory(paged(4), 16, 0.0)
    a = SimulatedGroup(Request(0, 0.0, 4, 8), 0, list(range(4)))
    b = SimulatedGroup(Request(1, 0.0, 4, 8), 1, list(range(100, 104)))
    return memory, a, b


def _run(scheduler, steps):
    """Run `steps` steps; returns [(decoding ids, chunks, preempted ids, finished ids)] per step."""
    log = []
    for _ in range(steps):
        step = scheduler.schedule()
        scheduler.allocate(step)
        outcome = scheduler.postprocess(step)
        log.append(
            (
                [g.request_id for g in step.decoding],
                [(g.request_id, start, tokens) for g, start, tokens in step.prefill_chunks],
                [g.request_id for g in step.preempted],
                [g.request_id for g in outcome.finished],
            )
        )
    return log


def test_hand_worked_recompute_preemption():
    """Step 0 prefills both prompts (1 block each). Steps 1-4 decode both (lengths 4 -> 8: step 1 takes the
    last 2 blocks). Step 5 needs 2 new blocks, none free: B (newest) is preempted, freeing 2; A decodes alone.
    B (4 prompt + 5 outputs = 9 tokens, 3 blocks) waits until A finishes at step 7 (1 + 7 decoded tokens), then
    is prefilled again in chunks of the 8-token budget (8, then 1) and decodes its last 2 tokens."""
    memory, a, b = _two_requests()
    scheduler = Scheduler(memory, max_num_seqs=4, max_num_batched_tokens=8)
    scheduler.add(a)
    scheduler.add(b)
    log = _run(scheduler, 12)
    assert log[0] == ([], [(0, 0, 4), (1, 0, 4)], [], [])
    assert all(entry[0] == [0, 1] for entry in log[1:5])
    assert log[5] == ([0], [], [1], [])
    assert log[6] == ([0], [], [], [])
    assert log[7] == ([0], [], [], [0])
    assert log[8] == ([], [(1, 0, 8)], [], [])
    assert log[9] == ([], [(1, 8, 1)], [], [])
    assert log[10] == ([1], [], [], []) and log[11] == ([1], [], [], [1])
    assert not scheduler.has_unfinished and scheduler.num_preemptions == 1
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    assert memory.metrics() == MemoryMetrics(0, 0, 0, 0, 16, 4)


def test_hand_worked_swap_preemption():
    """The same load with swapping: at step 5, B's 2 blocks (8 tokens) go to swap space; once A is done, B comes
    back (step 8, which runs nothing: B was not decoding when the step's decodes were chosen) with its 2 blocks
    and no recompute, and decodes its 3 remaining tokens in steps 9-11."""
    memory, a, b = _two_requests()
    scheduler = Scheduler(memory, 4, 8, preemption_mode="swap", swap_capacity_blocks=2)
    scheduler.add(a)
    scheduler.add(b)
    steps = []
    for _ in range(12):
        step = scheduler.schedule()
        steps.append(step)
        if step.is_empty:  # the swap-in alone, nothing to run
            continue
        scheduler.allocate(step)
        scheduler.postprocess(step)
    assert steps[5].swapped_out == [b] and steps[5].swap_out_blocks == 2
    assert steps[6].num_swapped == 1 and scheduler.swap_used_blocks == 0
    assert steps[8].is_empty and steps[8].swapped_in == [b] and steps[8].swap_in_blocks == 2
    assert [s.decoding for s in steps[9:]] == [[b]] * 3
    assert sum(s.num_prefill_tokens for s in steps) == 8  # nothing prefilled twice
    assert not scheduler.has_unfinished and b.num_output_tokens == 8


def test_the_protocols_are_met():
    memory, a, _ = _two_requests()
    assert isinstance(a, SequenceGroup)
    for policy in (memory, ContiguousMemory(orca_oracle(), 64, 2048)):
        for name in ("can_admit", "admit", "grow", "release", "snapshot", "metrics", "decode_metrics"):
            assert callable(getattr(policy, name))
        assert policy.metrics().free_slots == policy.capacity - policy.metrics().token_states


def test_contiguous_can_admit_leaves_the_buddy_allocator_unchanged():
    """Three samples of 4 + 3 tokens need three 8-slot segments; a 20-slot cache (16 + 4) holds two."""
    memory = ContiguousMemory(orca_oracle(), 20, 2048)
    group = SimulatedGroup(Request(0, 0.0, 4, 3, n=3), 0, [])
    before = memory.buddy.free_list_size, memory.buddy.free_slots
    assert not memory.can_admit(group, 4, 0)
    assert (memory.buddy.free_list_size, memory.buddy.free_slots) == before
    two = SimulatedGroup(Request(1, 0.0, 4, 3, n=2), 1, [])
    assert memory.can_admit(two, 4, 0)
    assert BuddyAllocator(20).free_list_size == memory.buddy.free_list_size


def test_max_num_seqs_counts_sequences():
    """n=3 samples each: with max_num_seqs 4 only one group runs at a time."""
    memory = PagedMemory(paged(4), 256, 0.0)
    groups = [
        SimulatedGroup(Request(i, 0.0, 4, 2, n=3), i, list(range(10 * i, 10 * i + 4))) for i in range(2)
    ]
    scheduler = Scheduler(memory, max_num_seqs=4, max_num_batched_tokens=64)
    for group in groups:
        scheduler.add(group)
    step = scheduler.schedule()
    assert [g for g, _, _ in step.prefill_chunks] == [groups[0]] and step.num_running_seqs == 3


def test_phases_must_run_in_order():
    memory, a, _ = _two_requests()
    scheduler = Scheduler(memory, 4, 8)
    scheduler.add(a)
    step = scheduler.schedule()
    with pytest.raises(InvalidArgumentError, match="allocate"):
        scheduler.postprocess(step)
    with pytest.raises(InvalidArgumentError, match="decode-only"):
        scheduler.allocate(step, 2)
    scheduler.allocate(step)
    with pytest.raises(InvalidArgumentError, match="already"):
        scheduler.allocate(step)
    with pytest.raises(InvalidArgumentError):
        Scheduler(memory, max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(InvalidArgumentError):
        Scheduler(memory, preemption_mode="drop")


def test_a_step_is_stuck_only_when_nothing_runs_and_nothing_moved():
    """`ScheduledStep.is_stuck`, the one condition on which every driver raises `SchedulerStuckError.nothing_fits`:
    empty and no preemption or swap-in (memory that moved may let the next step run)."""
    from core.sched.scheduler import ScheduledStep

    assert ScheduledStep().is_stuck
    assert not ScheduledStep(preempted=["g"]).is_stuck and not ScheduledStep(swapped_in=["g"]).is_stuck
    assert (
        not ScheduledStep(decoding=["g"]).is_stuck
        and not ScheduledStep(prefill_chunks=[("g", 0, 4)]).is_stuck
    )
