"""vLLM's KV cache on a CPU: how many blocks and tokens vLLM's CPU backend allocates in a KV space given in GiB
(`VLLM_CPU_KVCACHE_SPACE=G`) or in bytes (`--kv-cache-memory-bytes`), and the `vllm serve` command that asks for it.

vLLM's rules (vllm/platforms/cpu.py `check_and_update_config`, vllm/v1/worker/cpu_worker.py
`determine_available_memory`, vllm/config/model.py `_resolve_auto_dtype`, vllm/v1/core/kv_cache_utils.py):
- the KV space is exactly `int(VLLM_CPU_KVCACHE_SPACE)` GiB (an integer: vLLM parses it with `int`), taken as the
  KV cache size as is: weights and activations do not come out of it (they live in the rest of the machine's RAM);
- blocks are counted as on a GPU: floor(space / (block_size x KV bytes per token over all layers)) for a model with
  one kind of attention layer; a hybrid model (sliding-window, chunked or Mamba layers) through the same KV cache
  groups and pages as the GPU plan (`core.kv.layout`), with that many bytes available;
- "auto" KV cache dtype is the model dtype; "auto" model dtype is the checkpoint's `torch_dtype`, except that a
  float32 checkpoint is served in the platform's first supported dtype, bfloat16 on x86 and Arm CPUs; the CPU
  attention backend stores `auto` or fp8 (fp8_e4m3, fp8_e5m2) only, and takes block sizes that are multiples of 32
  (vLLM's default on a CPU is 128);
- the KV cache size vLLM logs ("CPU KV cache size: N tokens") is int(max concurrency x max_model_len), the
  concurrency being blocks over the blocks one max_model_len request needs (`kv_tokens` here);
- vLLM refuses to start when one max_model_len request needs more blocks than the space holds.
"""

from dataclasses import dataclass, field, fields
from typing import Any

from core.common import check_int
from core.errors import InvalidArgumentError
from core.kv.layout import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KVCacheLayout,
    kv_cache_layout,
    longest_fitting_len,
)
from core.kv.specs import KV_DTYPE_BITS
from core.planning.catalog.models import ModelSpec
from core.planning.memory.resolved import checked_max_model_len

GiB = 1024**3
CPU_DEFAULT_BLOCK_SIZE = 128  # vLLM's block size on a CPU when --block-size is not given
CPU_BLOCK_MULTIPLE = 32  # the CPU attention backend's kernel block sizes: multiples of 32
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # the CPU attention backend's --kv-cache-dtype
CPU_MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")  # vllm serve --dtype
MAX_KV_CACHE_SPACE_GIB = 65_536  # 64 TiB: refuse absurd spaces
_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class CpuKVInputs:
    """One CPU KV plan's arguments: the model, the KV space in bytes (`from_space_gib` for VLLM_CPU_KVCACHE_SPACE),
    vLLM's --block-size, --dtype, --kv-cache-dtype, --max-model-len (None: the model's max_position_embeddings),
    --max-num-batched-tokens (sizes sliding-window groups) and the hybrid KV cache manager switch; model_path:
    what `vllm serve` is given in the command (default the model's Hugging Face repository, else its name)."""

    model: ModelSpec
    kv_cache_memory_bytes: int
    block_size: int = CPU_DEFAULT_BLOCK_SIZE
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    hybrid_kv_cache_manager: bool = True
    model_path: str | None = None

    @classmethod
    def from_space_gib(cls, model: ModelSpec, kv_cache_space_gib: int, **rest: Any) -> "CpuKVInputs":
        """Inputs for `VLLM_CPU_KVCACHE_SPACE=kv_cache_space_gib` (a positive whole number of GiB, as vLLM
        reads it). Raises InvalidArgumentError otherwise."""
        gib = check_int(
            kv_cache_space_gib, "the CPU KV cache space (GiB)", minimum=1, maximum=MAX_KV_CACHE_SPACE_GIB
        )
        return cls(model, gib * GiB, **rest)


@dataclass(frozen=True)
class CpuKVPlan:
    """What vLLM's CPU backend allocates for `inputs`: num_blocks blocks of block_size tokens (block_bytes each,
    over all layers), kv_tokens as vLLM logs them, max_concurrency requests of max_model_len tokens; dtype is the
    model dtype vLLM serves in, kv_dtype the short KV dtype; fits False (with the verdict saying why and
    max_fitting_model_len) when vLLM would refuse to start; vllm_command asks vLLM for this KV space."""

    inputs: CpuKVInputs = field(repr=False, compare=False)
    model: str
    kv_cache_memory_bytes: int
    kv_cache_space_gib: float
    block_size: int
    dtype: str
    kv_dtype: str
    max_model_len: int
    kv_bytes_per_token: int
    block_bytes: int
    num_blocks: int
    kv_tokens: int
    max_concurrency: float
    fits: bool
    verdict: str
    max_fitting_model_len: int | None
    notes: tuple[str, ...]
    vllm_command: str
    kv_layout: KVCacheLayout = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Every figure as JSON-able values (`inputs` left out)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "inputs"}
        data["notes"] = list(self.notes)
        data["kv_layout"] = self.kv_layout.to_dict()
        return data


def cpu_model_dtype(model: ModelSpec, dtype: str = "auto") -> str:
    """The dtype vLLM serves `model` in on an x86 or Arm CPU: `dtype` when given, else the checkpoint's
    torch_dtype with float32 served as bfloat16 (the CPU platform's first supported dtype)."""
    if dtype not in CPU_MODEL_DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {', '.join(CPU_MODEL_DTYPES)}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    return "bfloat16" if model.dtype == "float32" else model.dtype


def cpu_kv_dtype(model: ModelSpec, kv_cache_dtype: str = "auto", dtype: str = "auto") -> str:
    """The short KV dtype vLLM's CPU backend stores: the model dtype (`cpu_model_dtype`) for "auto", fp8 for the
    fp8 choices. Raises InvalidArgumentError for a dtype the CPU backend does not store."""
    if kv_cache_dtype not in CPU_KV_CACHE_DTYPES:
        raise InvalidArgumentError(
            f"vLLM's CPU backend stores the KV cache as {', '.join(CPU_KV_CACHE_DTYPES)}; got {kv_cache_dtype!r}"
        )
    return _SHORT[cpu_model_dtype(model, dtype)] if kv_cache_dtype == "auto" else "fp8"


def plan_cpu_kv(inputs: CpuKVInputs) -> CpuKVPlan:
    """The blocks and tokens vLLM's CPU backend allocates for `inputs` (module docstring). Raises
    InvalidArgumentError for arguments vLLM refuses (the message says what is allowed)."""
    model = inputs.model
    space = check_int(
        inputs.kv_cache_memory_bytes, "kv_cache_memory_bytes", minimum=1, maximum=MAX_KV_CACHE_SPACE_GIB * GiB
    )
    block_size = check_int(inputs.block_size, "block_size", minimum=1, maximum=65_536)
    if block_size % CPU_BLOCK_MULTIPLE:
        raise InvalidArgumentError(
            f"vLLM's CPU attention backend takes block sizes that are multiples of {CPU_BLOCK_MULTIPLE} "
            f"(32, 64, 128, ...), got {block_size}"
        )
    max_len = checked_max_model_len(model, inputs.max_model_len)
    dtype = cpu_model_dtype(model, inputs.dtype)
    kv_dtype = cpu_kv_dtype(model, inputs.kv_cache_dtype, inputs.dtype)
    layout = kv_cache_layout(
        model,
        space,
        max_model_len=max_len,
        block_size=block_size,
        kv_dtype=kv_dtype,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
        hybrid_kv_cache_manager=inputs.hybrid_kv_cache_manager,
    )
    per_token = _kv_bytes_per_token(model, kv_dtype)
    fits = 0 < layout.blocks_per_request <= layout.num_blocks
    space_gib = space / GiB
    if fits:
        verdict = (
            f"Fits: {layout.kv_tokens:,} KV tokens ({layout.num_blocks:,} blocks of {layout.block_size} tokens) "
            f"in {space_gib:g} GiB; {layout.max_concurrency:,.2f} requests of {max_len:,} tokens at once."
        )
        max_fit = None
    else:
        max_fit = longest_fitting_len(layout, model.max_position_embeddings)
        verdict = (
            f"Does not fit at max_model_len={max_len:,}: one request needs {layout.blocks_per_request:,} blocks "
            f"but {space_gib:g} GiB holds {layout.num_blocks:,}; vLLM refuses to start. The largest max_model_len "
            f"that fits is {max_fit:,}."
        )
    notes = []
    if inputs.dtype == "auto" and model.dtype == "float32":
        notes.append("The checkpoint is float32: vLLM serves it in bfloat16 on a CPU (dtype auto).")
    if layout.block_size != block_size:
        notes.append(f"Mamba state raises the attention block size to {layout.block_size} tokens.")
    served = inputs.model_path or model.hf_repo or model.name
    command = cpu_serve_command(served, space, block_size, dtype_flags(inputs), max_len)
    return CpuKVPlan(
        inputs,
        model.name,
        space,
        space_gib,
        layout.block_size,
        dtype,
        kv_dtype,
        max_len,
        per_token,
        layout.block_bytes,
        layout.num_blocks,
        layout.kv_tokens,
        layout.max_concurrency,
        fits,
        verdict,
        max_fit,
        tuple(notes),
        command,
        layout,
    )


def _kv_bytes_per_token(model: ModelSpec, kv_dtype: str) -> int:
    """KV bytes of one token over all layers of `model` in `kv_dtype` (standard attention or MLA; the page
    arithmetic of hybrid models is the layout's)."""
    bits = KV_DTYPE_BITS[kv_dtype]
    if model.is_mla:
        return model.num_layers * (model.kv_lora_rank + model.qk_rope_head_dim) * bits // 8
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * bits // 8


def dtype_flags(inputs: CpuKVInputs) -> tuple[str, ...]:
    """The --dtype and --kv-cache-dtype flags of `inputs` that are not vLLM's defaults."""
    flags = []
    if inputs.dtype != "auto":
        flags += ["--dtype", inputs.dtype]
    if inputs.kv_cache_dtype != "auto":
        flags += ["--kv-cache-dtype", inputs.kv_cache_dtype]
    return tuple(flags)


def cpu_serve_command(
    model: str, kv_cache_memory_bytes: int, block_size: int, flags: tuple[str, ...], max_model_len: int
) -> str:
    """`VLLM_CPU_KVCACHE_SPACE=G vllm serve MODEL ...` for a whole number of GiB, else `--kv-cache-memory-bytes`
    (`model`: a Hugging Face repository or a model folder)."""
    env, extra = "", []
    if kv_cache_memory_bytes % GiB == 0:
        env = f"VLLM_CPU_KVCACHE_SPACE={kv_cache_memory_bytes // GiB} "
    else:
        extra = ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    parts = [
        f"{env}vllm serve {model}",
        "--block-size",
        str(block_size),
        "--max-model-len",
        str(max_model_len),
        *flags,
        *extra,
    ]
    return " ".join(parts)
