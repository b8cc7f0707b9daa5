"""Sequences and requests of the engine, and the outputs it returns (vLLM's names).

A `Sequence` is one output being generated: its token ids (prompt then output) and how many of them have K/V in
the cache. States, for a sequence held by the KV cache manager:
- prefilling: `num_computed < num_allocated` (the manager holds `num_allocated` tokens; the rest of the chunk
  work is `num_allocated - num_computed` tokens);
- decoding: `num_computed == num_allocated == len(token_ids) - 1`: the last sampled token is not in the cache yet
  (the next step appends it, writes its K/V and samples from its logits).
A request (`SequenceGroup`) holds its live sequences: one while its prompt is prefilled, then n samples or
beam_width beams, all advancing in lockstep.
"""

from dataclasses import dataclass, field

import torch

from core.engine.sampling import SamplingParams


@dataclass
class CompletionOutput:
    """One finished output. token_ids: the generated tokens (prompt excluded). cumulative_logprob: sum of the
    model's log-probabilities of those tokens. finish_reason: "stop" (EOS or a stop token, kept in token_ids) or
    "length" (max_tokens or the model's context reached). text: decoded tokens when the model has a tokenizer.
    logits: [len(token_ids), vocab] float32 logits each token was chosen from, when generate(return_logits=True)
    (not for beam search)."""

    index: int
    token_ids: list[int]
    cumulative_logprob: float
    finish_reason: str
    text: str | None = None
    logits: torch.Tensor | None = None


@dataclass
class RequestOutput:
    """The result of one prompt: `outputs` holds n samples in sample order, or beams best first.

    finished: False for a streamed request still running (`Engine.add_request(..., stream=True)`): its outputs
    then hold every token so far (cumulative, not a delta), finish_reason None for those still generating.
    """

    request_id: int | str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    finished: bool = True


@dataclass(eq=False)
class Sequence:
    seq_id: int
    token_ids: list[int]
    prompt_len: int
    num_computed: int = 0
    num_allocated: int = 0  # tokens the KV cache manager holds for this sequence (0: not allocated)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    logits: list[torch.Tensor] | None = None
    pending_logits: torch.Tensor | None = None  # [vocab] logits after the last token, not yet sampled from

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def prefill_left(self) -> int:
        return self.num_allocated - self.num_computed

    def fork(self, seq_id: int) -> "Sequence":
        return Sequence(
            seq_id,
            list(self.token_ids),
            self.prompt_len,
            self.num_computed,
            self.num_allocated,
            self.cumulative_logprob,
            None,
            None if self.logits is None else list(self.logits),
        )


@dataclass(eq=False)
class SequenceGroup:
    """A request in flight. seqs: live sequences (held together by the manager, or all unallocated while
    waiting). finished: sequences that ended. generator: the request's seeded generator (None: global RNG).
    stream: `Engine.step` reports the request after every step that gave it tokens, not only when it ends."""

    request_id: int | str
    params: SamplingParams
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    generator: torch.Generator | None
    prompt: str | None = None
    finished: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    started_sampling: bool = False  # the first output tokens were sampled
    stream: bool = False
    # kept by core.sched.scheduler.Scheduler (its SequenceGroup protocol)
    length: int = 0
    num_prefill_tokens: int = 0
    num_prefill_total: int = 0
    num_output_tokens: int = 0
    # set at admission by the engine's KV hook: the (sequence, first token, tokens to compute) pieces whose
    # concatenation is the group's prefill, so the scheduler's chunk [start, start + n) maps onto sequences (a
    # piece the forks share is written once, into the blocks they share)
    prefill_plan: list = field(default_factory=list)
    # (sequence, None) to free or (parent, child) to fork, in the order sampling decided them; EngineMemory
    # applies and clears them when the scheduler postprocesses the step
    kv_changes: list = field(default_factory=list)

    @property
    def is_prefilling(self) -> bool:
        return self.num_prefill_tokens > 0

    @property
    def is_done(self) -> bool:
        return not self.seqs

    @property
    def num_seqs(self) -> int:
        """Live sequences (n samples are forked at admission; beams grow from 1 to beam_width)."""
        return len(self.seqs)

    @property
    def seq_ids(self) -> list[int]:
        return [s.seq_id for s in self.seqs]

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def is_finished(self) -> bool:
        return not self.seqs

    def token_ids(self, index: int, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of the group's `index`-th live sequence (what the KV core's adapter allocates and
        appends)."""
        return self.seqs[index].token_ids[start:stop]
