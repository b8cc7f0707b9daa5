"""The decode roofline: seconds per decode step from the bytes a GPU reads (weights, and the KV of every sequence)
and the FLOPs it does, with no overheads. An estimate, labelled as such wherever it is shown."""

from core.common import cdiv, check_int
from core.kv.layout import kv_read_bytes_per_sequence
from core.planning.catalog.hardware import GPUSpec
from core.planning.catalog.models import ModelSpec
from core.planning.memory.kv_accounting import weight_bytes_per_gpu


def weight_bytes_read_per_step(
    model: ModelSpec,
    batch: int,
    weight_dtype: str = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> float:
    """Weight bytes one GPU reads for one decode micro-batch of `batch` sequences.

    Dense: all its weights. MoE: the shared part, plus the routed experts that at least one sequence picks:
    with E experts and k per token chosen uniformly, a given expert is used with probability
    1 - (1 - k/E)^batch.
    """
    full = weight_bytes_per_gpu(model, weight_dtype, tensor_parallel, pipeline_parallel)
    if not model.is_moe or model.num_experts <= model.num_experts_per_tok or model.num_experts_per_tok < 1:
        return float(full)
    experts, k = model.num_experts, model.num_experts_per_tok
    expert_params = (model.num_params - model.num_params_active) * experts / (experts - k)
    expert_share = min(1.0, expert_params / model.num_params)
    touched = 1 - (1 - k / experts) ** batch
    return full * ((1 - expert_share) + expert_share * touched)


def decode_step_estimate(
    model: ModelSpec,
    gpu: GPUSpec,
    batch: int,
    context_len: int,
    weight_dtype: str = "auto",
    kv_dtype: str = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    *,
    kv_read_bytes: int | None = None,
    weights_read_bytes: float | None = None,
) -> tuple[float, str]:
    """(seconds per decode step, "memory" or "compute"): every one of `batch` requests makes one token.

    An estimate, from a roofline with no overheads. With pp stages, `batch` is split into pp micro-batches
    of batch/pp that flow through the stages; in one step each GPU reads its weights once per micro-batch and
    the KV of every sequence on its stage once:
        bytes  = pp x weights_read(batch / pp) + batch x KV read per sequence               (per GPU)
    where a sequence's KV read is context_len x kv_bytes_per_token for full attention, and only the window,
    chunk or recurrent state of hybrid layers (`kv_read_bytes_per_sequence`).
        flops  = 2 x active_params x batch / (tp x pp)                                      (per GPU)
        step_s = max(bytes / memory_bandwidth, flops / peak_bf16_flops)
    kv_read_bytes: one sequence's KV read when the caller has it (a `ResolvedDeployment` reads it from the
    layer specs it holds); default `kv_read_bytes_per_sequence` of the model. weights_read_bytes: the
    weight bytes of the whole step (all micro-batches) when the caller has them (a MoE model's DP ranks and
    EP: `ResolvedDeployment.decode_step`); default pp x weights_read(batch / pp).
    """
    batch = check_int(batch, "batch", minimum=1)
    context_len = check_int(context_len, "context_len", minimum=1)
    micro = max(1, cdiv(batch, pipeline_parallel))
    weights = weights_read_bytes
    if weights is None:
        weights = pipeline_parallel * weight_bytes_read_per_step(
            model, micro, weight_dtype, tensor_parallel, pipeline_parallel
        )
    if kv_read_bytes is None:
        kv_read_bytes = kv_read_bytes_per_sequence(
            model,
            context_len,
            kv_dtype=kv_dtype,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
        )
    kv = batch * kv_read_bytes
    memory_s = (weights + kv) / gpu.memory_bandwidth
    compute_s = 0.0
    if gpu.peak_bf16_flops:
        compute_s = (
            2 * model.num_params_active * batch / (tensor_parallel * pipeline_parallel) / gpu.peak_bf16_flops
        )
    return (memory_s, "memory") if memory_s >= compute_s else (compute_s, "compute")
