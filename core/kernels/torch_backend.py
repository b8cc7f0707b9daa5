"""The "torch" backend: block-wise online softmax over chunks of the block table, in vectorised torch.

The block table is walked in chunks of whole blocks (a Python loop over chunks, never over sequences or tokens);
each chunk is gathered into a small reused buffer (~CHUNK_TARGET_BYTES, meant to stay in the last-level cache)
and attended with a fused kernel that also returns the log-sum-exp; chunks are merged with the paper's
equation 4. On CPU the fused kernel is ATen's flash attention (`_scaled_dot_product_flash_attention_for_cpu`,
which returns the log-sum-exp); elsewhere, or if that op is missing, explicit float32 matmul-softmax-matmul.
"""

import torch

from core.common import cdiv

# The torch backend gathers this many bytes of K (and as many of V) per chunk: small enough to stay in the
# last-level cache between the gather and the attention that reads it, big enough to amortise Python overhead.
CHUNK_TARGET_BYTES = 4 * 1024**2
# ...and at least this many tokens per chunk. On CPU, ATen's flash kernel returns each chunk's partial output in
# the input dtype (vLLM's paged_attention_v2 also keeps its partial outputs in the input dtype), so half types
# round twice: once per partial, once at the end; longer chunks average more tokens, keeping partials small.
# Very short chunks (<= 32 tokens) also hit slow, erratic paths of that kernel in float32.
MIN_CHUNK_TOKENS = 64

CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def used_entries(block_tables: torch.Tensor, lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """[num_seqs, max_blocks_per_seq] bool: True where the entry holds one of the sequence's blocks."""
    blocks_used = (lens + block_size - 1) // block_size  # [num_seqs] blocks
    cols = torch.arange(block_tables.shape[1], device=block_tables.device)
    return cols[None, :] < blocks_used[:, None]


def attend_chunk(
    rows: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float,
    use_flash: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of rows [S, KV, R, D] to key/value [S, T, KV, D] (finite values), positions where `allowed`
    [S, R, T] (None: all). Returns (out [S, KV, R, D], lse [S, KV, R] float32, natural log of the softmax
    denominator). Rows with no allowed position get lse -inf; their `out` must then be ignored.
    """
    if use_flash:
        mask = None
        if allowed is not None:
            mask = torch.zeros(allowed.shape, dtype=rows.dtype, device=rows.device)
            mask = mask.masked_fill_(~allowed, float("-inf"))[:, None]  # [S, 1, R, T]
        out, lse = CPU_FLASH(rows, key.transpose(1, 2), value.transpose(1, 2), attn_mask=mask, scale=scale)
        if allowed is not None:
            lse = lse.masked_fill(~allowed.any(-1)[:, None, :], float("-inf"))
        return out, lse
    scores = torch.einsum("skrd,stkd->skrt", rows.float(), key.float()) * scale  # [S, KV, R, T]
    if allowed is not None:
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [S, KV, R]
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.einsum("skrt,stkd->skrd", probs, value.float())
    return out, lse


def chunk_blocks(num_seqs: int, block_size: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Blocks per sequence that the torch backend gathers per chunk: ~CHUNK_TARGET_BYTES of K per chunk, and at
    least MIN_CHUNK_TOKENS tokens."""
    per_column = num_seqs * block_size * num_kv_heads * head_dim * itemsize
    return max(cdiv(MIN_CHUNK_TOKENS, block_size), CHUNK_TARGET_BYTES // per_column)


def torch_paged_rows(
    rows: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    row_pos: torch.Tensor,
    scale: float,
    chunk: int | None = None,
    use_flash: bool | None = None,
) -> torch.Tensor:
    """The "torch" backend: block-wise online softmax over chunks of the block table (paper, equation 4).

    rows [S, KV, R, D]; lens [S] long; row_pos [S, R] long. Each chunk of `chunk` block-table columns is
    gathered (index_select into a reused buffer, ~4 MiB, so it is still in cache when read), unread slots are
    zeroed, the chunk is attended with its log-sum-exp, and partial results are merged in float32:
        lse = logaddexp(lse_a, lse_b);  out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse).
    Returns [S, KV, R, D] in rows' dtype.
    """
    num_seqs, num_kv_heads, _, head_dim = rows.shape
    block_size = key_cache.shape[1]
    if use_flash is None:
        use_flash = rows.device.type == "cpu" and CPU_FLASH is not None
    if chunk is None:
        chunk = chunk_blocks(num_seqs, block_size, num_kv_heads, head_dim, key_cache.element_size())
    min_len, max_len = int(lens.min()), int(lens.max())
    min_pos = int(row_pos.min())
    num_cols = cdiv(max_len, block_size)
    chunk = min(chunk, num_cols)
    used = used_entries(block_tables[:, :num_cols], lens, block_size)
    table = torch.where(
        used, block_tables[:, :num_cols].long(), 0
    )  # [S, cols]; padding -> block 0, zeroed below
    kbuf = torch.empty(
        (num_seqs * chunk, block_size, num_kv_heads, head_dim), dtype=key_cache.dtype, device=rows.device
    )
    vbuf = torch.empty_like(kbuf)
    out = lse = None
    for c0 in range(0, num_cols, chunk):
        c1 = min(c0 + chunk, num_cols)
        tokens = (c1 - c0) * block_size
        first, end = c0 * block_size, c1 * block_size  # token positions [first, end) of this chunk
        ids = table[:, c0:c1].reshape(-1)
        k = torch.index_select(key_cache, 0, ids, out=kbuf[: ids.numel()]).view(
            num_seqs, tokens, num_kv_heads, head_dim
        )
        v = torch.index_select(value_cache, 0, ids, out=vbuf[: ids.numel()]).view(
            num_seqs, tokens, num_kv_heads, head_dim
        )
        positions = torch.arange(first, end, device=rows.device)
        if end > min_len:  # some sequence ends inside this chunk: zero its unread slots (they may hold NaN)
            pad = positions[None, :] >= lens[:, None]  # [S, tokens]
            k.masked_fill_(pad[:, :, None, None], 0)
            v.masked_fill_(pad[:, :, None, None], 0)
        allowed = None
        if end - 1 > min_pos:  # some row may not see the whole chunk
            allowed = positions[None, None, :] <= row_pos[:, :, None]  # [S, R, tokens]
        part, part_lse = attend_chunk(rows, k, v, allowed, scale, use_flash)
        if out is None:
            out, lse = part.float(), part_lse
            continue
        new_lse = torch.logaddexp(lse, part_lse)
        ref = torch.where(torch.isinf(new_lse), 0.0, new_lse)
        out.mul_(torch.exp(lse - ref)[..., None]).addcmul_(part, torch.exp(part_lse - ref)[..., None])
        lse = new_lse
    out = torch.where(torch.isinf(lse)[..., None], 0.0, out)  # rows that saw nothing (prefill padding)
    return out.to(rows.dtype)
