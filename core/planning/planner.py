"""Capacity planning: KV bytes per token, vLLM's KV budget, blocks, concurrency and a decode roofline.

Every number is per GPU unless its name says otherwise. Units are in the names: `_bytes`, `_tokens`,
`_blocks`, `_s` (seconds), `_per_s`.
"""

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.hardware import GPUSpec
from core.planning.models import ModelSpec

# Bits per stored element. fp4 packs two elements per byte.
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "fp4": 4, "int4": 4}
KV_DTYPES = ("auto", "fp16", "bf16", "fp8", "int8", "fp4")
_TORCH_TO_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def resolve_kv_dtype(model: ModelSpec, kv_dtype: str = "auto") -> str:
    """The concrete KV cache dtype: `auto` is the model's compute dtype ("fp16" or "bf16", see
    `ModelSpec.compute_dtype`); any other name in KV_DTYPES is returned as is."""
    if kv_dtype not in KV_DTYPES:
        raise InvalidArgumentError(f"kv_dtype {kv_dtype!r} is not supported; allowed: {', '.join(KV_DTYPES)}")
    if kv_dtype == "auto":
        return _TORCH_TO_SHORT[model.compute_dtype]
    return kv_dtype


def check_parallelism(model: ModelSpec, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> None:
    """Raise `InvalidArgumentError` for a TP/PP layout vLLM refuses.

    vLLM requires num_attention_heads % tp == 0; KV heads are split when tp divides them and replicated when
    tp is a multiple of them (other combinations are refused); pp may not exceed the layer count.
    """
    for name, value in (("tensor_parallel", tensor_parallel), ("pipeline_parallel", pipeline_parallel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    if tensor_parallel > 1024 or pipeline_parallel > 1024:
        raise InvalidArgumentError("tensor_parallel and pipeline_parallel are limited to 1,024")
    if model.num_attention_heads % tensor_parallel:
        raise InvalidArgumentError(
            f"{model.name} has {model.num_attention_heads} attention heads, not divisible by tensor_parallel="
            f"{tensor_parallel} (vLLM requires it)"
        )
    kv = model.num_kv_heads
    if not model.is_mla and kv % tensor_parallel and tensor_parallel % kv:
        raise InvalidArgumentError(
            f"{model.name} has {kv} KV heads: tensor_parallel={tensor_parallel} must divide them or be a "
            "multiple of them"
        )
    if pipeline_parallel > model.num_layers:
        raise InvalidArgumentError(
            f"pipeline_parallel={pipeline_parallel} exceeds the {model.num_layers} layers of {model.name}"
        )


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel: int = 1) -> int:
    """KV heads each TP rank stores: max(1, kv_heads // tp) (replicated when tp > kv_heads, as in vLLM).
    For MLA the single latent is replicated on every rank: 1."""
    if model.is_mla:
        return 1
    return max(1, model.num_kv_heads // tensor_parallel)


def layers_per_gpu(model: ModelSpec, pipeline_parallel: int = 1) -> int:
    """Layers on the largest pipeline stage: ceil(layers / pp)."""
    return math.ceil(model.num_layers / pipeline_parallel)


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


# --------------------------------------------------------------------------------------------------------------
# Weights, activations and the KV budget (vLLM's rule)
# --------------------------------------------------------------------------------------------------------------

WEIGHT_DTYPES = ("auto", "fp16", "bf16", "fp8", "int8", "int4")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # `vllm serve --block-size` choices
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM V1's default chunked-prefill token budget for `vllm serve`
NON_TORCH_BYTES = 1024**3  # CUDA graphs, NCCL buffers, cuBLAS workspaces: vLLM logs show ~0.5-2 GiB
MAX_CONTEXT_TOKENS = 16_777_216  # 16Mi: Llama-4-Scout publishes 10,485,760 positions
MAX_GPUS = 4096


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
    return _TORCH_TO_SHORT[model.compute_dtype]


def weight_bytes_per_gpu(
    model: ModelSpec, weight_dtype: str = "auto", tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> int:
    """Weight bytes on the most loaded GPU.

    Pipeline stages hold ceil(layers / pp) decoder layers; the first also holds the token embedding and the
    last the LM head (the embedding matrix again when tied). Everything is split evenly over the TP ranks
    (vLLM shards the vocabulary too); norms, which TP replicates, are negligible. Quantization scales are not
    counted (under 1% for block-wise FP8).
    """
    from core.planning.weights import checkpoint_weight_bytes, uses_group_quantization

    check_parallelism(model, tensor_parallel, pipeline_parallel)
    name = resolve_weight_dtype(model, weight_dtype)
    bits = DTYPE_BITS[name]
    if pipeline_parallel == 1:
        params = model.num_params
    else:
        stage_layers = layers_per_gpu(model, pipeline_parallel) * model.layer_params
        head = model.lm_head_params or model.embedding_params
        params = stage_layers + max(model.embedding_params, head)
    if name == resolve_weight_dtype(model, "auto") and (
        model.checkpoint_bytes is not None or uses_group_quantization(model)
    ):
        # The checkpoint's own bytes (exact from a safetensors index, or the group-quantized estimate),
        # shared over the stage in proportion to its parameters.
        total, _ = checkpoint_weight_bytes(model)
        return math.ceil(total * min(1.0, params / model.num_params) / tensor_parallel)
    return math.ceil(params * bits / 8 / tensor_parallel)


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
    return -(-num_tokens // block_size)


def kv_capacity(kv_budget_bytes: float, block_bytes: int) -> int:
    """Blocks that fit in a KV budget: floor(budget / block_bytes), never negative (vLLM's rule)."""
    if block_bytes < 1:
        raise InvalidArgumentError(f"block_bytes must be >= 1, got {block_bytes}")
    return max(0, int(kv_budget_bytes // block_bytes))


@dataclass(frozen=True)
class CapacityPlan:
    """What fits on one model replica (tp x pp GPUs); per-GPU figures are for the most loaded GPU.

    Bytes are bytes; `*_tokens` are token slots; `num_blocks` counts blocks of `block_size` slots.
    kv_budget_bytes = gpu_memory_bytes x gpu_memory_utilization - weights_bytes - activation_bytes
    (negative when the model does not fit at all); num_blocks = max(0, kv_budget_bytes // block_bytes);
    kv_tokens = num_blocks x block_size; max_concurrency = num_blocks // ceil(context_len / block_size)
    (requests of `context_len` tokens held at once by one replica); replicas = num_gpus // (tp x pp) copies
    of the model serve in parallel (data parallel). Decode figures are estimates from a roofline.
    """

    model: str
    gpu: str
    num_gpus: int
    tensor_parallel: int
    pipeline_parallel: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    gpu_memory_utilization: float
    block_size: int
    max_model_len: int
    context_len: int
    max_num_seqs: int
    gpu_memory_bytes: int
    usable_bytes: int
    weights_bytes: int
    activation_bytes: int
    activation_estimated: bool
    kv_budget_bytes: int
    kv_bytes_per_token: int
    block_bytes: int
    num_blocks: int
    kv_tokens: int
    per_request_bytes: int
    max_concurrency: int
    max_concurrency_total: int
    vllm_max_concurrency: float
    fits: bool
    verdict: str
    max_fitting_model_len: int | None
    min_tensor_parallel: int | None
    decode_batch: int
    decode_step_s: float | None
    decode_tokens_per_s: float | None
    decode_bound: str | None
    notes: tuple[str, ...] = ()
    vllm_command: str = ""
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    hybrid_kv_cache_manager: bool = True
    kv_layout: Any = None  # the KVCacheLayout behind num_blocks / kv_tokens / concurrency

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        return data


def _check_number(value: Any, name: str, low: float, high: float, integer: bool = True) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
    ):
        kind = "an integer" if integer else "a number"
        raise InvalidArgumentError(f"{name} must be {kind}, got {value!r}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be between {low:,} and {high:,}, got {value:,}")


def _fit_tp(model: ModelSpec, gpu: GPUSpec, utilization: float, bits: int, pp: int) -> int | None:
    """Smallest valid tensor-parallel size whose weights alone fit in the usable memory (None if none <= 64)."""
    for tp in (1, 2, 4, 8, 16, 32, 64):
        try:
            check_parallelism(model, tp, pp)
        except InvalidArgumentError:
            continue
        if model.num_params * bits / 8 / tp / pp < gpu.memory_bytes * utilization * 0.95:
            return tp
    return None


def plan(
    model: ModelSpec,
    gpu: GPUSpec,
    num_gpus: int | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    weight_dtype: str = "auto",
    kv_dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    max_model_len: int | None = None,
    activation_reserve: int | None = None,
    context_len: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    hybrid_kv_cache_manager: bool = True,
) -> CapacityPlan:
    """Plan a deployment of `model` on `num_gpus` x `gpu` (default tp x pp) with vLLM's memory rules.

    max_model_len: the longest request (tokens), default the model's max_position_embeddings.
    context_len: the request length the concurrency figures are for (default max_model_len).
    activation_reserve: bytes per GPU for the profiled activation peak (default: `estimate_activation_bytes`).
    The plan does not fit when the weights and activations leave no KV budget (then `min_tensor_parallel`
    suggests a TP size whose weights fit), or when one `max_model_len` request needs more blocks than the
    budget holds (vLLM refuses to start; `max_fitting_model_len` is then the longest that would).
    Blocks, tokens and concurrency follow vLLM V1's KV cache layout (`kv_cache_layout`): for a hybrid model
    (sliding-window, chunked-local or Mamba layers) one block spans a group of layers and a request's blocks
    are summed over the groups; max_num_batched_tokens bounds the window groups and
    `hybrid_kv_cache_manager=False` counts windowed layers as full attention (--disable-hybrid-kv-cache-manager).
    Raises `InvalidArgumentError` for bad arguments (message says what is allowed).
    """
    from core.planning.kv_layout import kv_cache_layout, longest_fitting_len, request_blocks

    check_parallelism(model, tensor_parallel, pipeline_parallel)
    per_replica = tensor_parallel * pipeline_parallel
    if num_gpus is None:
        num_gpus = per_replica
    _check_number(num_gpus, "num_gpus", 1, MAX_GPUS)
    if num_gpus % per_replica:
        raise InvalidArgumentError(
            f"num_gpus={num_gpus} is not a multiple of tensor_parallel x pipeline_parallel = {per_replica}"
        )
    replicas = num_gpus // per_replica
    _check_number(gpu_memory_utilization, "gpu_memory_utilization", 0.01, 1.0, integer=False)
    if block_size not in BLOCK_SIZES:
        raise InvalidArgumentError(
            f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))} tokens, got {block_size!r}"
        )
    if max_model_len is None:
        max_model_len = model.max_position_embeddings
    _check_number(max_model_len, "max_model_len", 1, MAX_CONTEXT_TOKENS)
    if max_model_len > model.max_position_embeddings:
        raise InvalidArgumentError(
            f"max_model_len {max_model_len:,} exceeds {model.name}'s max_position_embeddings "
            f"{model.max_position_embeddings:,} (vLLM refuses it)"
        )
    if context_len is None:
        context_len = max_model_len
    _check_number(context_len, "context_len", 1, max_model_len)
    _check_number(max_num_seqs, "max_num_seqs", 1, 65_536)
    _check_number(max_num_batched_tokens, "max_num_batched_tokens", 1, MAX_CONTEXT_TOKENS)

    weight_name = resolve_weight_dtype(model, weight_dtype)
    kv_name = resolve_kv_dtype(model, kv_dtype)
    weights = weight_bytes_per_gpu(model, weight_name, tensor_parallel, pipeline_parallel)
    activation_estimated = activation_reserve is None
    if activation_reserve is None:
        activation_reserve = estimate_activation_bytes(
            model, tensor_parallel, max_num_batched_tokens, max_num_seqs
        )
    _check_number(activation_reserve, "activation_reserve (bytes)", 0, 1024 * 1024**4)
    activation_reserve = int(activation_reserve)

    usable = int(gpu.memory_bytes * gpu_memory_utilization)
    kv_budget = usable - weights - activation_reserve
    per_token = kv_bytes_per_token(model, kv_name, tensor_parallel, pipeline_parallel)
    layout = kv_cache_layout(
        model,
        max(0, int(kv_budget)),
        max_model_len=max_model_len,
        block_size=block_size,
        kv_dtype=kv_name,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        max_num_batched_tokens=max_num_batched_tokens,
        hybrid_kv_cache_manager=hybrid_kv_cache_manager,
    )
    block_bytes = layout.block_bytes
    num_blocks = layout.num_blocks
    # One group of one block size: every slot is a token slot; otherwise the tokens of max_model_len requests.
    single = len(layout.groups) == 1 and layout.groups[0].kind != "mamba"
    kv_tokens = num_blocks * layout.block_size if single else layout.kv_tokens
    context_blocks = request_blocks(layout, context_len)
    max_concurrency = num_blocks // context_blocks
    vllm_concurrency = layout.max_concurrency

    min_tp = None
    max_fit_len = None
    gib = 1024**3
    if kv_budget <= 0 or num_blocks == 0:
        fits = False
        min_tp = _fit_tp(model, gpu, gpu_memory_utilization, DTYPE_BITS[weight_name], pipeline_parallel)
        verdict = (
            f"Does not fit: weights {weights / gib:,.1f} GiB + activations {activation_reserve / gib:,.1f} GiB per "
            f"GPU leave no room for the KV cache in {usable / gib:,.1f} GiB usable "
            f"({gpu_memory_utilization:.0%} of {gpu.memory_bytes / gib:,.1f} GiB)."
        )
        if min_tp is not None and min_tp > tensor_parallel:
            verdict += f" Weights alone would fit with tensor_parallel >= {min_tp}."
        elif weight_name not in ("fp8", "int8", "int4"):
            verdict += " Try more GPUs or fp8 weights."
    elif layout.blocks_per_request > num_blocks:
        fits = False
        max_fit_len = longest_fitting_len(layout, model.max_position_embeddings)
        verdict = (
            f"Does not fit at max_model_len={max_model_len:,}: one request needs "
            f"{layout.blocks_per_request:,} blocks but the KV budget holds {num_blocks:,} "
            f"({num_blocks * layout.block_size:,} tokens). The largest max_model_len that fits is {max_fit_len:,}."
        )
    else:
        fits = True
        verdict = (
            f"Fits: {kv_tokens:,} KV tokens ({num_blocks:,} blocks) per replica; {max_concurrency:,} requests of "
            f"{context_len:,} tokens at once"
            + (
                f" per replica, {max_concurrency * replicas:,} over {replicas} replicas."
                if replicas > 1
                else "."
            )
        )

    decode_batch = max(1, min(max_concurrency, max_num_seqs)) if fits else 0
    step = tokens_per_s = bound = None
    if fits:
        step, bound = decode_step_estimate(
            model, gpu, decode_batch, context_len, weight_name, kv_name, tensor_parallel, pipeline_parallel
        )
        tokens_per_s = decode_batch / step * replicas

    notes = []
    if activation_estimated:
        notes.append(
            "Activation reserve is an estimate (token budget x hidden/MLP width, fp32 logits, 1 GiB non-torch); "
            "vLLM measures it at start-up."
        )
    notes += _layout_notes(model, layout)
    if model.checkpoint_bytes is not None and weight_name == resolve_weight_dtype(model, "auto"):
        notes.append(f"Weights: the checkpoint's exact {model.checkpoint_bytes:,} B (safetensors index).")
    elif model.quantization in ("mxfp4", "awq", "gptq", "compressed-tensors") and weight_name == "int4":
        notes.append(
            f"Weights are an estimate from quantization_config ({model.quantization}: packed 4-bit weights with "
            "group scales, embedding, LM head and unquantized modules in 16-bit); a safetensors index gives "
            "the exact size."
        )
    if kv_name in ("int8", "fp4"):
        notes.append(f"{kv_name} is not a vLLM --kv-cache-dtype choice; it is shown for comparison.")
    if block_size not in VLLM_BLOCK_SIZES:
        notes.append(f"block_size {block_size} is not a vLLM --block-size choice ({VLLM_BLOCK_SIZES}).")
    if fits:
        notes.append(
            "Decode throughput is an estimate: a roofline upper bound (weights + KV read per step over memory "
            "bandwidth, or FLOPs over peak), with no scheduling, sampling or kernel overheads."
        )

    result = CapacityPlan(
        model=model.name,
        gpu=gpu.name,
        num_gpus=num_gpus,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        replicas=replicas,
        weight_dtype=weight_name,
        kv_dtype=kv_name,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=block_size,
        max_model_len=max_model_len,
        context_len=context_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_bytes=gpu.memory_bytes,
        usable_bytes=usable,
        weights_bytes=weights,
        activation_bytes=activation_reserve,
        activation_estimated=activation_estimated,
        kv_budget_bytes=kv_budget,
        kv_bytes_per_token=per_token,
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        kv_tokens=kv_tokens,
        per_request_bytes=context_blocks * block_bytes,
        max_concurrency=max_concurrency,
        max_concurrency_total=max_concurrency * replicas,
        vllm_max_concurrency=vllm_concurrency,
        fits=fits,
        verdict=verdict,
        max_fitting_model_len=max_fit_len,
        min_tensor_parallel=min_tp,
        decode_batch=decode_batch,
        decode_step_s=step,
        decode_tokens_per_s=tokens_per_s,
        decode_bound=bound,
        notes=tuple(notes),
        max_num_batched_tokens=max_num_batched_tokens,
        hybrid_kv_cache_manager=hybrid_kv_cache_manager,
        kv_layout=layout,
    )
    return replace(result, vllm_command=vllm_serve_command(result, model))


def _layout_notes(model: ModelSpec, layout: Any) -> list[str]:
    """Notes on a hybrid model's KV cache groups (none for a model with one kind of layer)."""
    if not model.is_hybrid and len(layout.groups) == 1 and layout.groups[0].kind in ("full", "mla"):
        return []
    parts = ", ".join(
        f"{len(g.layers)} {g.kind.replace('_', ' ')}"
        + (f" (window {g.window:,})" if g.window else "")
        + f": {blocks:,} blocks"
        for g, blocks in zip(layout.groups, layout.group_blocks, strict=True)
    )
    notes = [
        f"vLLM's KV cache groups (hybrid manager {'on' if layout.hybrid_kv_cache_manager else 'off'}): {parts} "
        f"per {layout.max_model_len:,}-token request; one block id spans {layout.group_size} layers of every group"
        + (f", {layout.padding_layers} padding layers" if layout.padding_layers else "")
        + f". Window groups are sized for {layout.max_num_batched_tokens:,} tokens in flight per step (async "
        "scheduling doubles it)."
    ]
    if layout.hybrid_kv_cache_manager and any(g.kind == "chunked_local" for g in layout.groups):
        notes.append(
            "vLLM versions where VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 0 turn the hybrid "
            "KV cache manager off by themselves for chunked local attention: set it to 1, or expect the figures "
            "of --disable-hybrid-kv-cache-manager."
        )
    if any(g.kind == "mamba" for g in layout.groups) and len(layout.groups) > 1:
        notes.append(
            f"Attention block size raised to {layout.block_size} tokens so one page holds a Mamba state, as vLLM does."
        )
    return notes


# --------------------------------------------------------------------------------------------------------------
# Decode roofline
# --------------------------------------------------------------------------------------------------------------


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
    """
    if batch < 1 or context_len < 1:
        raise InvalidArgumentError(f"batch and context_len must be >= 1, got {batch}, {context_len}")
    micro = max(1, math.ceil(batch / pipeline_parallel))
    weights = pipeline_parallel * weight_bytes_read_per_step(
        model, micro, weight_dtype, tensor_parallel, pipeline_parallel
    )
    from core.planning.kv_layout import kv_read_bytes_per_sequence

    kv = batch * kv_read_bytes_per_sequence(
        model,
        context_len,
        kv_dtype=kv_dtype,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    memory_s = (weights + kv) / gpu.memory_bandwidth
    compute_s = 0.0
    if gpu.peak_bf16_flops:
        compute_s = (
            2 * model.num_params_active * batch / (tensor_parallel * pipeline_parallel) / gpu.peak_bf16_flops
        )
    return (memory_s, "memory") if memory_s >= compute_s else (compute_s, "compute")


# --------------------------------------------------------------------------------------------------------------
# Concurrency vs context, and the vllm serve command
# --------------------------------------------------------------------------------------------------------------


def concurrency_vs_context(capacity: CapacityPlan, contexts: Sequence[int]) -> list[int]:
    """Requests of each context length (tokens) the whole deployment holds at once:
    replicas x (num_blocks // ceil(context / block_size))."""
    from core.planning.kv_layout import request_blocks

    out = []
    for context in contexts:
        _check_number(int(context), "context length", 1, MAX_CONTEXT_TOKENS)
        if capacity.kv_layout is not None:
            blocks = request_blocks(capacity.kv_layout, int(context))
        else:
            blocks = blocks_for_tokens(int(context), capacity.block_size)
        out.append(capacity.num_blocks // blocks * capacity.replicas)
    return out


def vllm_serve_command(capacity: CapacityPlan, model: ModelSpec) -> str:
    """The `vllm serve` flags matching the plan. max-num-seqs is the plan's scheduler cap (vLLM's default 256
    unless chosen), not the number of full-length requests that fit: with paging, shorter requests share the
    cache, and vLLM's scheduler admits them while blocks remain."""
    kv_flag = {"fp8": "fp8"}.get(capacity.kv_dtype, "auto")
    comments = []
    checkpoint_weights = resolve_weight_dtype(model, "auto")
    quantize = None
    if capacity.weight_dtype != checkpoint_weights:
        if capacity.weight_dtype == "fp8":
            quantize = "--quantization fp8"  # vLLM quantizes a 16-bit checkpoint to FP8 at load time
        else:
            comments.append(
                f"# {capacity.weight_dtype} weights need a checkpoint stored that way (the preset's is "
                f"{checkpoint_weights}), e.g. a GPTQ/AWQ/W8A8 export of {model.name}"
            )
    if capacity.kv_dtype in ("int8", "fp4"):
        comments.append(
            f"# {capacity.kv_dtype} KV cache is not a vLLM --kv-cache-dtype choice: with auto, vLLM holds fewer "
            "tokens than this plan"
        )
    parts = [
        f"vllm serve {model.hf_repo or model.name}",
        f"--tensor-parallel-size {capacity.tensor_parallel}",
    ]
    if capacity.pipeline_parallel > 1:
        parts.append(f"--pipeline-parallel-size {capacity.pipeline_parallel}")
    if capacity.replicas > 1:
        parts.append(f"--data-parallel-size {capacity.replicas}")
    if capacity.kv_dtype in ("fp16", "bf16") and capacity.kv_dtype != _TORCH_TO_SHORT[model.compute_dtype]:
        parts.append(f"--dtype {'float16' if capacity.kv_dtype == 'fp16' else 'bfloat16'}")
    if quantize:
        parts.append(quantize)
    parts += [
        f"--kv-cache-dtype {kv_flag}",
        f"--gpu-memory-utilization {capacity.gpu_memory_utilization:g}",
        f"--max-model-len {capacity.max_fitting_model_len or capacity.max_model_len}",
        f"--block-size {capacity.block_size}",
        f"--max-num-seqs {capacity.max_num_seqs}",
    ]
    if capacity.max_num_batched_tokens != DEFAULT_MAX_NUM_BATCHED_TOKENS:
        parts.append(f"--max-num-batched-tokens {capacity.max_num_batched_tokens}")
    if not capacity.hybrid_kv_cache_manager:
        parts.append("--disable-hybrid-kv-cache-manager")
    return "\n".join([*comments, " \\\n  ".join(parts)])


# --------------------------------------------------------------------------------------------------------------
# Workload-aware what-if: paged vs contiguous reservation, internal fragmentation vs block size
# --------------------------------------------------------------------------------------------------------------


def request_lengths(requests: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_lens, output_lens) as int64 arrays from (prompt_len, output_len) pairs or objects with
    `prompt_len` and `output_len` attributes (e.g. `core.serving.workload.Request`). Every length must be >= 1."""
    items = list(requests)
    try:  # fast path: one array conversion, validated as a whole
        pairs = [(r.prompt_len, r.output_len) for r in items] if hasattr(items[0], "prompt_len") else items
        array = np.asarray(pairs)
        if array.ndim == 2 and array.shape[1] == 2 and array.dtype.kind in "iu" and (array >= 1).all():
            array = array.astype(np.int64)
            return array[:, 0].copy(), array[:, 1].copy()
    except (AttributeError, IndexError, TypeError, ValueError):
        pass
    return _request_lengths_checked(items)


def _request_lengths_checked(items: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The slow path of `request_lengths`: item by item, raising for the first bad one."""
    prompts, outputs = [], []
    for item in items:
        if hasattr(item, "prompt_len"):
            prompt, output = item.prompt_len, item.output_len
        else:
            try:
                prompt, output = item
            except (TypeError, ValueError):
                raise InvalidArgumentError(
                    f"a request must be (prompt_len, output_len) or have those attributes, got {item!r}"
                ) from None
        for name, value in (("prompt_len", prompt), ("output_len", output)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1 token, got {value!r}")
        prompts.append(int(prompt))
        outputs.append(int(output))
    if not prompts:
        raise InvalidArgumentError("the workload has no requests")
    return np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)


def _sum_ceil(n: np.ndarray, block_size: int) -> np.ndarray:
    """sum over x = 1..n of ceil(x / block_size), elementwise; 0 for n = 0."""
    q, r = np.divmod(n, block_size)
    return block_size * q * (q + 1) // 2 + r * (q + 1)


def _time_averages(prompts: np.ndarray, outputs: np.ndarray, block_size: int) -> tuple[float, float]:
    """(mean tokens held, mean blocks held) by a running request, averaged over its decode steps.

    A request of prompt p and output o runs for o steps; during step t (t = 1..o) it holds p + t tokens in
    ceil((p + t) / block_size) blocks. Requests are weighted by their o steps (time in the batch).
    """
    steps = outputs.sum()
    end = prompts + outputs
    tokens = ((end * (end + 1) - prompts * (prompts + 1)) // 2).sum()
    blocks = (_sum_ceil(end, block_size) - _sum_ceil(prompts, block_size)).sum()
    return float(tokens / steps), float(blocks / steps)


@dataclass(frozen=True)
class WorkloadWhatIf:
    """Average concurrency of a saturated replica for a workload (requests held at once, memory-bound).

    mean_tokens_held / mean_blocks_held: time-averaged over each request's decode steps (see
    `_time_averages`). paged_concurrency = min(max_num_seqs, kv_tokens / (mean_blocks_held x block_size));
    contiguous_concurrency = min(max_num_seqs, kv_tokens // reservation_tokens), each request reserving
    `reservation_tokens` (max_model_len) for its whole life; oracle_concurrency reserves exactly
    prompt + output (Orca-Oracle). The `*_memory_concurrency` fields are the same without the max_num_seqs
    cap: what the KV cache alone would hold. paged_over_contiguous is None when not even one
    contiguous reservation fits. internal_fragmentation = 1 - mean_tokens_held / (mean_blocks_held x
    block_size): the share of allocated paged slots holding no token. kv_used_bytes: KV blocks the paged
    requests hold (per GPU), internal_fragmentation_bytes the part of it that is empty slots.
    """

    num_requests: int
    mean_prompt_len: float
    mean_output_len: float
    mean_tokens_held: float
    mean_blocks_held: float
    reservation_tokens: int
    paged_concurrency: float
    contiguous_concurrency: float
    oracle_concurrency: float
    paged_memory_concurrency: float
    contiguous_memory_concurrency: int
    oracle_memory_concurrency: float
    paged_over_contiguous: float | None
    internal_fragmentation: float
    kv_used_bytes: int
    internal_fragmentation_bytes: int
    limited_by: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def workload_what_if(
    capacity: CapacityPlan, requests: Iterable[Any], reservation_tokens: int | None = None
) -> WorkloadWhatIf:
    """Paged vs contiguous concurrency for `requests` on one replica of `capacity` (see `WorkloadWhatIf`).

    reservation_tokens: what a contiguous allocator reserves per request (default the plan's max_model_len).
    Requests longer than max_model_len are refused with `InvalidArgumentError`.
    """
    prompts, outputs = request_lengths(requests)
    longest = int((prompts + outputs).max())
    if longest > capacity.max_model_len:
        raise InvalidArgumentError(
            f"the workload has a request of {longest:,} tokens, longer than max_model_len "
            f"{capacity.max_model_len:,}"
        )
    reservation = capacity.max_model_len if reservation_tokens is None else reservation_tokens
    _check_number(reservation, "reservation_tokens", longest, MAX_CONTEXT_TOKENS)
    bs = capacity.block_size
    tokens_held, blocks_held = _time_averages(prompts, outputs, bs)
    exact_held = float(
        ((prompts + outputs) * outputs).sum() / outputs.sum()
    )  # oracle reserves p + o all along
    cap = capacity.max_num_seqs
    memory_paged = capacity.kv_tokens / (blocks_held * bs)
    paged = min(cap, memory_paged)
    contiguous = min(cap, capacity.kv_tokens // reservation)
    oracle = min(cap, capacity.kv_tokens / exact_held)
    fragmentation = 1 - tokens_held / (blocks_held * bs)
    used_blocks = min(capacity.num_blocks, paged * blocks_held)
    used_bytes = int(used_blocks * capacity.block_bytes)
    return WorkloadWhatIf(
        num_requests=len(prompts),
        mean_prompt_len=float(prompts.mean()),
        mean_output_len=float(outputs.mean()),
        mean_tokens_held=tokens_held,
        mean_blocks_held=blocks_held,
        reservation_tokens=int(reservation),
        paged_concurrency=float(paged),
        contiguous_concurrency=float(contiguous),
        oracle_concurrency=float(oracle),
        paged_memory_concurrency=float(memory_paged),
        contiguous_memory_concurrency=int(capacity.kv_tokens // reservation),
        oracle_memory_concurrency=float(capacity.kv_tokens / exact_held),
        paged_over_contiguous=float(paged / contiguous) if contiguous else None,
        internal_fragmentation=float(fragmentation),
        kv_used_bytes=used_bytes,
        internal_fragmentation_bytes=int(used_bytes * fragmentation),
        limited_by="max_num_seqs" if memory_paged > cap else "kv cache",
    )


def fragmentation_by_block_size(
    requests: Iterable[Any], block_sizes: Sequence[int] = BLOCK_SIZES
) -> list[dict[str, float]]:
    """Internal fragmentation of paged allocation for each block size (time-averaged, as in `WorkloadWhatIf`):
    [{"block_size", "mean_blocks_held", "internal_fragmentation" (0..1), "wasted_slots" (per request)}]."""
    prompts, outputs = request_lengths(requests)
    rows = []
    for bs in block_sizes:
        _check_number(bs, "block_size", 1, 65_536)
        tokens_held, blocks_held = _time_averages(prompts, outputs, bs)
        rows.append(
            {
                "block_size": int(bs),
                "mean_blocks_held": blocks_held,
                "internal_fragmentation": 1 - tokens_held / (blocks_held * bs),
                "wasted_slots": blocks_held * bs - tokens_held,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------------------
# Command line: python -m core.planning.planner --model llama-3.1-70b --gpu h100-80gb --tp 4 --kv-dtype fp8 [--json]
# --------------------------------------------------------------------------------------------------------------


def plan_table(capacity: CapacityPlan) -> str:
    """The plan as an aligned text table (GiB are binary, 1 GiB = 1,073,741,824 bytes)."""
    gib = 1024**3

    def size(value: float) -> str:
        return f"{value / gib:,.2f} GiB ({value:,.0f} B)"

    rows = [
        ("model", capacity.model),
        ("GPUs", f"{capacity.num_gpus} x {capacity.gpu} (tp {capacity.tensor_parallel}, pp "
                 f"{capacity.pipeline_parallel}, {capacity.replicas} replica(s))"),
        ("dtypes", f"weights {capacity.weight_dtype}, KV cache {capacity.kv_dtype}"),
        ("GPU memory", size(capacity.gpu_memory_bytes)),
        (f"usable (x {capacity.gpu_memory_utilization:g})", size(capacity.usable_bytes)),
        ("weights per GPU", size(capacity.weights_bytes)),
        ("activations per GPU" + (" (estimate)" if capacity.activation_estimated else ""),
         size(capacity.activation_bytes)),
        ("KV budget per GPU", size(capacity.kv_budget_bytes)),
        ("KV bytes per token per GPU", f"{capacity.kv_bytes_per_token:,} B"),
        (f"block bytes ({capacity.block_size} tokens)", f"{capacity.block_bytes:,} B"),
        ("KV blocks", f"{capacity.num_blocks:,}"),
        ("KV tokens", f"{capacity.kv_tokens:,}"),
        (f"bytes per {capacity.context_len:,}-token request", size(capacity.per_request_bytes)),
        (f"max concurrency at {capacity.context_len:,} tokens",
         f"{capacity.max_concurrency:,} per replica, {capacity.max_concurrency_total:,} total"),
        ("decode estimate (roofline upper bound)",
         f"{capacity.decode_tokens_per_s:,.0f} tokens/s at batch {capacity.decode_batch:,} ({capacity.decode_bound}-bound)"
         if capacity.decode_tokens_per_s else "n/a"),
        ("verdict", capacity.verdict),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"note: {note}" for note in capacity.notes]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from core.planning.hardware import GPUS
    from core.planning.models import MODELS

    parser = argparse.ArgumentParser(
        prog="python -m core.planning.planner",
        description="KV cache capacity plan for vLLM-style paged serving.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default="llama-3.1-70b", help=f"preset: {', '.join(MODELS)}")
    source.add_argument("--config", help="path of a Hugging Face config.json (instead of --model)")
    parser.add_argument("--num-params", type=float, help="parameter count for --config (default: estimated)")
    parser.add_argument("--gpu", default="h100-80gb", help=f"preset: {', '.join(GPUS)}")
    parser.add_argument("--gpu-memory-gib", type=float, help="custom GPU memory in GiB (overrides --gpu)")
    parser.add_argument("--gpu-bandwidth-gbps", type=float, help="custom GPU bandwidth in GB/s")
    parser.add_argument("--num-gpus", type=int)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline parallel size")
    parser.add_argument("--weight-dtype", default="auto", choices=WEIGHT_DTYPES)
    parser.add_argument("--kv-dtype", default="auto", choices=KV_DTYPES)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--block-size", type=int, default=16, choices=BLOCK_SIZES)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--context-len", type=int, help="request length for the concurrency figure")
    parser.add_argument("--activation-reserve-gib", type=float, help="measured activation peak, GiB per GPU")
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help="tokens scheduled per step; sizes the sliding-window groups (async scheduling doubles them in flight)",
    )
    parser.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="count sliding-window and chunked layers as full attention, as vLLM does with this flag",
    )
    parser.add_argument(
        "--safetensors-index", help="path of the model's model.safetensors.index.json: exact weight bytes"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m core.planning.planner`. Exit status 0, or 2 with the reason on stderr."""
    from core.planning.hardware import get_gpu
    from core.planning.models import get_model

    args = build_parser().parse_args(argv)
    try:
        if args.config:
            try:
                config = json.loads(Path(args.config).read_text())
            except (OSError, json.JSONDecodeError) as error:
                raise InvalidArgumentError(f"cannot read {args.config}: {error}") from None
            model = ModelSpec.from_hf_config(config, name=Path(args.config).stem, num_params=args.num_params)
        else:
            model = get_model(args.model)
        if args.safetensors_index:
            from core.planning.weights import with_checkpoint_bytes

            try:
                index = Path(args.safetensors_index).read_text()
            except OSError as error:
                raise InvalidArgumentError(f"cannot read {args.safetensors_index}: {error}") from None
            model = with_checkpoint_bytes(model, index)
        if args.gpu_memory_gib is not None:
            if args.gpu_bandwidth_gbps is None:
                raise InvalidArgumentError("--gpu-memory-gib needs --gpu-bandwidth-gbps too")
            gpu = GPUSpec.custom("custom GPU", args.gpu_memory_gib, args.gpu_bandwidth_gbps)
        else:
            gpu = get_gpu(args.gpu)
        reserve = None
        if args.activation_reserve_gib is not None:
            if not args.activation_reserve_gib >= 0:
                raise InvalidArgumentError("--activation-reserve-gib must be >= 0")
            reserve = int(args.activation_reserve_gib * 1024**3)
        capacity = plan(
            model,
            gpu,
            num_gpus=args.num_gpus,
            tensor_parallel=args.tp,
            pipeline_parallel=args.pp,
            weight_dtype=args.weight_dtype,
            kv_dtype=args.kv_dtype,
            gpu_memory_utilization=args.gpu_memory_utilization,
            block_size=args.block_size,
            max_model_len=args.max_model_len,
            activation_reserve=reserve,
            context_len=args.context_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager,
        )
    except InvalidArgumentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(capacity.to_dict(), indent=2))
    else:
        print(plan_table(capacity))
        print()
        if capacity.fits:
            print(capacity.vllm_command)
        else:
            print("# does not fit as planned; with the largest fitting settings:")
            print(capacity.vllm_command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
