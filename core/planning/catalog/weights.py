"""Bytes of a model's stored weights: exact from a safetensors index, else an estimate from the quantization.

A Hugging Face checkpoint split into shards ships `model.safetensors.index.json`, whose `metadata.total_size` is
the sum of every tensor's bytes: the exact figure vLLM loads (including any vision tower or multi-token
prediction layer the checkpoint stores). Without it, `checkpoint_weight_bytes` estimates from the parameter
count and `quantization_config`.
"""

from dataclasses import replace
from typing import Any

from core.errors import InvalidArgumentError
from core.kv.hf_config import DTYPE_BYTES
from core.planning.catalog.models import ModelSpec
from core.uploads import parse_json, upload_text

# Quantization methods whose packed weights carry one scale (and for AWQ / GPTQ a packed zero point) per group.
# Scale bits per group: mxfp4 one E8M0 byte; AWQ / GPTQ an fp16 scale plus a zero of `bits` bits;
# compressed-tensors (symmetric int4) a 16-bit scale.
GROUP_QUANTIZATIONS = ("mxfp4", "awq", "gptq", "compressed-tensors")
MAX_CHECKPOINT_BYTES = 1 << 50  # 1 PiB


def read_safetensors_index(index: Any) -> int:
    """`metadata.total_size` (bytes) of a `model.safetensors.index.json`, given parsed or as JSON text / bytes.

    Raises `InvalidArgumentError` when it is empty, compressed, binary, not JSON (or nested too deeply), has no
    metadata.total_size, or the size is not a positive integer below 1 PiB. The caller checks the operator's
    upload limit before reading the file (`core.uploads.read_upload`).
    """
    if isinstance(index, bytes | bytearray):
        index = upload_text(bytes(index), "the safetensors index", "a model.safetensors.index.json")
    if isinstance(index, str):
        index = parse_json(index, "the safetensors index")
    metadata = index.get("metadata") if isinstance(index, dict) else None
    size = metadata.get("total_size") if isinstance(metadata, dict) else None
    if isinstance(size, float) and size.is_integer():
        size = int(size)
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size < MAX_CHECKPOINT_BYTES:
        raise InvalidArgumentError(
            f"a model.safetensors.index.json needs metadata.total_size, a positive number of bytes; got {size!r}"
        )
    return size


def with_checkpoint_bytes(model: ModelSpec, index: Any) -> ModelSpec:
    """`model` with `checkpoint_bytes` set from a safetensors index (see `read_safetensors_index`)."""
    return replace(model, checkpoint_bytes=read_safetensors_index(index))


def quantized_params(model: ModelSpec) -> int:
    """Parameters a group-quantized checkpoint stores packed: the decoder's weights, less the attention when
    `quantization_skips` names attention modules (gpt-oss keeps attention, router, embedding and LM head in
    bf16). Embedding and LM head are never packed."""
    params = model.num_params - model.embedding_params - model.lm_head_params
    if any("attn" in skip for skip in model.quantization_skips):
        params -= model.attention_params
    return max(0, params)


def bits_per_quantized_param(model: ModelSpec) -> float:
    """Stored bits per packed parameter: the value bits plus the group's scale (and zero) spread over it."""
    bits, group = model.quantization_bits, model.quantization_group_size
    scale_bits = {"mxfp4": 8, "awq": 16 + bits, "gptq": 16 + bits}.get(model.quantization, 16)
    return bits + (scale_bits / group if group else 0)


def uses_group_quantization(model: ModelSpec) -> bool:
    """True for a checkpoint packed below 8 bits with group scales (the estimate of `checkpoint_weight_bytes`
    then differs from parameters x bits)."""
    return model.quantization in GROUP_QUANTIZATIONS and (model.quantization_bits or 16) < 8


def checkpoint_weight_bytes(model: ModelSpec) -> tuple[int, bool]:
    """(bytes of the whole checkpoint, estimated).

    Exact (`estimated` False) when `checkpoint_bytes` came from a safetensors index. Otherwise, for a
    group-quantized checkpoint: packed parameters x `bits_per_quantized_param` / 8 + the rest in the compute
    dtype (gpt-oss-20b: ~19.1B expert parameters at 4.25 bits + ~1.8B in bf16 = 13.8 GB); for any other:
    parameters x their stored bytes (fp8 one byte, 16-bit two; block-wise FP8 scales are under 0.01%).
    """
    if model.checkpoint_bytes is not None:
        return model.checkpoint_bytes, False
    dense_bytes = DTYPE_BYTES[model.compute_dtype]
    if uses_group_quantization(model):
        packed = quantized_params(model)
        return round(
            packed * bits_per_quantized_param(model) / 8 + (model.num_params - packed) * dense_bytes
        ), True
    stored = 1 if model.quantization_bits == 8 else dense_bytes
    return model.num_params * stored, True
