"""Loading an engine's model: the dtype it runs in, a checkpoint's config, weights and tokenizer (a Hugging Face
directory or a GGUF file), seeded random weights, and the bytes an engine would allocate, from shapes alone.

Raises ModelLoadError (missing or malformed files, unsupported architecture or setting), ModelTooLargeError
(weights over the memory budget, checked before loading) and InvalidArgumentError (a bad dtype or seed).
"""

import math
from pathlib import Path

import torch

from core.common import cdiv, check_int
from core.device import default_device, memory_budget_bytes
from core.engine.config import ModelConfig
from core.engine.gguf_file import gguf_config, gguf_tokenizer, gguf_weights
from core.engine.weights import expected_shapes, load_weights, random_weights
from core.errors import InvalidArgumentError, ModelLoadError, ModelTooLargeError
from core.paging.kv_cache import kv_cache_bytes


def resolve_device(device: torch.device | str | None) -> torch.device:
    """`device`, or `default_device()` when None."""
    return torch.device(device) if device is not None else default_device()


def resolve_dtype(dtype: torch.dtype | None, device: torch.device, config: ModelConfig) -> torch.dtype:
    if dtype is not None:
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InvalidArgumentError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        return dtype
    return config.checkpoint_dtype if device.type == "cuda" else torch.float32


def load_tokenizer(path: Path):
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:
        raise ModelLoadError(f"the tokenizer files in {str(path)!r} do not load: {err}") from None


def engine_bytes(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> int:
    """Bytes an engine of `config` allocates: its required weights (`expected_shapes`; optional q/k/v biases, a
    few rows per layer, not counted) plus a pool of `num_blocks` KV blocks of `block_size` tokens, in the dtype
    the engine would use (`dtype`, else float32 on CPU and the checkpoint's dtype on CUDA; `device` defaults to
    `default_device()`). Computed from shapes alone, so a caller can refuse before anything is allocated."""
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device, config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    weights = sum(math.prod(shape) for shape in expected_shapes(config).values()) * itemsize
    kv = kv_cache_bytes(
        config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype
    )
    return weights + kv


def load_checkpoint(path: str | Path, dtype: torch.dtype | None, device: torch.device | str | None):
    """(config, weights, tokenizer or None) of a Llama / Mistral / Qwen2 directory as Hugging Face saves it
    (config.json + safetensors, sharded or not; a tokenizer when present), or of a Llama-architecture `.gguf`
    file (dequantized; its tokenizer and chat template: `core.engine.gguf_file`). dtype None: float32 on CPU,
    the checkpoint's dtype on CUDA (float32 for a GGUF file). Weights over the memory budget are refused
    before they are loaded."""
    path = Path(path)
    gguf = path.suffix.lower() == ".gguf"
    config = gguf_config(path) if gguf else ModelConfig.from_directory(path)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device, config)
    load = gguf_weights if gguf else load_weights
    weights = load(path, config, dtype, device, memory_budget_bytes())
    tokenizer = gguf_tokenizer(path) if gguf else load_tokenizer(path)
    return config, weights, tokenizer


def random_model(config, seed: int, dtype: torch.dtype | None, device: torch.device | str | None):
    """(config, seeded random weights) for `config`: a ModelConfig, or a Hugging Face config dict (as in
    config.json, or a transformers config's `to_dict()`); see `core.engine.weights.random_weights`."""
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config.to_dict() if hasattr(config, "to_dict") else dict(config))
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device, config)
    return config, random_weights(config, dtype, device, check_int(seed, "seed", minimum=0))


def pool_blocks(
    config: ModelConfig,
    weight_bytes: int,
    dtype: torch.dtype,
    block_size: int,
    max_num_seqs: int,
    num_blocks: int | None,
) -> tuple[int, int]:
    """(blocks in the engine's KV pool, bytes of the memory budget left for KV after the weights).

    num_blocks None sizes the pool from the memory budget (`PAGED_LAB_MAX_BYTES`) less `weight_bytes`, capped at
    max_num_seqs x max_position_embeddings tokens; raises ModelTooLargeError when not one block is left. A given
    num_blocks is checked (at least 1); the KV cache refuses it later if it is over the budget left."""
    budget = memory_budget_bytes()
    kv_budget = budget - weight_bytes
    per_block = kv_cache_bytes(config.num_layers, 1, block_size, config.num_kv_heads, config.head_dim, dtype)
    if num_blocks is None:
        cap = cdiv(max_num_seqs * config.max_position_embeddings, block_size)
        num_blocks = min(kv_budget // per_block, cap)
        if num_blocks < 1:
            raise ModelTooLargeError(
                f"the weights take {weight_bytes:,} bytes of the {budget:,}-byte memory budget, "
                f"leaving no room for one KV block of {per_block:,} bytes",
                requested_bytes=weight_bytes + per_block,
                allowed_bytes=budget,
            )
    return check_int(num_blocks, "num_blocks", minimum=1), kv_budget
