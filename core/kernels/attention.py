"""PagedAttention: attention that reads K/V through a block table, and the contiguous baseline it is compared to.

Cache layout (`core.paging.kv_cache.KVCache`, one layer):
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
Token `t` of sequence `s` lives in block `block_tables[s, t // block_size]` at offset `t % block_size`.

Entries of a block table past a sequence's last block are padding and may hold anything (-1, out-of-range ids);
slots past a sequence's length in its last block may hold anything, NaN included. None of it reaches the output:
padding entries are never dereferenced and unread slots are zeroed (torch) or masked at load (triton).

Grouped-query attention: query head `h` reads KV head `h // (num_heads // num_kv_heads)`. The kernels fold the
`group = num_heads // num_kv_heads` query heads of one KV head (and, for prefill, the query tokens) into "rows"
that share the same K/V, so K and V are read once per KV head, never expanded.

Backends:
- "torch": `core.kernels.torch_backend`, vectorised torch. The block table is walked in chunks of whole blocks (a Python loop over chunks,
  never over sequences or tokens); each chunk is gathered into a small reused buffer (~4 MiB, meant to stay in
  the last-level cache) and attended with a fused kernel that also returns the log-sum-exp; chunks are merged
  with the paper's equation 4 (online softmax). On CPU the fused kernel is ATen's flash attention
  (`aten::_scaled_dot_product_flash_attention_for_cpu`, which returns the log-sum-exp); elsewhere, or if that
  op is missing, explicit float32 matmul-softmax-matmul.
- "triton": `core.kernels.triton_backend`, one program per (sequence, KV head, row tile) that loads each block through
  the block table with no gathered copy. Needs CUDA tensors (or TRITON_INTERPRET=1 set before import).
- "cpu": `core.kernels.cpu_backend`, a small C kernel (compiled at first use with the system C compiler, cached,
  called through ctypes) that reads each block in place through the block table with OpenMP over (sequence,
  KV heads): no gathered copy. Its register tiles are sized for the ISA it is built for (`core.kernels.cpu_isa`:
  native by default, or PAGED_LAB_CPU_ISA=avx512|avx2|neon|generic). Offered only where it builds
  (`available_backends`).
- "gather": `core.kernels.gather_backend`, copies every sequence's blocks into one contiguous tensor, then attends it with the same fused
  kernel. The naive way, kept to show what the extra pass over memory costs.
- "auto": "triton" for CUDA tensors when triton imports; for CPU tensors "cpu" at decode when the C kernel builds
  (it beats "torch" there in bench/attention.py, on AVX-512 and AVX2 builds: docs/kernels-isa.md), else "torch";
  a PAGED_LAB_CPU_ISA this CPU cannot run is an error, not a silent fall-back. CPU prefill with "auto" stays on "torch": long
  chunks (many query rows per KV head) suit ATen's flash kernel's matrix products. Measured on 2 cores (4 sequences
  of 1,024 tokens, 32/8 heads, dim 128): "cpu" 13 / 76 / 526 ms vs "torch" 21 / 90 / 392 ms for chunks of
  16 / 128 / 512 tokens; backend="cpu" is exact for prefill too.
Softmax statistics are float32 whatever the input dtype; the output has the query's dtype.
"""

import math
import os
from functools import lru_cache

import torch
import torch.nn.functional as F

from core.common import check_int
from core.errors import BackendUnavailableError, InvalidArgumentError
from core.kernels.cpu_backend import cpu_kernel_available, cpu_kernel_error, cpu_paged_rows
from core.kernels.cpu_isa import isa_problem, selected_isa
from core.kernels.gather_backend import gather_contiguous, gather_paged_rows
from core.kernels.torch_backend import torch_paged_rows, used_entries, visible_starts, window_table

__all__ = [
    "BACKENDS",
    "available_backends",
    "contiguous_attention",
    "gather_contiguous",
    "paged_attention",
    "paged_prefill_attention",
    "resolve_backend",
    "torch_paged_rows",
]

BACKENDS = ("auto", "torch", "triton", "cpu", "gather")
CONTIGUOUS_METHODS = ("sdpa", "matmul")
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

# "auto" picks the "cpu" C kernel for CPU tensors when it builds here (it beats "torch" for decode in
# bench/attention.py); False keeps "torch".
AUTO_CPU_KERNEL = True


# ----------------------------------------------------------------------------------------------- backends
@lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when `import triton` works (it does not say a GPU is present)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def triton_interpreted() -> bool:
    """True when TRITON_INTERPRET=1, i.e. Triton kernels run on CPU tensors (slowly) instead of on a GPU."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available_backends(device: torch.device | str) -> list[str]:
    """Concrete backends (no "auto") that can run on `device`, fastest-first guess first."""
    device = torch.device(device)
    names = ["torch", "gather"]
    if device.type == "cpu" and cpu_kernel_available():
        names.insert(0, "cpu")
    can_run = device.type == "cuda" or triton_interpreted()
    if can_run and triton_available():  # import triton only where it could run
        names.insert(0, "triton")
    return names


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """The concrete backend `backend` means for tensors on `device`; raises if it cannot run there."""
    device = torch.device(device)
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton" if triton_available() else "torch"
        if device.type == "cpu" and AUTO_CPU_KERNEL:
            problem = isa_problem(selected_isa())
            if problem is not None:  # an explicit choice that cannot run: say so rather than run slower
                raise BackendUnavailableError(f"backend 'auto' would use the 'cpu' C kernel, but {problem}")
            if cpu_kernel_available():
                return "cpu"
        return "torch"
    if backend == "cpu":
        if device.type != "cpu":
            raise BackendUnavailableError(f"backend 'cpu' needs CPU tensors, got {device}")
        error = cpu_kernel_error()
        if error is not None:
            raise BackendUnavailableError(error)
    if backend == "triton":
        if not triton_available():
            raise BackendUnavailableError(
                "backend 'triton' needs the triton package, which does not import here"
            )
        if device.type != "cuda" and not triton_interpreted():
            raise BackendUnavailableError(
                f"backend 'triton' needs CUDA tensors (got {device}); on CPU set TRITON_INTERPRET=1 before "
                "importing core.kernels.triton_backend, or use backend 'torch'"
            )
    return backend


# --------------------------------------------------------------------------------------------- validation
def _check_tensor(name: str, tensor, ndim: int, dtypes, shape_doc: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"{name} must be a torch.Tensor {shape_doc}, got {type(tensor).__name__}")
    if tensor.dim() != ndim:
        raise InvalidArgumentError(f"{name} must be {ndim}-D {shape_doc}, got shape {list(tensor.shape)}")
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise InvalidArgumentError(f"{name} has dtype {tensor.dtype}; allowed: {allowed}")


def _check_compatible(
    data: dict[str, torch.Tensor], index_tensors: tuple, num_heads: int, num_kv_heads: int
) -> None:
    """The data tensors share one dtype, every tensor is on one device, and query heads group over KV heads."""
    dtypes = [t.dtype for t in data.values()]
    if len(set(dtypes)) != 1:
        raise InvalidArgumentError(
            f"{', '.join(data)} must share one dtype, got {', '.join(str(d) for d in dtypes)}"
        )
    devices = {t.device for t in (*data.values(), *index_tensors)}
    if len(devices) != 1:
        raise InvalidArgumentError(
            f"all tensors must be on one device, got {sorted(str(d) for d in devices)}"
        )
    if num_heads % num_kv_heads != 0:
        raise InvalidArgumentError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) for grouped-query attention"
        )


def _check_paged(
    query: torch.Tensor,
    query_ndim: int,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None,
) -> float:
    """Validate the paged arguments; return the softmax scale. Reads `context_lens` and the used table entries."""
    query_doc = (
        "[num_seqs, num_heads, head_dim]"
        if query_ndim == 3
        else "[num_seqs, max_query_len, num_heads, head_dim]"
    )
    _check_tensor("query", query, query_ndim, SUPPORTED_DTYPES, query_doc)
    cache_doc = "[num_blocks, block_size, num_kv_heads, head_dim]"
    _check_tensor("key_cache", key_cache, 4, SUPPORTED_DTYPES, cache_doc)
    _check_tensor("value_cache", value_cache, 4, SUPPORTED_DTYPES, cache_doc)
    _check_tensor("block_tables", block_tables, 2, INDEX_DTYPES, "[num_seqs, max_blocks_per_seq]")
    _check_tensor("context_lens", context_lens, 1, INDEX_DTYPES, "[num_seqs]")
    if key_cache.shape != value_cache.shape:
        raise InvalidArgumentError(
            f"key_cache and value_cache must have the same shape, got {list(key_cache.shape)} and "
            f"{list(value_cache.shape)}"
        )
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    num_seqs, num_heads = query.shape[0], query.shape[-2]
    _check_compatible(
        {"query": query, "key_cache": key_cache, "value_cache": value_cache},
        (block_tables, context_lens),
        num_heads,
        num_kv_heads,
    )
    if query.shape[-1] != head_dim:
        raise InvalidArgumentError(f"query head_dim {query.shape[-1]} does not match the cache's {head_dim}")
    if block_tables.shape[0] != num_seqs or context_lens.shape[0] != num_seqs:
        raise InvalidArgumentError(
            f"query has {num_seqs} sequences but block_tables has {block_tables.shape[0]} rows and context_lens "
            f"{context_lens.shape[0]} entries"
        )
    if num_seqs == 0:
        raise InvalidArgumentError("need at least one sequence")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1 or query.stride(-1) != 1:
        raise InvalidArgumentError(
            "query, key_cache and value_cache must be contiguous in head_dim (stride 1)"
        )
    capacity = block_tables.shape[1] * block_size
    lens = context_lens.to(torch.long)
    min_len, max_len = int(lens.min()), int(lens.max())
    if min_len < 1 or max_len > capacity:
        raise InvalidArgumentError(
            f"context_lens must be in [1, max_blocks_per_seq x block_size] = [1, {block_tables.shape[1]} x "
            f"{block_size} = {capacity:,}] tokens, got min {min_len:,}, max {max_len:,}"
        )
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidArgumentError(f"scale must be a positive finite number, got {scale}")
    return scale


def _check_block_ids(
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    row_pos: torch.Tensor,
    window: int | None,
    block_size: int,
    num_blocks: int,
) -> None:
    """The table entries some row may read (from its sequence's first visible block to its last) are in range;
    entries before a sliding window's first visible block (-1 once released) and after the last are ignored."""
    if window is None:
        ids = block_tables[used_entries(block_tables, lens, block_size)]
    else:
        _, seq_start = visible_starts(row_pos, lens, window)
        table, valid, _ = window_table(block_tables, lens, seq_start, block_size)
        ids = table[valid]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise InvalidArgumentError(
            f"block ids in use must be in [0, {num_blocks:,}), got min {int(ids.min())}, max {int(ids.max())}"
        )


def _check_window(sliding_window) -> int | None:
    return None if sliding_window is None else check_int(sliding_window, "sliding_window", minimum=1)


# ----------------------------------------------------------------------------------------------- public API
def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    backend: str = "auto",
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """One decode step of attention over a paged KV cache.

    query:        [num_seqs, num_heads, head_dim], the new token of each sequence (already in the cache).
    key_cache,
    value_cache:  [num_blocks, block_size, num_kv_heads, head_dim], same dtype as query.
    block_tables: [num_seqs, max_blocks_per_seq] int32/int64 physical block ids; entries past a sequence's
                  last block are ignored.
    context_lens: [num_seqs] int32/int64 tokens of each sequence in the cache, 1 <= len <= max_blocks x block_size.
    scale:        softmax scale, default 1/sqrt(head_dim).
    out:          optional [num_seqs, num_heads, head_dim] tensor (query's dtype and device, contiguous) that
                  receives the result and is returned; every element is overwritten.
    sliding_window: None, or W >= 1: the query attends to the last W positions only (itself included), as
                  Mistral / Gemma sliding-window layers do; table entries wholly before that window are never
                  read (a `BlockManager` with the same window sets them to -1).
    Returns [num_seqs, num_heads, head_dim] in query's dtype: softmax(q . K^T * scale) . V over the first
    context_lens[s] tokens of sequence s (the last min(W, context_lens[s]) with a window).
    Raises InvalidArgumentError for bad shapes/dtypes/devices/lengths/block ids, BackendUnavailableError for a
    backend that cannot run on these tensors.
    """
    scale = _check_paged(query, 3, key_cache, value_cache, block_tables, context_lens, scale)
    window = _check_window(sliding_window)
    backend = resolve_backend(backend, query.device)
    num_seqs, num_heads, head_dim = query.shape
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.shape != query.shape
        or out.dtype != query.dtype
        or out.device != query.device
        or not out.is_contiguous()
    ):
        raise InvalidArgumentError(
            f"out must be a contiguous {query.dtype} tensor of shape {list(query.shape)} on {query.device}"
        )
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    rows = query.view(num_seqs, num_kv_heads, group, head_dim)  # [seqs, kv_heads, rows=group, dim]
    lens = context_lens.to(torch.long)
    row_pos = (lens - 1)[:, None].expand(num_seqs, group)  # [seqs, rows] last position each row may see
    _check_block_ids(block_tables, lens, row_pos, window, key_cache.shape[1], key_cache.shape[0])
    out_rows = None if out is None else out.view(num_seqs, num_kv_heads, group, head_dim)
    result = _paged_rows(
        rows, key_cache, value_cache, block_tables, lens, row_pos, scale, backend, out_rows, window
    )
    return out if out is not None else result.reshape(num_seqs, num_heads, head_dim)


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_lens: torch.Tensor,
    scale: float | None = None,
    backend: str = "auto",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """A chunk of new tokens per sequence attending causally to the paged cache (chunked prefill, prefix hits).

    The chunk's own K/V must already be written to the cache (as vLLM does: write, then attend), so the
    sequence's last `query_lens[s]` cached tokens are the new ones.
    query:        [num_seqs, max_query_len, num_heads, head_dim]; row i < query_lens[s] is the token at absolute
                  position context_lens[s] - query_lens[s] + i; rows past query_lens[s] are padding (ignored).
    key_cache, value_cache, block_tables, scale, backend: as in `paged_attention`.
    context_lens: [num_seqs] tokens in the cache *including* the new chunk.
    query_lens:   [num_seqs] int32/int64 new tokens, 0 <= query_lens[s] <= min(context_lens[s], max_query_len).
    sliding_window: as in `paged_attention`: the token at position p attends to max(0, p - W + 1) .. p.
    Returns [num_seqs, max_query_len, num_heads, head_dim]: token i attends to positions 0 .. its own position;
    padding rows are 0. With max_query_len 1 and query_lens 1 it equals `paged_attention`.
    """
    scale = _check_paged(query, 4, key_cache, value_cache, block_tables, context_lens, scale)
    window = _check_window(sliding_window)
    _check_tensor("query_lens", query_lens, 1, INDEX_DTYPES, "[num_seqs]")
    num_seqs, max_q, num_heads, head_dim = query.shape
    if query_lens.shape[0] != num_seqs or query_lens.device != query.device:
        raise InvalidArgumentError(
            f"query_lens must have {num_seqs} entries on {query.device}, got {list(query_lens.shape)} on "
            f"{query_lens.device}"
        )
    lens = context_lens.to(torch.long)
    qlens = query_lens.to(torch.long)
    bad = (qlens < 0) | (qlens > lens) | (qlens > max_q)
    if bool(bad.any()):
        s = int(bad.nonzero()[0, 0])
        raise InvalidArgumentError(
            f"query_lens must be in [0, min(context_len, max_query_len={max_q})]; sequence {s} has query_len "
            f"{int(qlens[s])} and context_len {int(lens[s])}"
        )
    if backend == "auto" and query.device.type == "cpu":
        backend = "torch"  # prefill rows are many: ATen's flash kernel (matrix products) suits them better
    backend = resolve_backend(backend, query.device)
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    # rows r = i * group + g: query token i, head g of the group
    rows = (
        query.view(num_seqs, max_q, num_kv_heads, group, head_dim)
        .permute(0, 2, 1, 3, 4)
        .reshape(num_seqs, num_kv_heads, max_q * group, head_dim)
    )  # [seqs, kv_heads, rows, dim]
    i = torch.arange(max_q, device=query.device)
    pos = lens[:, None] - qlens[:, None] + i[None, :]  # [seqs, max_q] absolute position of each query token
    pos = torch.where(i[None, :] < qlens[:, None], pos, torch.full_like(pos, -1))
    row_pos = pos.repeat_interleave(group, dim=1)  # [seqs, rows]
    _check_block_ids(block_tables, lens, row_pos, window, key_cache.shape[1], key_cache.shape[0])
    out = _paged_rows(
        rows, key_cache, value_cache, block_tables, lens, row_pos, scale, backend, window=window
    )
    out = out.view(num_seqs, num_kv_heads, max_q, group, head_dim).permute(0, 2, 1, 3, 4)
    return out.reshape(num_seqs, max_q, num_heads, head_dim)


def contiguous_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    method: str = "sdpa",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The same decode step on an ordinary padded cache: the baseline paged attention is compared to.

    query:        [num_seqs, num_heads, head_dim]
    key, value:   [num_seqs, max_len, num_kv_heads, head_dim]; positions >= context_lens[s] are padding (masked).
    context_lens: [num_seqs] tokens, 1 <= len <= max_len.
    method:       "sdpa" (torch's fused scaled_dot_product_attention, the group's query heads folded into rows
                  against unexpanded K/V) or "matmul" (grouped-query matmul, float32 softmax, matmul: one bmm
                  pair per KV head). Benchmarks time both and keep the faster.
    sliding_window: None, or W: the query sees only the last W positions, as in `paged_attention`.
    Returns [num_seqs, num_heads, head_dim] in query's dtype.
    """
    if method not in CONTIGUOUS_METHODS:
        raise InvalidArgumentError(f"method must be one of {list(CONTIGUOUS_METHODS)}, got {method!r}")
    _check_tensor("query", query, 3, SUPPORTED_DTYPES, "[num_seqs, num_heads, head_dim]")
    doc = "[num_seqs, max_len, num_kv_heads, head_dim]"
    _check_tensor("key", key, 4, SUPPORTED_DTYPES, doc)
    _check_tensor("value", value, 4, SUPPORTED_DTYPES, doc)
    _check_tensor("context_lens", context_lens, 1, INDEX_DTYPES, "[num_seqs]")
    num_seqs, num_heads, head_dim = query.shape
    if key.shape != value.shape or key.shape[0] != num_seqs or key.shape[3] != head_dim:
        raise InvalidArgumentError(
            f"key and value must both be [num_seqs={num_seqs}, max_len, num_kv_heads, head_dim={head_dim}], got "
            f"{list(key.shape)} and {list(value.shape)}"
        )
    max_len, num_kv_heads = key.shape[1], key.shape[2]
    _check_compatible({"query": query, "key": key, "value": value}, (context_lens,), num_heads, num_kv_heads)
    if context_lens.shape[0] != num_seqs:
        raise InvalidArgumentError(f"context_lens must have {num_seqs} entries, got {context_lens.shape[0]}")
    lens = context_lens.to(torch.long)
    min_len, longest = int(lens.min()), int(lens.max())
    if min_len < 1 or longest > max_len:
        raise InvalidArgumentError(
            f"context_lens must be in [1, max_len={max_len:,}], got min {min_len:,}, max {longest:,}"
        )
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    window = _check_window(sliding_window)
    group = num_heads // num_kv_heads
    key, value = key[:, :longest], value[:, :longest]
    rows = query.view(num_seqs, num_kv_heads, group, head_dim)  # [seqs, kv_heads, group, dim]
    mask = None
    windowed = window is not None and longest > window
    if min_len < longest or windowed:
        positions = torch.arange(longest, device=query.device)[None, :]
        pad = positions >= lens[:, None]  # [seqs, tokens]
        if windowed:
            pad |= positions < lens[:, None] - window
        mask = torch.zeros(num_seqs, 1, 1, longest, dtype=query.dtype, device=query.device)
        mask.masked_fill_(pad[:, None, None, :], float("-inf"))
    if method == "sdpa":
        out = F.scaled_dot_product_attention(
            rows, key.transpose(1, 2), value.transpose(1, 2), attn_mask=mask, scale=scale
        )  # [seqs, kv_heads, group, dim]
    else:
        out = torch.empty_like(rows)
        for h in range(num_kv_heads):  # a loop over KV heads: bmm needs one batch stride
            scores = (
                torch.bmm(rows[:, h], key[:, :, h].transpose(1, 2)).float() * scale
            )  # [seqs, group, tokens]
            if mask is not None:
                scores = scores + mask[:, 0].float()
            probs = torch.softmax(scores, dim=-1).to(query.dtype)
            torch.bmm(probs, value[:, :, h], out=out[:, h])
    return out.reshape(num_seqs, num_heads, head_dim)


# ------------------------------------------------------------------------------------------------ kernels
def _paged_rows(
    rows: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    row_pos: torch.Tensor,
    scale: float,
    backend: str,
    out: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """rows [seqs, kv_heads, R, dim] attend to positions max(0, row_pos[s, r] - window + 1) .. row_pos[s, r]
    (< lens[s]; window None: from 0); row_pos -1 means none (output 0).

    Returns [seqs, kv_heads, R, dim]; written into `out` (same shape, contiguous) when given.
    """
    if backend == "triton":
        from core.kernels.triton_backend import triton_paged_rows

        return triton_paged_rows(
            rows, key_cache, value_cache, block_tables, lens, row_pos, scale, out=out, window=window
        )
    if backend == "cpu":
        return cpu_paged_rows(
            rows, key_cache, value_cache, block_tables, lens, row_pos, scale, out=out, window=window
        )
    if backend == "gather":
        result = gather_paged_rows(rows, key_cache, value_cache, block_tables, lens, row_pos, scale, window)
    else:
        result = torch_paged_rows(
            rows, key_cache, value_cache, block_tables, lens, row_pos, scale, window=window
        )
    return result if out is None else out.copy_(result)
