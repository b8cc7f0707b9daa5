"""`step_load`: the load of one scheduled step as a step-time model prices it (`StepLoad`), the same for both
drivers of the scheduler: the run driver (`core.sched.driver.run_step`) computes it once per step
(`ScheduledStep.load`), the simulator prices the step with it and both drivers record its `kv_tokens_read`
(`core.sched.step_columns`); the SLO bench records it for the engine's steps."""

from typing import NamedTuple

import numpy as np

from core.sched.scheduler import ScheduledStep


class StepLoad(NamedTuple):
    """decode_tokens: one per decoding sequence. prefill_tokens: prompt tokens of the step's prefill chunks.
    kv_tokens_read: THE count of keys a step reads (priced and recorded): keys read besides the step's own
    tokens, the decodes' context before the step plus the prior context of each prefill chunk (of a
    single-sequence group, the prompt tokens the prefix cache served count as prior context: they are read, not
    computed); with a memory that has windows, what each query's window reads of them, averaged over the
    layers (`memory.num_keys_read`, the KV core's window rule). attention_pairs: (query, key) pairs: a decode
    attends to its context and itself (context + 1); a chunk of c tokens starting at s to its prior context and
    causally to itself (c * s + c (c + 1) / 2). output_tokens: tokens the step samples: one per decoding
    sequence, and one per sequence of each group whose prefill the step completes (the tokens an engine computes
    logits for). decode_context_tokens: the decodes' share of kv_tokens_read."""

    decode_tokens: int
    prefill_tokens: int
    kv_tokens_read: int
    attention_pairs: float
    output_tokens: int = 0
    decode_context_tokens: int = 0

    @property
    def new_tokens(self) -> int:
        return self.decode_tokens + self.prefill_tokens


def decode_starts(step: ScheduledStep) -> np.ndarray:
    """int64 [decoding sequences]: each decoding sequence's context before the step (its new token's position)."""
    groups = step.decoding
    if step.num_decode_tokens == len(groups):  # one sequence each (no parallel samples)
        return np.fromiter((g.length for g in groups), np.int64, len(groups))
    return np.array([g.length for g in groups for _ in range(g.num_seqs)], dtype=np.int64)


def step_load(step: ScheduledStep, memory=None) -> StepLoad:
    """The `StepLoad` of `step`, right after `schedule()` (read-only). memory: the scheduler's memory; when it
    is `windowed` (some layers read a window), its `num_keys_read(starts)` counts the keys read."""
    n_decode = step.num_decode_tokens
    ctx = step.decode_context_tokens
    prefill_tokens = 0
    starts = []
    pairs = ctx + n_decode
    outputs = n_decode
    for group, start, tokens in step.prefill_chunks:
        prefill_tokens += tokens
        if group.num_seqs == 1:  # the prompt tokens the prefix cache served precede the computed ones
            start += max(0, group.length - group.num_prefill_total)
        starts.append(start)
        pairs += tokens * start + tokens * (tokens + 1) / 2
        if start + tokens >= group.num_prefill_total:
            outputs += group.num_seqs
    read = ctx + sum(starts)
    if memory is not None and getattr(memory, "windowed", False):  # the decodes' mean, and the whole step's
        decodes = decode_starts(step)
        if starts:  # one question: row 0 the decodes (a span starting at 0 reads nothing), row 1 every span
            both = np.zeros((2, len(decodes) + len(starts)), dtype=np.int64)
            both[:, : len(decodes)] = decodes
            both[1, len(decodes) :] = starts
            ctx, read = (int(x) for x in memory.num_keys_read(both))
        else:
            ctx = read = int(memory.num_keys_read(decodes))
    return StepLoad(n_decode, prefill_tokens, read, pairs, outputs, ctx)
