"""How long one iteration (step) of the serving engine takes: a roofline on plain numbers, plus a fixed overhead.

    bytes  = weight_bytes + kv_bytes_per_token * (kv_tokens_read + new_tokens)
    flops  = flops_per_token * new_tokens + attention_flops_per_pair * attention_pairs
    time_s = overhead_s + per_token_overhead_s * new_tokens
             + max(bytes / (memory_bandwidth * bandwidth_efficiency), flops / (peak_flops * flops_efficiency))
             + swap_bytes / swap_bandwidth

new_tokens = prefill tokens + decode tokens of the step; kv_tokens_read = context tokens the decode queries attend
to plus the prior context of prefill chunks; attention_pairs = (query, key) pairs of the step.

Why an overhead: in the PagedAttention paper (Kwon et al., SOSP 2023, Figure 13) vLLM batched 30.42 requests on
average serving ShareGPT at 2 req/s with OPT-13B, i.e. it was memory-bound. A pure weights + KV roofline (~30 ms
per step) serves that load with ~18.5 batched requests and ~54% token states; with the ~15 ms per step that
engines of the time spent outside the GPU kernels (scheduling, sampling, Python, launches), the paged policy is
memory-bound as in the paper (bench/paper.py: 31.26 batched, 96.6% token states against the paper's 96.3%).

The constants below and their sources: OPT-13B has 12.9e9 parameters (25.8 GB in fp16; the paper's Table 1 says
26 GB), 40 layers and hidden size 5,120, so 2 x 5,120 x 40 x 2 bytes = 800 KiB of K/V per token (the paper,
section 3); an A100-SXM4-40GB reads 1,555 GB/s of HBM2 and peaks at 312 TFLOP/s in dense fp16 (NVIDIA's A100
datasheet). The 80% bandwidth and 50% FLOP/s efficiencies, the 15 ms overhead and 25 GB/s for PCIe 4.0 x16
swapping are this project's assumptions.
"""

from dataclasses import dataclass, replace

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.kv_accounting import kv_bytes_per_token, weight_bytes_per_gpu

# The constants used for the paper reproduction (OPT-13B, fp16, one A100-SXM4-40GB).
OPT_13B_PARAMS = 12.9e9
OPT_13B_LAYERS = 40
OPT_13B_HIDDEN = 5120
A100_40GB_BANDWIDTH = 1555e9  # bytes/s (HBM2)
A100_FP16_FLOPS = 312e12  # dense tensor-core FLOP/s
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
DEFAULT_FLOPS_EFFICIENCY = 0.5
DEFAULT_OVERHEAD_S = 0.015
DEFAULT_SWAP_BANDWIDTH = 25e9  # bytes/s, PCIe 4.0 x16 in practice


@dataclass(frozen=True)
class StepTimeModel:
    """Roofline step-time model. Bytes, FLOPs and seconds; see the module docstring for the formula.

    weight_bytes: bytes of weights read once per step (per GPU). kv_bytes_per_token: K and V bytes of one token
    over all layers. flops_per_token: ~2 x parameters. attention_flops_per_pair: 4 x layers x heads x head_dim
    (QK^T and PV for one query-key pair). memory_bandwidth (bytes/s) and peak_flops (FLOP/s) of the GPU, scaled by
    the two efficiencies. overhead_s: fixed per-step time outside the kernels. swap_bandwidth: CPU<->GPU bytes/s.
    per_token_overhead_s: host time per token of the step (sampling, detokenisation); 0 by default.
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

    def __post_init__(self):
        for name in ("weight_bytes", "kv_bytes_per_token", "flops_per_token", "attention_flops_per_pair"):
            if not getattr(self, name) >= 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("memory_bandwidth", "peak_flops", "swap_bandwidth"):
            if not getattr(self, name) > 0:
                raise InvalidArgumentError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("bandwidth_efficiency", "flops_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise InvalidArgumentError(f"{name} must be in (0, 1], got {getattr(self, name)!r}")
        if not self.overhead_s >= 0:
            raise InvalidArgumentError(f"overhead_s must be >= 0 seconds, got {self.overhead_s!r}")

    def with_overhead(self, overhead_s: float) -> "StepTimeModel":
        return replace(self, overhead_s=overhead_s)

    def step_seconds(
        self, new_tokens: float, kv_tokens_read: float, attention_pairs: float = 0.0, swap_bytes: float = 0.0
    ) -> float:
        """`step_time` for one step, on Python floats (the simulator's per-step fast path)."""
        if new_tokens <= 0:
            return 0.0
        memory = (self.weight_bytes + self.kv_bytes_per_token * (kv_tokens_read + new_tokens)) / (
            self.memory_bandwidth * self.bandwidth_efficiency
        )
        compute = (self.flops_per_token * new_tokens + self.attention_flops_per_pair * attention_pairs) / (
            self.peak_flops * self.flops_efficiency
        )
        return (
            self.overhead_s
            + self.per_token_overhead_s * new_tokens
            + max(memory, compute)
            + swap_bytes / self.swap_bandwidth
        )

    def step_time(self, new_tokens, kv_tokens_read, attention_pairs=0.0, swap_bytes=0.0):
        """Seconds for steps with these loads; scalars or numpy arrays (broadcast). 0 new tokens costs 0."""
        new_tokens = np.asarray(new_tokens, dtype=np.float64)
        bytes_moved = self.weight_bytes + self.kv_bytes_per_token * (
            np.asarray(kv_tokens_read, dtype=np.float64) + new_tokens
        )
        flops = self.flops_per_token * new_tokens + self.attention_flops_per_pair * np.asarray(
            attention_pairs, dtype=np.float64
        )
        compute = np.maximum(
            bytes_moved / (self.memory_bandwidth * self.bandwidth_efficiency),
            flops / (self.peak_flops * self.flops_efficiency),
        )
        total = (
            self.overhead_s
            + self.per_token_overhead_s * new_tokens
            + compute
            + np.asarray(swap_bytes, dtype=np.float64) / self.swap_bandwidth
        )
        return np.where(new_tokens > 0, total, 0.0)


def roofline(
    num_params: float,
    num_layers: int,
    hidden_size: int,
    kv_bytes_per_token: float,
    memory_bandwidth: float,
    peak_flops: float,
    weight_bytes_per_param: float = 2.0,
    **kwargs,
) -> StepTimeModel:
    """A StepTimeModel from a model's size and a GPU's bandwidth / FLOP/s (fp16 weights by default).

    hidden_size is num_heads x head_dim (the query width attention multiplies with).
    """
    return StepTimeModel(
        weight_bytes=num_params * weight_bytes_per_param,
        kv_bytes_per_token=kv_bytes_per_token,
        flops_per_token=2.0 * num_params,
        attention_flops_per_pair=4.0 * num_layers * hidden_size,
        memory_bandwidth=memory_bandwidth,
        peak_flops=peak_flops,
        **kwargs,
    )


def opt_13b_a100(**kwargs) -> StepTimeModel:
    """OPT-13B in fp16 on one A100-40GB: 25.8 GB of weights, 800 KiB of KV per token, 1,555 GB/s, 312 TFLOP/s,
    80% of bandwidth, 50% of peak FLOP/s, 15 ms per-step overhead (override any field by keyword)."""
    return roofline(
        OPT_13B_PARAMS,
        OPT_13B_LAYERS,
        OPT_13B_HIDDEN,
        kv_bytes_per_token=2 * OPT_13B_HIDDEN * OPT_13B_LAYERS * 2,
        memory_bandwidth=A100_40GB_BANDWIDTH,
        peak_flops=A100_FP16_FLOPS,
        **kwargs,
    )


def from_specs(
    model,
    gpu,
    tensor_parallel: int = 1,
    weight_dtype: str = "auto",
    kv_dtype: str = "auto",
    **kwargs,
) -> StepTimeModel:
    """A StepTimeModel for `model` (core.planning.models.ModelSpec) on one `gpu` (core.planning.hardware.GPUSpec) per TP rank.

    Weight and KV bytes per GPU come from core.planning.kv_accounting (vLLM's rules); FLOPs use the active parameters (MoE) split
    over `tensor_parallel`. A GPU without a known bf16 peak is treated as memory-bound (its compute roof set at
    1,000 FLOP per byte of bandwidth, far above any decode step's intensity).
    """
    peak = gpu.peak_bf16_flops or gpu.memory_bandwidth * 1000.0
    heads = model.num_attention_heads * model.head_dim
    return StepTimeModel(
        weight_bytes=float(weight_bytes_per_gpu(model, weight_dtype, tensor_parallel)),
        kv_bytes_per_token=float(kv_bytes_per_token(model, kv_dtype, tensor_parallel)),
        flops_per_token=2.0 * model.num_params_active / tensor_parallel,
        attention_flops_per_pair=4.0 * model.num_layers * heads / tensor_parallel,
        memory_bandwidth=float(gpu.memory_bandwidth),
        peak_flops=float(peak),
        **kwargs,
    )
