"""Capacity planning: KV bytes per token, vLLM's KV budget, blocks, concurrency and a decode roofline.

Every number is per GPU unless its name says otherwise. Units are in the names: `_bytes`, `_tokens`,
`_blocks`, `_s` (seconds), `_per_s`.
"""

import math

from core.errors import InvalidArgumentError
from core.models import ModelSpec

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
