"""`step_load`: the load of one scheduled step as a step-time model prices it (`StepLoad`), the same for both
drivers of the scheduler: the simulator prices its steps with it, the SLO bench records it for the engine's."""

from typing import NamedTuple

from core.sched.scheduler import ScheduledStep


class StepLoad(NamedTuple):
    """decode_tokens: one per decoding sequence. prefill_tokens: prompt tokens of the step's prefill chunks.
    kv_tokens_read: keys read besides the step's own tokens: the decodes' context before the step plus the prior
    context of each prefill chunk (of a single-sequence group, the prompt tokens the prefix cache served count
    as prior context: they are read, not computed). attention_pairs: (query, key) pairs: a decode attends to its context and
    itself (context + 1); a chunk of c tokens starting at s to its prior context and causally to itself
    (c * s + c (c + 1) / 2). output_tokens: tokens the step samples: one per decoding sequence, and one per sequence
    of each group whose prefill the step completes (the tokens an engine computes logits for). decode_context_tokens:
    the decodes' share of kv_tokens_read (their context before the step)."""

    decode_tokens: int
    prefill_tokens: int
    kv_tokens_read: int
    attention_pairs: float
    output_tokens: int = 0
    decode_context_tokens: int = 0

    @property
    def new_tokens(self) -> int:
        return self.decode_tokens + self.prefill_tokens


def step_load(step: ScheduledStep) -> StepLoad:
    """The `StepLoad` of `step` (after `schedule()`; read-only)."""
    n_decode = step.num_decode_tokens
    ctx = step.decode_context_tokens
    prefill_tokens = 0
    prior = 0
    pairs = ctx + n_decode
    outputs = n_decode
    for group, start, tokens in step.prefill_chunks:
        prefill_tokens += tokens
        if group.num_seqs == 1:  # the prompt tokens the prefix cache served precede the computed ones
            start += max(0, group.length - group.num_prefill_total)
        prior += start
        pairs += tokens * start + tokens * (tokens + 1) / 2
        if start + tokens >= group.num_prefill_total:
            outputs += group.num_seqs
    return StepLoad(n_decode, prefill_tokens, ctx + prior, pairs, outputs, ctx)
