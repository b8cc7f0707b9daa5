"""KV cache specs: what one attention layer keeps per block, in vLLM V1's vocabulary
(`vllm/v1/kv_cache_interface.py`).

A spec is frozen and hashable: layers with equal specs can share one block table (one KV cache group). Every
spec has `block_size` (tokens per block), `num_kv_heads` and `head_size` (per tensor-parallel rank), `dtype`
(a short KV dtype name, a key of `KV_DTYPE_BITS`) and `page_size_bytes`, the bytes one block of ONE layer
takes. `max_blocks_per_request(max_model_len, max_num_batched_tokens)` is the most blocks one request can hold
at once in a group of this spec (vLLM's `max_memory_usage_bytes` / page size).

Kinds (`spec.kind`, the string vLLM's KV cache events carry as `kv_cache_spec_kind`):
- full_attention: every token's K and V; page 2 x B x H x D x dtype bytes.
- sliding_window: only the last `sliding_window` tokens are read; blocks wholly behind the window are freed.
- chunked_local_attention: a token reads its own `attention_chunk_size`-token chunk (Llama-4's local layers).
- mla_attention: one compressed latent per token (DeepSeek-V2/V3), no separate K and V: page B x H x D x bytes
  with H = 1 and D = kv_lora_rank + qk_rope_head_dim.
- mamba: a fixed-size recurrent state per request, held in ONE block whatever the length; page = the state's
  bytes (or `page_size_padded` when vLLM pads it to the attention page).
"""

from dataclasses import dataclass, field
from math import prod

from core.common import cdiv, check_int
from core.errors import InvalidArgumentError

# Bits per element of each KV dtype the lab knows (fp4 packs two elements per byte).
KV_DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "fp4": 4}
# Torch-style names accepted for `dtype` and mapped to the short names above.
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}


def kv_dtype_name(dtype: object) -> str:
    """The short KV dtype name of `dtype`: a short name, a torch-style name or a `torch.dtype`."""
    name = str(dtype).removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in KV_DTYPE_BITS:
        allowed = ", ".join(KV_DTYPE_BITS)
        raise InvalidArgumentError(f"KV dtype must be one of {allowed} (or a torch dtype), got {dtype!r}")
    return name


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """Base of every spec: the fields every layer type has. Subclasses set `kind` and the page arithmetic."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str = "bf16"
    kind = "abstract"

    def __post_init__(self):
        check_int(self.block_size, "block_size", minimum=1)
        check_int(self.num_kv_heads, "num_kv_heads", minimum=0)
        check_int(self.head_size, "head_size", minimum=0)
        object.__setattr__(self, "dtype", kv_dtype_name(self.dtype))

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer: K and V, `block_size` tokens, every KV head."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * KV_DTYPE_BITS[self.dtype] // 8

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of `max_model_len` tokens can hold at once: every block of its context."""
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(KVCacheSpec):
    """Full (global) attention: every token's K and V stay for the request's life."""

    kind = "full_attention"


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(KVCacheSpec):
    """Sliding-window attention: a token reads the `sliding_window` newest tokens (itself included)."""

    sliding_window: int
    kind = "sliding_window"

    def __post_init__(self):
        super().__post_init__()
        check_int(self.sliding_window, "sliding_window", minimum=1)

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """cdiv(min(W - 1 + T, L), B) + 1: the window plus a step's tokens, +1 because the window need not
        start on a block boundary."""
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, self.block_size) + 1


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(KVCacheSpec):
    """Chunked local attention: a token reads only its own chunk of `attention_chunk_size` tokens."""

    attention_chunk_size: int
    kind = "chunked_local_attention"

    def __post_init__(self):
        super().__post_init__()
        check_int(self.attention_chunk_size, "attention_chunk_size", minimum=1)

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """cdiv(min(C + T, L), B): the current chunk plus a step's tokens."""
        tokens = min(self.attention_chunk_size + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, self.block_size)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(KVCacheSpec):
    """Multi-head latent attention: one latent of `head_size` (= kv_lora_rank + qk_rope_head_dim) per token,
    `num_kv_heads` = 1, no separate K and V, replicated on every tensor-parallel rank."""

    num_kv_heads: int = 1
    kind = "mla_attention"

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * KV_DTYPE_BITS[self.dtype] // 8


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """A recurrent state per request (Mamba2, Gated DeltaNet): `shapes` are its tensors' shapes (conv state,
    SSM state), each in its entry of `dtypes` (short names, normalised like `dtype`), or all in `dtype` when
    `dtypes` is empty; one block holds the whole state, so `block_size` is nominal (vLLM sets it to
    max_model_len). `page_size_padded` pads the page to the attention page when vLLM unifies page sizes."""

    num_kv_heads: int = 0
    head_size: int = 0
    shapes: tuple[tuple[int, ...], ...] = field(default=())
    dtypes: tuple[str, ...] = field(default=())
    page_size_padded: int | None = None
    kind = "mamba"

    def __post_init__(self):
        super().__post_init__()
        if self.dtypes and len(self.dtypes) != len(self.shapes):
            raise InvalidArgumentError(
                f"dtypes names {len(self.dtypes)} dtypes for {len(self.shapes)} state shapes; give one per shape"
            )
        object.__setattr__(self, "dtypes", tuple(kv_dtype_name(d) for d in self.dtypes))

    @property
    def state_bytes(self) -> int:
        """Bytes of one request's state: every tensor's elements x its dtype's bits / 8."""
        dtypes = self.dtypes or (self.dtype,) * len(self.shapes)
        return sum(prod(s) * KV_DTYPE_BITS[d] for s, d in zip(self.shapes, dtypes, strict=True)) // 8

    @property
    def page_size_bytes(self) -> int:
        state = self.state_bytes
        if self.page_size_padded is not None:
            if self.page_size_padded < state:
                raise InvalidArgumentError(
                    f"page_size_padded ({self.page_size_padded} B) is smaller than the state ({state} B)"
                )
            return self.page_size_padded
        return state

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """One block: the state does not grow with the context."""
        return 1


SPEC_KINDS = tuple(
    spec.kind
    for spec in (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MLAAttentionSpec, MambaSpec)
)
