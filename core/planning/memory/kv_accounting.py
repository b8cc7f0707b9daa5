"""KV accounting: bytes of KV cache per token, weights and activations per GPU, and blocks in a KV budget.

Every number is per GPU (the most loaded one: the largest pipeline stage) unless its name says otherwise.
Units are in the names: `_bytes`, `_tokens`, `_blocks`. The rules are vLLM's: KV heads are split over
tensor-parallel ranks (replicated past the KV head count; an MLA latent is whole on every rank), layers over
pipeline stages, and the KV budget is total memory x utilization - weights - activation peak.

A MoE model served with data-parallel attention (`--data-parallel-size D`) and / or expert parallelism
(`--enable-expert-parallel`) keeps the attention, embeddings and dense MLPs once per DP rank, split over its tp
ranks, and spreads the routed experts over all tp x D ranks (vLLM's `FusedMoEParallelConfig.make`, which
flattens tp over the DP ranks for the MoE layers): without EP each expert's matrices are split tp x D ways;
with EP each GPU holds whole experts, ceil(E / (tp x D)) of them on the most loaded one (`determine_expert_map`
gives the first E mod (tp x D) ranks one more). Each DP rank has its own scheduler and KV cache, so every KV
figure here is per DP rank, as for a replica (`weight_bytes_per_gpu`, `expert_bytes_fraction`).
"""

import math

from core.common import cdiv, check_int
from core.errors import InvalidArgumentError
from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS, parallel_size
from core.planning.catalog.models import ModelSpec
from core.planning.catalog.weights import (
    bits_per_quantized_param,
    checkpoint_weight_bytes,
    uses_group_quantization,
)

# Bits per stored element. fp4 packs two elements per byte.
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "fp4": 4, "int4": 4}
KV_DTYPES = ("auto", "fp16", "bf16", "fp8", "int8", "fp4")
WEIGHT_DTYPES = ("auto", "fp16", "bf16", "fp8", "int8", "int4")
# Short dtype names of a checkpoint's torch_dtype (what `auto` resolves to).
COMPUTE_DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
# The one table of block sizes (tokens) that plans, the CLI and the pages offer.
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # `vllm serve --block-size` choices
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default
NON_TORCH_BYTES = 1024**3  # CUDA graphs, NCCL buffers, cuBLAS workspaces: vLLM logs show ~0.5-2 GiB
MAX_CONTEXT_TOKENS = 16_777_216  # 16Mi: Llama-4-Scout publishes 10,485,760 positions
MAX_GPUS = 4096


def resolve_kv_dtype(model: ModelSpec, kv_dtype: str = "auto") -> str:
    """The concrete KV cache dtype: `auto` is the model's compute dtype ("fp16" or "bf16", see
    `ModelSpec.compute_dtype`); any other name in KV_DTYPES is returned as is."""
    if kv_dtype not in KV_DTYPES:
        raise InvalidArgumentError(f"kv_dtype {kv_dtype!r} is not supported; allowed: {', '.join(KV_DTYPES)}")
    if kv_dtype == "auto":
        return COMPUTE_DTYPE_SHORT[model.compute_dtype]
    return kv_dtype


def check_parallelism(model: ModelSpec, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> None:
    """Raise `InvalidArgumentError` for a TP/PP layout vLLM refuses (`KVLayers.check_parallel`: tp divides
    the attention heads and divides or is a multiple of the KV heads; pp at most the layer count)."""
    model.kv_layers.check_parallel(
        parallel_size(tensor_parallel, "tensor_parallel"),
        parallel_size(pipeline_parallel, "pipeline_parallel"),
    )


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel: int = 1) -> int:
    """KV heads each TP rank stores: max(1, kv_heads // tp) (replicated when tp > kv_heads, as in vLLM).
    For MLA the single latent is replicated on every rank: 1."""
    return model.kv_layers.kv_heads_per_rank(tensor_parallel)


def layers_per_gpu(model: ModelSpec, pipeline_parallel: int = 1) -> int:
    """Layers on the largest pipeline stage: ceil(layers / pp)."""
    return cdiv(model.num_layers, pipeline_parallel)


def kv_bytes_per_token(
    model: ModelSpec, kv_dtype: str = "auto", tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> int:
    """Bytes of KV cache one token occupies on one GPU (the GPU of the largest pipeline stage).

    Standard attention: 2 (K and V) x ceil(layers / pp) x max(1, kv_heads // tp) x head_dim x dtype bytes.
    MLA (DeepSeek-V2/V3): ceil(layers / pp) x (kv_lora_rank + qk_rope_head_dim) x dtype bytes — one latent,
    no factor 2, the same on every TP rank.
    Examples: OPT-13B fp16 819,200 (800 KiB); Llama-3.1-8B bf16 131,072; DeepSeek-V3 bf16 70,272.
    """
    check_parallelism(model, tensor_parallel, pipeline_parallel)
    bits = DTYPE_BITS[resolve_kv_dtype(model, kv_dtype)]
    layers = layers_per_gpu(model, pipeline_parallel)
    if model.is_mla:
        elements = layers * (model.kv_lora_rank + model.qk_rope_head_dim)
    else:
        elements = 2 * layers * kv_heads_per_gpu(model, tensor_parallel) * model.head_dim
    return elements * bits // 8


def resolve_weight_dtype(model: ModelSpec, weight_dtype: str = "auto") -> str:
    """The stored weight dtype: `auto` is the checkpoint's (fp8 for an FP8 checkpoint, int4 for a 4-bit
    AWQ/GPTQ one, else the compute dtype: a float32 checkpoint is loaded in fp16 or bf16)."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise InvalidArgumentError(
            f"weight_dtype {weight_dtype!r} is not supported; allowed: {', '.join(WEIGHT_DTYPES)}"
        )
    if weight_dtype != "auto":
        return weight_dtype
    bits = model.quantization_bits
    if bits == 8:
        return "fp8" if model.quantization == "fp8" else "int8"
    if bits == 4:
        return "int4"
    return COMPUTE_DTYPE_SHORT[model.compute_dtype]


def check_moe_parallel(
    model: ModelSpec, tensor_parallel: int, data_parallel: int, expert_parallel: bool
) -> None:
    """Raise `InvalidArgumentError` for a data-parallel / expert-parallel layout the planner cannot serve:
    data_parallel an int in [1, MAX_GPUS]; expert_parallel a bool, for a MoE model only, with at most one GPU
    per routed expert (tp x data_parallel <= num_experts: vLLM would leave GPUs without an expert)."""
    check_int(data_parallel, "data_parallel", minimum=1, maximum=MAX_GPUS)
    if not isinstance(expert_parallel, bool):
        raise InvalidArgumentError(f"expert_parallel must be True or False, got {expert_parallel!r}")
    if not expert_parallel:
        return
    if not model.is_moe:
        raise InvalidArgumentError(
            f"expert_parallel (--enable-expert-parallel) needs a mixture-of-experts model; {model.name} is dense"
        )
    ranks = tensor_parallel * data_parallel
    if ranks > model.num_experts:
        raise InvalidArgumentError(
            f"expert_parallel over tp x data_parallel = {ranks} GPUs needs at least as many routed experts; "
            f"{model.name} has {model.num_experts}"
        )


def expert_byte_share(model: ModelSpec, weight_dtype: str = "auto") -> float:
    """The routed experts' share of the model's stored weight bytes (0 for a dense model): expert parameters x
    their stored bits over all the weights' bits. A group-quantized checkpoint (gpt-oss's MXFP4) packs the
    experts at `bits_per_quantized_param` and keeps the rest 16-bit; otherwise every weight has one dtype."""
    if not model.is_moe or not model.expert_params:
        return 0.0
    name = resolve_weight_dtype(model, weight_dtype)
    if name == resolve_weight_dtype(model, "auto") and uses_group_quantization(model):
        total, _ = checkpoint_weight_bytes(model)
        return min(1.0, model.expert_params * bits_per_quantized_param(model) / 8 / total)
    return min(1.0, model.expert_params / model.num_params)


def expert_bytes_fraction(
    model: ModelSpec, tensor_parallel: int = 1, data_parallel: int = 1, expert_parallel: bool = False
) -> float:
    """The fraction of a pipeline stage's routed-expert bytes on its most loaded GPU (module docstring): 1 / tp
    for tp alone; 1 / (tp x data_parallel) for data-parallel attention without EP (each expert split over every
    rank); ceil(E / (tp x data_parallel)) / E with expert_parallel (whole experts per GPU)."""
    ranks = tensor_parallel * data_parallel
    if expert_parallel and model.is_moe:
        return cdiv(model.num_experts, ranks) / model.num_experts
    return 1.0 / ranks


def weight_bytes_per_gpu(
    model: ModelSpec,
    weight_dtype: str = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    data_parallel: int = 1,
    expert_parallel: bool = False,
) -> int:
    """Weight bytes on the most loaded GPU.

    Pipeline stages hold ceil(layers / pp) decoder layers; the first also holds the token embedding and the
    last the LM head (the embedding matrix again when tied). Everything is split evenly over the TP ranks
    (vLLM shards the vocabulary too); norms, which TP replicates, are negligible. Quantization scales are not
    counted (under 1% for block-wise FP8). With the checkpoint's own dtype, a known checkpoint size (safetensors
    index) or a group-quantized checkpoint (mxfp4, AWQ, GPTQ, compressed-tensors int4) uses
    `checkpoint_weight_bytes`, shared over the stage in proportion to its parameters.
    data_parallel / expert_parallel (a MoE model's DP ranks, module docstring): the stage's routed-expert bytes
    (`expert_byte_share`) are spread by `expert_bytes_fraction`, the rest split over tp; for a dense model, or
    for a MoE model with data_parallel 1 and no EP, everything is split over tp as before. Example:
    Qwen3-235B-A22B in bf16 on tp 8 with EP holds 16 of its 128 experts per GPU.
    """
    check_parallelism(model, tensor_parallel, pipeline_parallel)
    check_moe_parallel(model, tensor_parallel, data_parallel, expert_parallel)
    if data_parallel == 1 and not expert_parallel:
        return math.ceil(_stage_weight_bytes(model, weight_dtype, pipeline_parallel) / tensor_parallel)
    dense, experts = weight_split_per_gpu(
        model, weight_dtype, tensor_parallel, pipeline_parallel, data_parallel, expert_parallel
    )
    return math.ceil(dense + experts)


def _stage_weight_bytes(model: ModelSpec, weight_dtype: str, pipeline_parallel: int) -> float:
    """Bytes of the largest pipeline stage's weights before any tensor-parallel split (`weight_bytes_per_gpu`)."""
    name = resolve_weight_dtype(model, weight_dtype)
    if pipeline_parallel == 1:
        params = model.num_params
    else:
        stage_layers = layers_per_gpu(model, pipeline_parallel) * model.layer_params
        head = model.lm_head_params or model.embedding_params
        params = stage_layers + max(model.embedding_params, head)
    if name == resolve_weight_dtype(model, "auto") and (
        model.checkpoint_bytes is not None or uses_group_quantization(model)
    ):
        return checkpoint_weight_bytes(model)[0] * min(1.0, params / model.num_params)
    return params * DTYPE_BITS[name] / 8


def weight_split_per_gpu(
    model: ModelSpec,
    weight_dtype: str = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    data_parallel: int = 1,
    expert_parallel: bool = False,
) -> tuple[float, float]:
    """(dense bytes, routed-expert bytes) on the most loaded GPU, unrounded: the stage's bytes outside the
    routed experts over tp, and its expert bytes (`expert_byte_share`) x `expert_bytes_fraction`; (all / tp, 0)
    for a dense model. Their sum, rounded up, is `weight_bytes_per_gpu`."""
    check_parallelism(model, tensor_parallel, pipeline_parallel)
    check_moe_parallel(model, tensor_parallel, data_parallel, expert_parallel)
    stage = _stage_weight_bytes(model, weight_dtype, pipeline_parallel)
    share = expert_byte_share(model, weight_dtype)
    fraction = expert_bytes_fraction(model, tensor_parallel, data_parallel, expert_parallel)
    return stage * (1.0 - share) / tensor_parallel, stage * share * fraction


def estimate_activation_bytes(
    model: ModelSpec,
    tensor_parallel: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> int:
    """An estimate of what vLLM's profiling run reserves beside weights and KV, per GPU, in bytes.

    = max_num_batched_tokens x (2 x hidden + 3 x intermediate / tp) x 2 bytes   (residual stream + gated MLP
      intermediates of one forward pass over the token budget, in 16-bit)
    + max_num_seqs x vocab x 4 bytes                                             (fp32 logits for sampling)
    + NON_TORCH_BYTES (1 GiB: CUDA graphs, NCCL and cuBLAS buffers).
    The real figure is measured by vLLM at start-up ("activation peak" in its log); pass `activation_reserve`
    to `plan` to use it.
    """
    per_token = 2 * model.hidden_size + 3 * model.intermediate_size / tensor_parallel
    return int(max_num_batched_tokens * per_token * 2 + max_num_seqs * model.vocab_size * 4 + NON_TORCH_BYTES)


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks a sequence of `num_tokens` tokens holds: ceil(num_tokens / block_size)."""
    return cdiv(num_tokens, block_size)


def kv_capacity(kv_budget_bytes: float, block_bytes: int) -> int:
    """Blocks that fit in a KV budget: floor(budget / block_bytes), never negative (vLLM's rule)."""
    block_bytes = check_int(block_bytes, "block_bytes", minimum=1)
    return max(0, int(kv_budget_bytes // block_bytes))
