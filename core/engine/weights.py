"""Weights of a Llama-family model: read from a Hugging Face directory's safetensors files, or made at random.

A directory holds `model.safetensors`, or shards listed by `model.safetensors.index.json` ("weight_map": name ->
file). Sizes are read from the safetensors headers first, so a model too large for the memory budget is refused
before any tensor is loaded.
"""

import json
import struct
from pathlib import Path

import torch

from core.device import format_bytes
from core.engine.config import ModelConfig
from core.errors import ModelLoadError, ModelTooLargeError

_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def weight_files(path: str | Path) -> dict[str, Path]:
    """Weight name -> the safetensors file that holds it (every tensor of every file, index or not).

    Raises ModelLoadError when no safetensors file is present, the index is malformed, or a listed shard is missing.
    """
    root = Path(path)
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
            raise ModelLoadError(
                f"{index} is not a valid safetensors index (needs 'weight_map'): {err}"
            ) from None
        files = {name: root / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise ModelLoadError(
                    f"shard {file.name!r} listed in {INDEX_FILE} is missing from {str(root)!r}"
                )
        return files
    single = root / SINGLE_FILE
    if not single.is_file():
        found = sorted(p.name for p in root.glob("*.bin")) + sorted(p.name for p in root.glob("*.pt"))
        hint = f" (found {', '.join(found[:3])}: only safetensors are read)" if found else ""
        raise ModelLoadError(f"{str(root)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")
    return dict.fromkeys(read_header(single), single)


def read_header(file: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) of every tensor in one file, from its JSON header alone."""
    try:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100 * 1024**2:
                raise ValueError(f"header of {length:,} bytes")
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"{file} is not a readable safetensors file: {err}") from None
    return {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}


def checkpoint_bytes(files: dict[str, Path], names: list[str], itemsize: int) -> int:
    """Bytes the named weights take once cast to a dtype of `itemsize` bytes."""
    headers: dict[Path, dict] = {}
    total = 0
    for name in names:
        file = files[name]
        if file not in headers:
            headers[file] = read_header(file)
        entry = headers[file].get(name)
        if entry is None:
            raise ModelLoadError(f"weight {name!r} is listed for {file.name} but that file does not hold it")
        numel = 1
        for dim in entry[1]:
            numel *= int(dim)
        total += numel * itemsize
    return total


def load_weights(
    path: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device, budget_bytes: int
) -> dict[str, torch.Tensor]:
    """The model's tensors by Hugging Face name, cast to `dtype` on `device` (optional biases included).

    Raises ModelLoadError for a missing weight or a shape that disagrees with config.json, and ModelTooLargeError
    (before loading anything) when the weights exceed `budget_bytes`.
    """
    from safetensors import safe_open

    files = weight_files(path)
    needed = config.weight_names()
    missing = [n for n in needed if n not in files]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelLoadError(f"{str(path)!r} lacks weights {', '.join(missing[:3])}{more}")
    optional = [n for n in files if n.endswith(".bias") and n.replace(".bias", ".weight") in needed]
    names = needed + optional
    itemsize = torch.empty((), dtype=dtype).element_size()
    size = checkpoint_bytes(files, names, itemsize)
    if size > budget_bytes:
        raise ModelTooLargeError(
            f"the weights of {str(path)!r} take {format_bytes(size)} in {dtype}, over the memory budget of "
            f"{format_bytes(budget_bytes)} (PAGED_LAB_MAX_BYTES); choose a smaller model",
            requested_bytes=size,
            allowed_bytes=budget_bytes,
        )
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for file, group in by_file.items():
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in group:
                tensors[name] = handle.get_tensor(name).to(device=device, dtype=dtype)
    check_shapes(tensors, config)
    return tensors


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every required weight."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
        }
    return shapes


def check_shapes(tensors: dict[str, torch.Tensor], config: ModelConfig) -> None:
    for name, shape in expected_shapes(config).items():
        if tuple(tensors[name].shape) != shape:
            raise ModelLoadError(
                f"weight {name!r} has shape {list(tensors[name].shape)}, config.json implies {list(shape)}"
            )


def random_weights(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """Seeded random weights: normal(0, 0.02) matrices (transformers' initializer range), unit norms, and q/k/v
    biases when `config.attention_bias` (Llama's o_proj bias too). The same seed gives the same weights."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        else:
            tensors[name] = torch.randn(shape, generator=generator) * 0.02
    if config.attention_bias:
        for i in range(config.num_layers):
            for x in ("q", "k", "v") + (("o",) if config.architecture == "LlamaForCausalLM" else ()):
                rows = tensors[f"model.layers.{i}.self_attn.{x}_proj.weight"].shape[0]
                tensors[f"model.layers.{i}.self_attn.{x}_proj.bias"] = (
                    torch.randn(rows, generator=generator) * 0.02
                )
    return {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
