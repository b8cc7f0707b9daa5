"""The engine's per-step frame uses the simulator's columns and counts a hand-checked run exactly."""

from core.engine import STEP_COLUMNS, Engine, SamplingParams
from core.engine.config import TINY_LLAMA
from core.sched.step_columns import COLUMNS


def test_steps_frame_counts_tokens_and_blocks_by_hand():
    """Prompts of 5 and 9 tokens, blocks of 4, 3 new tokens each (the prefill step samples the first)."""
    engine = Engine.from_config(TINY_LLAMA, num_blocks=32, block_size=4, device="cpu")
    seen = []
    engine.generate(
        [list(range(5)), list(range(9))],
        SamplingParams(3, temperature=0.0, ignore_eos=True),
        progress=seen.append,
    )
    steps = engine.last_run.steps
    assert tuple(steps.columns) == STEP_COLUMNS and STEP_COLUMNS[: len(COLUMNS)] == COLUMNS
    assert steps["token_states"].tolist() == [14, 16, 0]  # 5 + 9 prefilled, then one more each; then freed
    assert steps["blocks_in_use"].tolist() == [2 + 3, 2 + 3, 0]
    assert steps["internal_fragmentation"].tolist() == [20 - 14, 20 - 16, 0]
    assert steps["free_blocks"].tolist() == [27, 27, 32]
    assert steps["prefill_tokens"].tolist() == [14, 0, 0]
    assert steps["tokens_generated"].tolist() == [2, 2, 2]
    assert steps["kv_tokens_read"].tolist() == [0, 5 + 9, 6 + 10]  # keys read before the step's own tokens
    assert steps["running_seqs"].tolist() == [2, 2, 2]
    assert (steps["attention_ms"] > 0).all()
    total = steps[["token_states", "reservation", "internal_fragmentation", "allocator_slack", "free_slots"]]
    assert (total.sum(axis=1) == 32 * 4).all()
    assert seen[-1] == 1.0 and seen == sorted(seen)


def test_chunked_prefill_shows_reserved_slots_and_snapshots():
    engine = Engine.from_config(
        TINY_LLAMA, num_blocks=32, block_size=4, device="cpu", max_num_seqs=2, max_num_batched_tokens=8
    )
    engine.generate([list(range(20))], SamplingParams(2, temperature=0.0, ignore_eos=True))
    run = engine.last_run
    # step 0 computes 8 of the 20 allocated prompt tokens: 12 slots reserved
    assert run.steps["token_states"].iloc[0] == 8
    assert run.steps["reservation"].iloc[0] == 12
    assert [s.step for s in run.snapshots] == list(range(len(run.steps)))
    first = run.snapshots[0]
    # the one sequence's prompt
    assert len(first.pool.request_ids) == 1 and first.holder_request.tolist() == [0]
    assert first.time_s == run.steps["time_s"].iloc[0] and len(first.context_lens) == 0  # still prefilling
    assert int(first.pool.ref_count.sum()) == 5  # ceil(20 / 4) blocks of one sequence
