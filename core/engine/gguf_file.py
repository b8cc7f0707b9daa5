"""A Llama-architecture GGUF file (llama.cpp's format) as the engine's config, weights and tokenizer.

Read with the `gguf` package: metadata keys `llama.*` give the `ModelConfig` (as a Hugging Face config dict would);
tensors are dequantized (Q4_1, Q8_0, F16, ...; `gguf.quants.dequantize`) to float32, then cast to the engine's
dtype, under Hugging Face names (`core.engine.weights.expected_shapes`). llama.cpp's converter stores the q and k
projections with the rows of each head's two rotary halves interleaved; they are put back in Hugging Face's
order (rows of head h: first half, then second half), as transformers' GGUF loader does. No `output.weight`
means tied embeddings. Tokenizer and chat template: transformers' conversion of the file's `tokenizer.*`
metadata (`AutoTokenizer.from_pretrained(folder, gguf_file=name)`, ~10 s on 2 cores), saved once as a
tokenizer directory in the model cache so later loads take well under a second.
"""

import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from core.device import format_bytes
from core.engine.config import ModelConfig
from core.engine.weights import check_shapes, expected_shapes
from core.errors import ModelLoadError, ModelTooLargeError

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.
    weight`), None for tensors the engine does not use (e.g. `rope_freqs.weight`)."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


@functools.lru_cache(maxsize=2)
def _reader(path: str, size: int, mtime_ns: int):
    from gguf import GGUFReader

    class PlainSliceReader(GGUFReader):
        """gguf's reader, its reads sliced from a plain ndarray view of the same memory map: each slice of an
        np.memmap runs memmap's Python-level __array_finalize__, and the header of a file with a 49,152-token
        vocabulary (SmolLM2's) is read in ~1.2 million slices (6 s of a 11 s model load; <1 s this way). The
        bytes and offsets are the same (gguf 0.19.0's `_get`, on the view)."""

        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)  # no copy: the map itself
            count = int(count)
            arr = plain[offset : offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            return arr.view(
                arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order)
            )

    return PlainSliceReader(path)


def open_gguf(path: str | Path):
    """The file's `gguf.GGUFReader` (memory-mapped; the last two files opened are kept). Raises ModelLoadError."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {str(path)!r} does not exist or is not a file")
    try:
        stat = path.stat()
        return _reader(str(path), stat.st_size, stat.st_mtime_ns)
    except ImportError:
        raise ModelLoadError("reading a .gguf file needs the 'gguf' package (pip install gguf)") from None
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise ModelLoadError(f"{str(path)!r} is not a readable GGUF file: {err}") from None


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a Llama-architecture GGUF file. Raises ModelLoadError for another architecture or a
    missing key."""
    return ModelConfig.from_dict(gguf_hf_config(path))


def gguf_hf_config(path: str | Path) -> dict:
    """The Hugging Face `config.json` dict of a Llama-architecture GGUF file (the fields transformers' LlamaConfig
    reads; float32, since the file's quantized weights are dequantized). Raises ModelLoadError for another
    architecture, a missing key or RoPE scaling."""
    reader = open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(
            f"{Path(path).name} is a {arch!r} GGUF; only Llama-architecture GGUF files are supported "
            "(or load a Hugging Face model directory)"
        )
    names = {t.name for t in reader.tensors}
    try:
        heads = int(_field(reader, "llama.attention.head_count"))
        hidden = int(_field(reader, "llama.embedding_length"))
        vocab = _field(reader, "llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
        eos = _field(reader, "tokenizer.ggml.eos_token_id")
        raw = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
            "num_hidden_layers": int(_field(reader, "llama.block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", heads)),
            "head_dim": int(_field(reader, "llama.attention.key_length", hidden // heads)),
            "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
            "tie_word_embeddings": "output.weight" not in names,
            "attention_bias": "blk.0.attn_q.bias" in names,
            "eos_token_id": None if eos is None else int(eos),
            "torch_dtype": "float32",  # dequantized: no narrower dtype is native to the file
        }
    except (TypeError, ValueError, KeyError) as err:
        raise ModelLoadError(f"{Path(path).name} lacks Llama metadata the engine needs: {err}") from None
    if _field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise ModelLoadError(f"{Path(path).name} uses RoPE scaling, which the GGUF loader does not read")
    return raw


def _unpermute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row interleave: per head, rows (pair i, half j) -> (half j, pair i)."""
    # [heads, head_dim / 2, 2, in] -> [heads, 2, head_dim / 2, in]
    half = rows.shape[0] // num_heads // 2
    return rows.reshape(num_heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def gguf_weights(
    path: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device, budget_bytes: int
) -> dict[str, torch.Tensor]:
    """The model's tensors by Hugging Face name, dequantized and cast to `dtype` on `device`.

    Raises ModelTooLargeError before dequantizing anything when the weights in `dtype` exceed `budget_bytes`,
    ModelLoadError for a missing tensor, an unsupported quantization or a shape that disagrees with the metadata.
    """
    from gguf.quants import dequantize

    reader = open_gguf(path)
    itemsize = torch.empty((), dtype=dtype).element_size()
    shapes = expected_shapes(config)
    size = sum(int(np.prod(shape)) for shape in shapes.values()) * itemsize
    if size > budget_bytes:
        raise ModelTooLargeError(
            f"the weights of {Path(path).name} take {format_bytes(size)} in {dtype}, over the memory budget of "
            f"{format_bytes(budget_bytes)} (PAGED_LAB_MAX_BYTES); choose a smaller model",
            requested_bytes=size,
            allowed_bytes=budget_bytes,
        )
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        try:
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except NotImplementedError as err:
            raise ModelLoadError(
                f"{tensor.name} is {tensor.tensor_type.name}, not readable here: {err}"
            ) from None
        array = array.reshape(tuple(int(d) for d in reversed(tensor.shape)))  # GGUF lists dims fastest first
        if ".q_proj." in name:
            array = _unpermute(array, config.num_heads)
        elif ".k_proj." in name:
            array = _unpermute(array, config.num_kv_heads)
        if not array.flags.writeable:  # an F32 tensor is a view of the read-only memory map: copy it
            array = array.copy()
        tensors[name] = torch.from_numpy(array).to(device=device, dtype=dtype)
    missing = [n for n in shapes if n not in tensors]
    if missing:
        raise ModelLoadError(f"{Path(path).name} lacks tensors for {', '.join(missing[:3])}")
    check_shapes(tensors, config)
    return tensors


def gguf_tokenizer(path: str | Path, cache_dir: str | Path | None = None):
    """The file's tokenizer (with its chat template) as transformers converts it. The conversion is saved under
    `cache_dir` (default: the model cache, `core.engine.model_cache.model_cache_dir`) in a directory named after the
    file's name, size and mtime, written to a temporary directory and renamed into place; when that cannot be
    written the tokenizer is converted on every load. None when the file has no tokenizer metadata. Raises
    ModelLoadError when transformers cannot read it."""
    from transformers import AutoTokenizer

    from core.engine.model_cache import model_cache_dir

    path = Path(path)
    if _field(open_gguf(path), "tokenizer.ggml.model") is None:
        return None  # a file without a vocabulary: prompts are token ids
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    saved = model_cache_dir(cache_dir) / "tokenizers" / f"{path.stem}-{key}"
    if saved.is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(saved), local_files_only=True)
        except Exception:  # a damaged copy: convert again below
            pass
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True
        )
    except Exception as err:
        raise ModelLoadError(f"the tokenizer in {path.name} does not load: {err}") from None
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=saved.parent, prefix=f".{saved.name}.")
    except OSError:
        return tokenizer  # a read-only cache: convert on every load
    try:
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, saved)  # atomic; fails when another process got there first, whose copy is as good
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer
