"""The roofline of our own engine on this machine's CPU: the roofs measured here and the step-time model of a
model's shapes on them (efficiencies and overheads left to fit). `bench/slo.py` fits it to measured steps; the
Live page's planned-vs-observed (`core.planning.observed.planned`) fits it to a `core.serve` server's histograms.

`measure_roofs` times a 256 MiB `copy_` (read + write bytes) and a 1,536^3 float32 matmul, best of `repeats`:
the best sample is the machine least disturbed by other processes, so fitted efficiencies stay below 1.
"""

import time

from core.kv.model_shape import ModelShape
from core.planning.cost.step_model import StepTimeModel


def measure_roofs(repeats: int = 12, matmul_dtype: str = "float32") -> dict:
    """{"memory_bandwidth": bytes/s, "peak_flops": FLOP/s} of this machine in this process (its torch threads);
    the FLOP/s of a `matmul_dtype` matmul ("bfloat16" for a server computing in bf16, as vLLM's CPU build does:
    on a CPU with AVX-512 BF16 that roof is several times float32's)."""
    import torch

    src = torch.ones(64 * 1024 * 1024)  # 256 MiB of float32
    dst = torch.empty_like(src)
    n = 1536
    a, b = (torch.randn(n, n).to(getattr(torch, matmul_dtype)) for _ in range(2))
    copy, mm = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        copy.append(time.perf_counter() - t)
        t = time.perf_counter()
        torch.mm(a, b)
        mm.append(time.perf_counter() - t)
    return {"memory_bandwidth": 2 * src.nbytes / min(copy), "peak_flops": 2 * n**3 / min(mm)}


def engine_step_model(
    shape: ModelShape, *, weight_bytes: float, dtype_bytes: int, roofs: dict
) -> StepTimeModel:
    """Our engine's roofline: the weights read once per step, K/V per token (layers x 2 x kv heads x head_dim x
    dtype bytes), 2 FLOPs per weight per token outside the LM head and 2 x vocab x hidden per sampled token for
    it (the engine computes logits only for the tokens it samples), 4 x layers x heads x head_dim per attention
    pair; memory_bandwidth and peak_flops from `roofs`; efficiencies at 1 and overheads at 0, to be fitted.
    `shape`: the model's shared facts (`ModelConfig.shape`, `ModelSpec.shape`), passed whole, so no caller
    copies the engine config's fields into the planner's names by hand."""
    lm_head = float(shape.vocab_size * shape.hidden_size)
    return StepTimeModel(
        weight_bytes=float(weight_bytes),
        kv_bytes_per_token=float(shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * dtype_bytes),
        flops_per_token=2.0 * (weight_bytes / dtype_bytes - lm_head),
        lm_head_flops_per_output=2.0 * lm_head,
        attention_flops_per_pair=4.0 * shape.num_layers * shape.num_attention_heads * shape.head_dim,
        memory_bandwidth=roofs["memory_bandwidth"],
        peak_flops=roofs["peak_flops"],
        bandwidth_efficiency=1.0,
        flops_efficiency=1.0,
        overhead_s=0.0,
    )
