"""How long one iteration (step) of the serving engine takes: a roofline on the step's batch, times efficiencies.

A step runs `new_tokens` tokens (prefill chunks + one per decoding sequence). Per GPU (the most loaded one):

    bytes   = weight_bytes + kv_bytes_per_token * (kv_tokens_read + new_tokens)        weights once, K/V read + written
    flops   = flops_per_token * new_tokens + attention_flops_per_pair * attention_pairs
              (+ lm_head_flops_per_output * output_tokens, the tokens the step samples, when set)
    roof_s  = max(bytes / (memory_bandwidth * bandwidth_efficiency), flops / (peak_flops * flops_efficiency))
    comm_s  = comm_latency_s + comm_bytes_per_token * new_tokens / interconnect_bandwidth
    time_s  = overhead_s + per_token_overhead_s * new_tokens + pipeline_stages * roof_s + comm_s + swap_s

(swap_s = swap_bytes / swap_bandwidth; time_s = 0 when new_tokens == 0), with single_token_overhead_s in place of
overhead_s for a step of exactly one token when it is set (a CPU's lone decode runs matrix-vector kernels: 37 ms
against ~60 ms for two to eight tokens on SmolLM2-135M, bench/slo.py), and a CPU's small-step correction: a step of n <= len(small_step_factors) tokens takes small_step_factors[n - 1]
x time_s (empty by default; a measured per-batch-size profile, docs/slo.md section 1; `fits.step_fit` fits it).

kv_tokens_read = the decodes' context plus the prefill chunks' prior context; attention_pairs = the step's (query,
key) pairs (a decode: context + 1; a chunk of c tokens from s: c * s + c (c + 1) / 2), from `core.sched.step_load`.

Mixture of experts (`from_specs` for a model with routed experts; issue 40; docs/slo.md sections 1 and 2c): a
step reads the dense weights and only the experts its tokens route to, 1 - (1 - k / E)^n of each layer's E
experts for n tokens at k a token under uniform routing (`experts_touched`), and the routed experts' grouped GEMMs
(n x k / E rows an expert) and weight reads run at their own efficiencies when set (None: the dense ones):

    memory_s = (dense bytes + KV) / (bandwidth x bandwidth_efficiency)
               + expert_weight_bytes x experts_touched(n) / (bandwidth x expert_bandwidth_efficiency)
    expert FLOPs (2 x k / E x expert parameters a token) at peak x expert_flops_efficiency
Real routing is not uniform (cold experts, a hot straggler): what the fitted efficiencies absorb. With
expert_block_rows B > 0 (vLLM 0.12's padded DeepGEMM kernel, `core.planning.cost.expert_rows`) the experts' GEMMs
compute round_up(n x k + E x (B - 1), B) rows a step: the n x k routed rows as above, the padding at flops_efficiency.

Sliding-window layers (gpt-oss, Gemma-2/3, Mistral-7B): with a fraction f of the layers windowed at W tokens, a
step's context reads and attention pairs count as (1 - f) x load + f x min(load, W x new_tokens) (`windowed`;
exact for decode steps whose contexts are all past W or all within it); new tokens are still written to every
layer.

Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2; `core.planning.cost.step_time.mla_attention_flops`;
docs/slo.md section 1): vLLM runs a step's decodes on the cached latent (W_UK absorbed into the query) and its
prefill chunks on per-head K and V up-projected from it, so

    flops   = ... + attention_flops_per_pair x decode pairs + prefill_attention_flops_per_pair x prefill pairs
              + prefill_context_flops_per_token x the prefill chunks' prior context tokens

`prefill` (a `PrefillLoad`: the chunks' pairs and prior context, parts of attention_pairs and kv_tokens_read)
gives the split; without it every pair is priced as a decode's. The simulator passes it through
`step_load_seconds`, None unless the model prices prefills apart, so every other model is priced by
`step_seconds` exactly as before.

Efficiencies and overheads are fitted, never guessed (`core.planning.cost.fits.step_fit.fit_step_time`: least
squares on relative error against measured step times, bench/slo.py, or published GPU figures,
`core.planning.cost.fits.published`). The defaults below are the paper reproduction's (`opt_13b_a100`, 80 % / 50 %
and 15 ms a step), calibrated on the PagedAttention paper's Figure 13 (bench/paper.py); 25 GB/s for PCIe 4.0 x16
swapping. A model preset's parameters on a GPU preset come from `core.planning.cost.step_time.from_specs`.
"""

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from core.planning.cost.expert_rows import padding_flops, uniform_experts_touched
from core.planning.cost.step_checks import check_step_fields

# The defaults of StepTimeModel's fields: the paper reproduction's (module docstring).
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
DEFAULT_FLOPS_EFFICIENCY = 0.5
DEFAULT_OVERHEAD_S = 0.015
DEFAULT_SWAP_BANDWIDTH = 25e9  # bytes/s, PCIe 4.0 x16 in practice


class PrefillLoad(NamedTuple):
    """The prefill chunks' part of a step's load (numbers or arrays, like the step's): pairs, their (query, key)
    pairs (part of attention_pairs); context_tokens, their prior context (part of kv_tokens_read). Module
    docstring: MLA."""

    pairs: object
    context_tokens: object


class StepBreakdown(NamedTuple):
    """The parts of `StepTimeModel.step_time` (seconds; floats or arrays like the inputs): overhead_s (fixed +
    per token), memory_s and compute_s (the two roofs, already x pipeline_stages; the larger one counts),
    comm_s (interconnect), total_s (what step_time returns, swap excluded)."""

    overhead_s: object
    memory_s: object
    compute_s: object
    comm_s: object
    total_s: object


@dataclass(frozen=True)
class StepTimeModel:
    """Roofline step-time model; see the module docstring for the formula. Bytes, FLOPs and seconds, per GPU.

    weight_bytes: weights read once per step. kv_bytes_per_token: K and V bytes of one token over the GPU's layers.
    flops_per_token: ~2 x parameters on the GPU. attention_flops_per_pair: 4 x layers x heads x head_dim on the GPU
    (QK^T and PV for one query-key pair). memory_bandwidth (bytes/s) and peak_flops (FLOP/s), scaled by the two
    efficiencies (in (0, 1]). overhead_s: fixed per-step time outside the kernels; per_token_overhead_s: host time
    per token of the step; single_token_overhead_s: overhead_s of a one-token step (None: the same).
    expert_weight_bytes / num_experts / experts_per_token: an MoE model's routed-expert bytes on the GPU (outside
    weight_bytes) and its routing (num_experts 0: every expert read every step); expert_flops_per_token (part of
    flops_per_token) priced at expert_flops_efficiency (None: flops_efficiency), the expert bytes read at
    expert_bandwidth_efficiency (None: bandwidth_efficiency); expert_block_rows: 0, or the tile of a kernel that
    computes every local expert's padded rows. Module docstring: MoE.
    small_step_factors: entry n - 1 multiplies the time of a step of exactly n new tokens (module docstring;
    () : none; each finite and > 0; stored as a tuple of floats).
    lm_head_flops_per_output: FLOPs of the LM head per sampled token, when flops_per_token leaves it out (engines
    compute logits only for the tokens they sample: a prefill chunk's last token); 0: flops_per_token has it.
    prefill_attention_flops_per_pair / prefill_context_flops_per_token: a prefill chunk's FLOPs per (query, key)
    pair and per prior-context token when prefills run another attention than decodes (MLA; None / 0: every pair
    at attention_flops_per_pair; module docstring: MLA). swap_bandwidth: CPU<->GPU bytes/s. pipeline_stages: the roofline is paid once per
    stage. comm_bytes_per_token / comm_latency_s / interconnect_bandwidth: the tensor- and pipeline-parallel
    traffic of one token (bytes per GPU), the fixed latency of a step's collectives, one direction's bytes/s.
    """

    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float
    attention_flops_per_pair: float
    memory_bandwidth: float
    peak_flops: float
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY
    overhead_s: float = DEFAULT_OVERHEAD_S
    swap_bandwidth: float = DEFAULT_SWAP_BANDWIDTH
    per_token_overhead_s: float = 0.0
    pipeline_stages: int = 1
    comm_bytes_per_token: float = 0.0
    comm_latency_s: float = 0.0
    interconnect_bandwidth: float = math.inf
    single_token_overhead_s: float | None = None
    lm_head_flops_per_output: float = 0.0
    small_step_factors: tuple[float, ...] = ()
    expert_weight_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    expert_flops_per_token: float = 0.0
    expert_flops_efficiency: float | None = None
    expert_bandwidth_efficiency: float | None = None
    sliding_layer_fraction: float = 0.0
    sliding_window: int = 0
    expert_token_ranks: int = 1
    expert_block_rows: int = 0
    prefill_attention_flops_per_pair: float | None = None
    prefill_context_flops_per_token: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "small_step_factors", check_step_fields(self))

    def with_overhead(self, overhead_s: float) -> "StepTimeModel":
        return replace(self, overhead_s=overhead_s)

    def step_seconds(
        self,
        new_tokens: float,
        kv_tokens_read: float,
        attention_pairs: float = 0.0,
        swap_bytes: float = 0.0,
        output_tokens: float | None = None,
        prefill: PrefillLoad | None = None,
    ) -> float:
        """`step_time` for one step, on Python floats (the simulator's per-step fast path). output_tokens: tokens the
        step samples (decodes + prefills it completes; None: new_tokens), priced by lm_head_flops_per_output.
        prefill: the prefill chunks' pairs and prior context (module docstring: MLA; None: every pair a decode's)."""
        if new_tokens <= 0:
            return 0.0
        weights = self.weight_bytes
        if self.expert_weight_bytes:
            weights += self.expert_weight_bytes * self.experts_touched(new_tokens)
        if self.sliding_layer_fraction:
            kv_tokens_read = self.windowed(kv_tokens_read, new_tokens)
            attention_pairs = self.windowed(attention_pairs, new_tokens)
        memory = (weights + self.kv_bytes_per_token * (kv_tokens_read + new_tokens)) / (
            self.memory_bandwidth * self.bandwidth_efficiency
        )
        if self.expert_bandwidth_efficiency is not None and self.expert_weight_bytes:
            memory += self._expert_read_extra_seconds(new_tokens)
        flops = self.flops_per_token * new_tokens + self.attention_flops_per_pair * attention_pairs
        if self.lm_head_flops_per_output:
            flops += self.lm_head_flops_per_output * (new_tokens if output_tokens is None else output_tokens)
        if prefill is not None and self.prefill_attention_flops_per_pair is not None:
            flops += self.prefill_extra_flops(prefill)
        compute = flops / (self.peak_flops * self.flops_efficiency)
        if self.expert_flops_efficiency is not None and self.expert_flops_per_token:
            compute += self._expert_extra_seconds(new_tokens)
        if self.expert_block_rows:
            compute += self._expert_padding_seconds(new_tokens)
        roof = max(memory, compute)
        if self.pipeline_stages != 1:
            roof *= self.pipeline_stages
        overhead = self.overhead_s
        if new_tokens == 1 and self.single_token_overhead_s is not None:
            overhead = self.single_token_overhead_s
        factors = self.small_step_factors
        swap = swap_bytes / self.swap_bandwidth
        total = overhead + self.per_token_overhead_s * new_tokens + roof + (0.0 if factors else swap)
        if self.comm_bytes_per_token or self.comm_latency_s:
            total += (
                self.comm_latency_s + self.comm_bytes_per_token * new_tokens / self.interconnect_bandwidth
            )
        if factors:  # the correction scales the step, not its swap (summed in this order without factors)
            if new_tokens <= len(factors) and new_tokens == int(new_tokens):
                total *= factors[int(new_tokens) - 1]
            total += swap
        return total

    def step_time(
        self,
        new_tokens,
        kv_tokens_read,
        attention_pairs=0.0,
        swap_bytes=0.0,
        output_tokens=None,
        prefill=None,
    ):
        """Seconds for steps with these loads; scalars or numpy arrays (broadcast). 0 new tokens costs 0. prefill:
        a `PrefillLoad` of numbers or arrays (module docstring: MLA; None: every pair a decode's)."""
        if type(new_tokens) in (int, float) and self._plain:  # the simulator's decode runs: arrays of a batch
            total = self._plain_total(new_tokens, kv_tokens_read, attention_pairs, output_tokens)
            if not (type(swap_bytes) in (int, float) and swap_bytes == 0):
                total = total + np.asarray(swap_bytes, dtype=np.float64) / self.swap_bandwidth
            if new_tokens > 0 and isinstance(total, np.ndarray) and total.ndim:
                return total
            return np.where(new_tokens > 0, total, 0.0)
        parts = self.breakdown(new_tokens, kv_tokens_read, attention_pairs, output_tokens, prefill)
        total = parts.total_s + np.asarray(swap_bytes, dtype=np.float64) / self.swap_bandwidth
        return np.where(np.asarray(new_tokens) > 0, total, 0.0)

    def seconds(self, new_tokens, kv_tokens_read, attention_pairs=0.0, output_tokens=None) -> float:
        """`step_time` of one step (no swap) as a Python float, for numbers: the same value, bit for bit
        (the same operations in the same order on float64), without numpy's per-call cost."""
        if not self._plain:
            return float(self.step_time(new_tokens, kv_tokens_read, attention_pairs, 0.0, output_tokens))
        if not new_tokens > 0:
            return 0.0
        return self._plain_total(new_tokens, kv_tokens_read, attention_pairs, output_tokens)

    @property
    def _plain(self) -> bool:
        """No routed experts, sliding-window layers, small-step factors or prefill attention priced apart:
        `_plain_total` prices the step."""
        return not (
            self.expert_weight_bytes
            or self.expert_flops_per_token
            or self.sliding_layer_fraction
            or self.small_step_factors
            or self.prefill_attention_flops_per_pair is not None
        )

    @property
    def step_load_seconds(self):
        """`core.serving.sim_config.StepCost`'s optional hook, through which the simulator prices a step from its
        `core.sched.step_load.StepLoad` (decodes and prefill chunks apart): None unless prefills have their own
        attention cost (MLA), so every other model is priced by `step_seconds` as before."""
        return None if self.prefill_attention_flops_per_pair is None else self._load_seconds

    def _load_seconds(self, load, swap_bytes: float = 0.0) -> float:
        """One scheduled step from its StepLoad: the prefill chunks' pairs are the step's less the decodes'
        (context + 1 each), their prior context the keys read less the decodes' context; a step that only swaps
        in costs the transfer (as the simulator prices it)."""
        if not load.new_tokens > 0:
            return swap_bytes / self.swap_bandwidth
        decode_pairs = load.decode_context_tokens + load.decode_tokens
        prefill = PrefillLoad(
            load.attention_pairs - decode_pairs, load.kv_tokens_read - load.decode_context_tokens
        )
        return self.step_seconds(
            load.new_tokens,
            load.kv_tokens_read,
            load.attention_pairs,
            swap_bytes,
            load.output_tokens,
            prefill,
        )

    def prefill_extra_flops(self, prefill: PrefillLoad):
        """FLOPs to add for the prefill chunks' part of a step priced at attention_flops_per_pair (module docstring:
        MLA): (prefill_attention_flops_per_pair - attention_flops_per_pair) x their pairs +
        prefill_context_flops_per_token x their prior context (negative: prefill pairs are the cheaper ones)."""
        per_pair = self.prefill_attention_flops_per_pair - self.attention_flops_per_pair
        return per_pair * prefill.pairs + self.prefill_context_flops_per_token * prefill.context_tokens

    def _plain_total(self, new_tokens, kv_tokens_read, attention_pairs, output_tokens):
        """`breakdown(...).total_s` of a `_plain` model for a number of new tokens (the others numbers or float64
        arrays): its operations in its order, numbers as Python floats (IEEE double like numpy's float64), so
        the value is the same bit for bit; an array only where an input is one."""
        n = float(new_tokens)
        read = _as_float(kv_tokens_read)
        pairs = _as_float(attention_pairs)
        bytes_moved = self.weight_bytes + self.kv_bytes_per_token * (read + n)
        flops = self.flops_per_token * n + self.attention_flops_per_pair * pairs
        if self.lm_head_flops_per_output:
            flops = flops + self.lm_head_flops_per_output * (
                n if output_tokens is None else _as_float(output_tokens)
            )
        memory = bytes_moved / (self.memory_bandwidth * self.bandwidth_efficiency)
        compute = flops / (self.peak_flops * self.flops_efficiency)
        stages = self.pipeline_stages
        if stages != 1:
            memory, compute = memory * stages, compute * stages
        fixed = self.overhead_s
        if self.single_token_overhead_s is not None and n == 1:
            fixed = self.single_token_overhead_s
        overhead = fixed + self.per_token_overhead_s * n
        if isinstance(memory, np.ndarray) or isinstance(compute, np.ndarray):
            total = overhead + np.maximum(memory, compute)
        else:
            total = overhead + (memory if memory >= compute else compute)
        if self.comm_bytes_per_token or self.comm_latency_s:
            total = total + (
                self.comm_latency_s + self.comm_bytes_per_token * n / self.interconnect_bandwidth
            )
        return total

    def breakdown(
        self, new_tokens, kv_tokens_read, attention_pairs=0.0, output_tokens=None, prefill=None
    ) -> StepBreakdown:
        """The parts of the step time (arrays broadcast like `step_time`; swap left out)."""
        new_tokens = np.asarray(new_tokens, dtype=np.float64)
        kv_tokens_read = np.asarray(kv_tokens_read, dtype=np.float64)
        attention_pairs = np.asarray(attention_pairs, dtype=np.float64)
        if self.sliding_layer_fraction:
            kv_tokens_read = self.windowed(kv_tokens_read, new_tokens)
            attention_pairs = self.windowed(attention_pairs, new_tokens)
        bytes_moved = self.weight_bytes + self.kv_bytes_per_token * (kv_tokens_read + new_tokens)
        if self.expert_weight_bytes:
            bytes_moved = bytes_moved + self.expert_weight_bytes * self.experts_touched(new_tokens)
        flops = self.flops_per_token * new_tokens + self.attention_flops_per_pair * np.asarray(
            attention_pairs, dtype=np.float64
        )
        if self.lm_head_flops_per_output:
            outputs = new_tokens if output_tokens is None else np.asarray(output_tokens, dtype=np.float64)
            flops = flops + self.lm_head_flops_per_output * outputs
        if prefill is not None and self.prefill_attention_flops_per_pair is not None:
            flops = flops + self.prefill_extra_flops(
                PrefillLoad(*(np.asarray(v, dtype=np.float64) for v in prefill))
            )
        stages = self.pipeline_stages
        memory = bytes_moved / (self.memory_bandwidth * self.bandwidth_efficiency)
        if self.expert_bandwidth_efficiency is not None and self.expert_weight_bytes:
            memory = memory + self._expert_read_extra_seconds(new_tokens)
        compute = flops / (self.peak_flops * self.flops_efficiency)
        if self.expert_flops_efficiency is not None and self.expert_flops_per_token:
            compute = compute + self._expert_extra_seconds(new_tokens)
        if self.expert_block_rows:
            compute = compute + self._expert_padding_seconds(new_tokens)
        if stages != 1:
            memory, compute = memory * stages, compute * stages
        fixed = self.overhead_s
        if self.single_token_overhead_s is not None:
            fixed = np.where(new_tokens == 1, self.single_token_overhead_s, self.overhead_s)
        overhead = fixed + self.per_token_overhead_s * new_tokens
        comm = self.comm_latency_s + self.comm_bytes_per_token * new_tokens / self.interconnect_bandwidth
        total = overhead + np.maximum(memory, compute)
        if self.comm_bytes_per_token or self.comm_latency_s:
            total = total + comm
        if self.small_step_factors:
            scale = self.step_factor(new_tokens)
            overhead, memory, compute, comm, total = (
                x * scale for x in (overhead, memory, compute, comm, total)
            )
        return StepBreakdown(overhead, memory, compute, comm, total)

    def windowed(self, per_layer_load, new_tokens):
        """A step's context reads (or attention pairs) averaged over the layers when a sliding_layer_fraction of
        them see at most sliding_window keys per query: (1 - f) x load + f x min(load, window x new_tokens) (each of
        the step's at most new_tokens queries reads at most the window in a windowed layer; module docstring)."""
        f, cap = self.sliding_layer_fraction, self.sliding_window * new_tokens
        low = (
            np.minimum(per_layer_load, cap)
            if isinstance(per_layer_load, np.ndarray)
            else min(per_layer_load, cap)
        )
        return (1.0 - f) * per_layer_load + f * low

    def _expert_extra_seconds(self, new_tokens):
        """The routed experts' FLOPs priced at expert_flops_efficiency instead of flops_efficiency: the time to add
        to the compute roof (negative when the experts run more efficiently than the rest)."""
        flops = self.expert_flops_per_token * new_tokens
        return flops / self.peak_flops * (1.0 / self.expert_flops_efficiency - 1.0 / self.flops_efficiency)

    def _expert_padding_seconds(self, new_tokens):
        """The padded kernel's rows beyond the routed ones (`expert_rows.padding_flops`; module docstring: MoE) at
        flops_efficiency (whole tiles of a dense GEMM's shape): the time to add to the compute roof."""
        rows, ranks = self.expert_block_rows, self.expert_token_ranks
        flops = padding_flops(
            new_tokens, self.expert_flops_per_token, self.experts_per_token, self.num_experts, rows, ranks
        )
        return flops / (self.peak_flops * self.flops_efficiency)

    def _expert_read_extra_seconds(self, new_tokens):
        """The routed experts' bytes read at expert_bandwidth_efficiency instead of bandwidth_efficiency: the time
        to add to the memory roof (negative when the experts stream faster than the rest)."""
        read = self.expert_weight_bytes * self.experts_touched(new_tokens)
        scale = 1.0 / self.expert_bandwidth_efficiency - 1.0 / self.bandwidth_efficiency
        return read / self.memory_bandwidth * scale

    def experts_touched(self, new_tokens):
        """The fraction of this GPU's routed experts a step reads (module docstring: MoE), over all DP ranks."""
        if not self.num_experts:
            return 1.0
        return uniform_experts_touched(
            new_tokens, self.experts_per_token, self.num_experts, self.expert_token_ranks
        )

    def step_factor(self, new_tokens) -> np.ndarray:
        """The small-step factor of each step (float64, shaped like new_tokens): small_step_factors[n - 1] for
        a step of exactly n tokens with 1 <= n <= len(small_step_factors), else 1."""
        n = np.asarray(new_tokens, dtype=np.float64)
        table = np.array((1.0, *self.small_step_factors))  # index 0: no correction
        index = np.where((n >= 1) & (n <= len(self.small_step_factors)) & (n == np.floor(n)), n, 0.0)
        return table[index.astype(np.int64)]

    def decode_step_seconds(self, batch: float, context_len: float) -> float:
        """One step of `batch` decoding sequences, each attending to `context_len` earlier tokens."""
        return self.step_seconds(batch, batch * context_len, batch * (context_len + 1))

    def prefill_seconds(self, prompt_len: int, chunk: int) -> float:
        """Prefill of one `prompt_len` prompt alone, in chunks of at most `chunk` tokens (one step each)."""
        total, start = 0.0, 0
        while start < prompt_len:
            c = min(chunk, prompt_len - start)
            pairs = c * start + c * (c + 1) / 2
            total += self.step_seconds(c, start, pairs, prefill=PrefillLoad(pairs, start))
            start += c
        return total


def _as_float(value):
    """A number as a Python float, an array as float64 (what `StepTimeModel.breakdown`'s np.asarray gives)."""
    if isinstance(value, np.ndarray):
        return value if value.dtype == np.float64 else value.astype(np.float64)
    return float(value)
