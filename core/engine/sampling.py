"""Sampling parameters and the sampler: greedy, temperature / top-k / top-p, and the beam-search step.

Log-probabilities (`cumulative_logprob`, beam scores) are always those of the model's own distribution,
log_softmax of the raw logits, whatever the temperature or filters: as transformers' beam scores, and so they
compare across settings.
"""

from dataclasses import dataclass

import torch

from core.common import check_float, check_int
from core.errors import InvalidArgumentError


@dataclass(frozen=True)
class SamplingParams:
    """How each request is decoded (vLLM's names).

    max_tokens: new tokens per output (>= 1). temperature: 0 is greedy (argmax); > 0 divides the logits.
    top_p: keep the smallest set of most likely tokens whose probability reaches top_p (1.0: all).
    top_k: keep the k most likely tokens (0: all). n: independent samples per prompt, forked from the prompt's
    blocks. beam_width: > 1 runs beam search of that width instead of sampling (n must then be 1; temperature,
    top_p, top_k are ignored). seed: a per-request generator, so the same request gives the same samples
    whatever else is batched with it. ignore_eos: keep generating past the model's EOS tokens.
    stop_token_ids: more ids that end an output (the stop token is kept in the output, as EOS is).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    beam_width: int = 1
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        check_int(self.max_tokens, "max_tokens", minimum=1)
        check_float(self.temperature, "temperature", minimum=0.0)
        check_float(self.top_p, "top_p", minimum=0.0, maximum=1.0, exclusive_minimum=True)
        check_int(self.top_k, "top_k", minimum=0)
        check_int(self.n, "n", minimum=1, maximum=1024)
        check_int(self.beam_width, "beam_width", minimum=1, maximum=1024)
        if self.seed is not None:
            check_int(self.seed, "seed", minimum=0)
        if self.beam_width > 1 and self.n != 1:
            raise InvalidArgumentError(
                f"beam search returns its beam_width ({self.beam_width}) best beams: n must be 1, got {self.n}"
            )
        object.__setattr__(
            self, "stop_token_ids", tuple(check_int(t, "stop token id") for t in self.stop_token_ids)
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def use_beam_search(self) -> bool:
        return self.beam_width > 1

    @property
    def num_sequences(self) -> int:
        """Sequences the request holds at most at once: n samples or beam_width beams."""
        return self.beam_width if self.use_beam_search else self.n


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[rows, vocab] float32 logits / temperature with tokens outside top-k / top-p set to -inf (temperature > 0)."""
    scaled = logits / params.temperature
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability of the more likely tokens
        drop_sorted = before >= params.top_p  # the most likely token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> list[int]:
    """One token per row of [rows, vocab] logits: argmax when greedy, else a draw from the filtered softmax
    with `generator` (rows drawn in order, so a seeded generator gives reproducible tokens)."""
    if params.is_greedy:
        return logits.argmax(dim=-1).tolist()
    probs = filtered_logits(logits, params).softmax(dim=-1).cpu()
    return torch.multinomial(probs, 1, generator=generator).view(-1).tolist()


def beam_candidates(
    logprobs: torch.Tensor, beam_scores: list[float], count: int
) -> list[tuple[int, int, float]]:
    """The `count` best (beam index, token, new cumulative logprob) over all beams and tokens, best first.

    logprobs: [num_beams, vocab] log_softmax of each beam's logits; beam_scores: each beam's cumulative logprob.
    Scores are ranked as transformers ranks them (cumulative logprob; ties by lower flat index).
    """
    scores = logprobs + torch.tensor(beam_scores, dtype=logprobs.dtype, device=logprobs.device)[:, None]
    flat = scores.view(-1)
    top = torch.topk(flat, min(count, flat.numel()))
    vocab = logprobs.shape[-1]
    return [
        (i // vocab, i % vocab, s) for i, s in zip(top.indices.tolist(), top.values.tolist(), strict=True)
    ]
