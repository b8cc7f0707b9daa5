"""Speculative decoding as the steady-state predictor prices it (`Speculation`, `SpeculativeStepTime`).

Each decode step a proposer drafts K tokens per sequence and the target model verifies K + 1 positions per
sequence in one forward pass (vLLM's rejection sampler): draft token i is accepted with probability a_i given
that tokens 1..i-1 were, the accepted prefix is kept and one more token (the correction or the bonus token) is
emitted. vLLM's per-position metric, `vllm:spec_decode_num_accepted_tokens_per_pos` / `vllm:spec_decode_num_drafts`,
is the unconditional r_i = a_1 ... a_i (position i counts only when 1..i-1 did), so a_i = r_i / r_(i-1)
(`Speculation.from_per_position`). A step therefore emits in expectation

    mean_accepted_len = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_K = 1 + r_1 + ... + r_K     tokens per sequence

(vLLM's "mean acceptance length", 1 + accepted / drafts; with every a_i = a, Leviathan et al.'s
(1 - a^(K+1)) / (1 - a)). The predictor uses this EXPECTATION, not a sampled acceptance: the
simulator's scheduler advances every decoding sequence one token per step, so a speculative step of d sequences
costing T seconds (below) is replayed as mean_accepted_len token steps of T / mean_accepted_len each. Throughput,
TPOT and ITL are those of the expected emission; the spread of per-step acceptance (a sequence sometimes gets 1
token, sometimes K + 1) is left out, so ITL percentiles are narrower than a real engine's.

The cost T of one speculative step (`SpeculativeStepTime`), on the target's step-time model:
- verification: d (K + 1) new tokens (FLOPs, K/V written, logits for every verified position) with each
  sequence's context read once and attended by its K + 1 queries: (K + 1) x context + (K + 1)(K + 2) / 2 pairs;
- proposal: "ngram" (prompt lookup) runs on the CPU: no GPU time. "draft-model" runs K sequential decode passes
  of the draft model (priced by the same step-time model on the same GPUs and TP, `--draft-model`), "eagle" K
  passes of an EAGLE head: one decoder layer of the target's width plus the target's LM head (Li et al., EAGLE,
  2024). Draft passes run inside the engine step (CUDA graphs), so they pay their roofline, not the step overhead.
A step that also carries prefill chunks pays verification of its decodes plus the prefill (and the proposer's
pass over the prefill tokens) in full and its decodes are credited one token: conservative for speculation
while prompts are being prefilled.
Memory: every running sequence holds K lookahead slots (vLLM's num_lookahead_slots), reserved as
max_num_seqs x K slots of the cache; a draft model's (or EAGLE head's) weights and its K/V per token come out of
the same KV memory (`kv_tokens`).
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from core.errors import InvalidArgumentError
from core.fields import InputField, check_fields, field_named
from core.planning.catalog.models import MODELS
from core.planning.cost.step_model import StepTimeModel

SPEC_METHODS = ("ngram", "draft-model", "eagle")
# Speculation's inputs, declared once (`core.fields`): the flags, the SLO page's URL fields and widgets, and
# `Speculation`'s checks of K and the method are made from them; `core.planning.predict.inputs.speculation_from`
# is the one converter. spec_tokens None or 0: no speculation; draft_model counts only for "draft-model".
SPECULATION_FIELDS = (
    InputField(
        "spec_tokens",
        "--spec-tokens",
        "spec_k",
        "int",
        None,
        "Speculative tokens K (--spec-tokens; 0: none)",
        "speculative decoding: K draft tokens (default: none, no speculation)",
        minimum=1,
        maximum=16,
        optional=True,
        step=1,
    ),
    InputField(
        "spec_acceptance",
        "--spec-acceptance",
        "spec_acc",
        "str",
        None,
        "Acceptance per position, a1,...,aK (--spec-acceptance)",
        "a1,...,aK: per-position acceptance in [0, 1]",
        optional=True,
    ),
    InputField(
        "spec_method",
        "--spec-method",
        "spec_method",
        "choice",
        "ngram",
        "Method (--spec-method)",
        f"one of {', '.join(SPEC_METHODS)}",
        choices=SPEC_METHODS,
    ),
    InputField(
        "draft_model",
        "--draft-model",
        "draft",
        "choice",
        None,
        "Draft model (--draft-model, method draft-model)",
        "draft model preset (--spec-method draft-model)",
        optional=True,
        choices=tuple(MODELS),
    ),
)
# the Speculation attribute each field checks
_CHECKED = (
    replace(field_named(SPECULATION_FIELDS, "spec_tokens"), name="num_tokens", optional=False),
    replace(field_named(SPECULATION_FIELDS, "spec_method"), name="method"),
)


def parse_acceptance(text: str) -> tuple[float, ...]:
    """--spec-acceptance's "a1,...,aK" as floats ("" gives none; `Speculation` checks the count and range).
    Raises InvalidArgumentError naming the flag for a part that is not a number."""
    try:
        return tuple(float(part) for part in text.split(",")) if text.strip() else ()
    except ValueError:
        raise InvalidArgumentError(
            f"--spec-acceptance must be comma-separated numbers in [0, 1], got {text!r}"
        ) from None


@dataclass(frozen=True)
class Speculation:
    """num_tokens: K draft tokens per step (1..16); acceptance: (a_1, ..., a_K), each in [0, 1], the probability
    that draft token i is accepted given the earlier ones were; method: one of SPEC_METHODS; draft_model: the
    draft's model preset (method "draft-model" only, required there). Raises InvalidArgumentError naming the CLI
    flag for anything else."""

    num_tokens: int
    acceptance: tuple[float, ...]
    method: str = "ngram"
    draft_model: str | None = None

    def __post_init__(self):
        check_fields(self, _CHECKED[:1])
        try:
            rates = tuple(float(a) for a in self.acceptance)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"--spec-acceptance must be {self.num_tokens} numbers in [0, 1], got {self.acceptance!r}"
            ) from None
        if len(rates) != self.num_tokens:
            raise InvalidArgumentError(
                f"--spec-acceptance needs one rate per draft token: {self.num_tokens} (--spec-tokens), "
                f"got {len(rates)}"
            )
        bad = [a for a in rates if not (math.isfinite(a) and 0.0 <= a <= 1.0)]
        if bad:
            raise InvalidArgumentError(f"--spec-acceptance rates must be in [0, 1], got {bad[0]!r}")
        object.__setattr__(self, "acceptance", rates)
        check_fields(self, _CHECKED[1:])
        if (self.method == "draft-model") != (self.draft_model is not None):
            raise InvalidArgumentError(
                "--draft-model names the draft of --spec-method draft-model (and only it)"
            )

    @classmethod
    def from_per_position(cls, rates, method: str = "ngram", draft_model: str | None = None) -> "Speculation":
        """From vLLM's per-position acceptance r_1..r_K (accepted at position i / drafts, non-increasing):
        a_i = r_i / r_(i-1) (a_i = 0 after a position no draft reached)."""
        rates = tuple(float(r) for r in rates)
        conditional = [r / prev if prev > 0 else 0.0 for prev, r in zip((1.0, *rates), rates, strict=False)]
        return cls(len(rates), tuple(conditional), method, draft_model)

    @property
    def mean_accepted_len(self) -> float:
        """Expected tokens one step emits per sequence: 1 + sum over i of a_1 x ... x a_i."""
        total, run = 1.0, 1.0
        for a in self.acceptance:
            run *= a
            total += run
        return total

    def flags(self) -> dict:
        return {
            "spec_tokens": self.num_tokens,
            "spec_acceptance": list(self.acceptance),
            "spec_method": self.method,
            "draft_model": self.draft_model,
        }


def draft_pass_model(model: StepTimeModel) -> StepTimeModel:
    """A draft's passes inside the engine step: its roofline and collectives, no per-step overheads."""
    return replace(
        model, overhead_s=0.0, per_token_overhead_s=0.0, single_token_overhead_s=None, small_step_factors=()
    )


def eagle_head_model(target: StepTimeModel, spec) -> StepTimeModel:
    """The EAGLE head of `target` (a ModelSpec `spec`): one decoder layer plus the LM head, read and computed
    each pass; one layer's K/V and attention."""
    layers = spec.num_layers
    share = (spec.layer_params + max(spec.lm_head_params, spec.embedding_params)) / spec.num_params
    return draft_pass_model(
        replace(
            target,
            weight_bytes=(target.weight_bytes + target.expert_weight_bytes) * share,
            flops_per_token=target.flops_per_token * share,
            kv_bytes_per_token=target.kv_bytes_per_token / layers,
            expert_weight_bytes=0.0,
            num_experts=0,
            experts_per_token=0,
            expert_flops_per_token=0.0,
            expert_block_rows=0,
            sliding_layer_fraction=0.0,
            attention_flops_per_pair=target.attention_flops_per_pair / layers,
            comm_latency_s=target.comm_latency_s / layers,
            comm_bytes_per_token=target.comm_bytes_per_token / layers,
            lm_head_flops_per_output=0.0,
            pipeline_stages=1,
        )
    )


def eagle_head_bytes(target: StepTimeModel, spec) -> tuple[float, float]:
    """(weight bytes, K/V bytes per token) the EAGLE head adds on a GPU: one layer (the LM head is shared)."""
    return (
        (target.weight_bytes + target.expert_weight_bytes) * spec.layer_params / spec.num_params,
        target.kv_bytes_per_token / spec.num_layers,
    )


def speculative_kv_tokens(
    kv_tokens: int,
    target: StepTimeModel,
    draft_bytes: tuple[float, float],
    spec: Speculation,
    max_num_seqs: int,
) -> int:
    """KV slots left for the target's sequences: the draft's weights taken out of the KV memory, each slot now
    holding the target's and the draft's K/V of a token, less max_num_seqs x K lookahead slots."""
    weights, kv = draft_bytes
    memory = kv_tokens * target.kv_bytes_per_token - weights
    slots = memory / (target.kv_bytes_per_token + kv) if target.kv_bytes_per_token + kv > 0 else kv_tokens
    return int(slots) - max_num_seqs * spec.num_tokens


@dataclass(frozen=True)
class SpeculativeStepTime:
    """The simulator's step cost (`core.serving.sim_config.StepCost`) of a target with speculation (module
    docstring). target: the target's StepTimeModel; draft: the proposer's pass model (None: ngram, free)."""

    target: StepTimeModel
    spec: Speculation
    draft: StepTimeModel | None = None

    @property
    def kv_bytes_per_token(self) -> float:
        return self.target.kv_bytes_per_token

    @property
    def swap_bandwidth(self) -> float:
        return self.target.swap_bandwidth

    def _verify_and_draft(
        self, decodes, context, prefill_tokens=0.0, prefill_read=0.0, prefill_pairs=0.0, prefill_outputs=0.0
    ):
        """Seconds of one speculative step: d = `decodes` sequences with `context` keys in all (floats or
        arrays), plus prefill chunks' tokens, prior context, pairs and sampled tokens."""
        k = self.spec.num_tokens
        numbers = not isinstance(context, np.ndarray)  # one step: Python floats (`StepTimeModel.seconds`)
        target = self.target.seconds if numbers else self.target.step_time
        verify = target(
            prefill_tokens + decodes * (k + 1),
            context + prefill_read,
            prefill_pairs + (k + 1) * context + decodes * (k + 1) * (k + 2) / 2,
            output_tokens=prefill_outputs + decodes * (k + 1),
        )
        if self.draft is None:
            return verify
        if not numbers and type(decodes) is int and not (prefill_tokens or prefill_read or prefill_pairs):
            # a decode run: the K passes as rows of one array, pass i reading context + i x decodes
            offsets = np.arange(k + 1) * decodes
            rows = self.draft.step_time(decodes, context + offsets[:k, None], context + offsets[1:, None])
            draft = rows[0]
            for i in range(1, k):
                draft = draft + rows[i]
            return verify + draft
        price = self.draft.seconds if numbers else self.draft.step_time
        draft = price(prefill_tokens + decodes, context + prefill_read, prefill_pairs + context + decodes)
        for i in range(1, k):
            draft = draft + price(decodes, context + i * decodes, context + (i + 1) * decodes)
        return verify + draft

    def step_time(self, new_tokens, kv_tokens_read, attention_pairs=0.0, swap_bytes=0.0, output_tokens=None):
        """Decode-only steps (the simulator's batched replay): `new_tokens` sequences each, context
        `kv_tokens_read` in all; seconds per token step (a speculative step / mean_accepted_len)."""
        return self._verify_and_draft(new_tokens, kv_tokens_read) / self.spec.mean_accepted_len

    def step_load_seconds(self, load, swap_bytes: float = 0.0) -> float:
        """One scheduled step (`core.sched.step_load.StepLoad`): decode-only as `step_time`; with prefill chunks
        the whole speculative step, its decodes credited one token (module docstring)."""
        d, p = load.decode_tokens, load.prefill_tokens
        if d + p == 0:
            return swap_bytes / self.swap_bandwidth
        swap = swap_bytes / self.swap_bandwidth
        if p == 0:
            context = load.kv_tokens_read
            return float(self._verify_and_draft(d, context)) / self.spec.mean_accepted_len + swap
        # the decodes' context is their pairs less one per decode; what remains of the read is the chunks' prior
        decode_context = load.decode_context_tokens
        return swap + float(
            self._verify_and_draft(
                d,
                decode_context,
                p,
                load.kv_tokens_read - decode_context,
                load.attention_pairs - decode_context - d,
                load.output_tokens - d,
            )
        )

    def prefill_seconds(self, prompt_len: int, chunk: int) -> float:
        """A prompt's prefill alone (the target's, plus the proposer's pass over it)."""
        total = self.target.prefill_seconds(prompt_len, chunk)
        return total + (self.draft.prefill_seconds(prompt_len, chunk) if self.draft is not None else 0.0)

    def decode_step_seconds(self, batch: float, context_len: float) -> float:
        """Seconds per emitted token of `batch` sequences at `context_len` (a speculative step / mean length)."""
        return float(self.step_time(batch, batch * context_len))
