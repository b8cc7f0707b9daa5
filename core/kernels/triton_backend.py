"""The "triton" backend of `core.kernels.attention`: a paged attention kernel that reads K/V through the block table.

Imported only when that backend is used, so `core.kernels.attention` never needs triton. One program per
(sequence, KV head, tile of 16 rows); rows are the query heads of one KV head's group (and, for prefill, the
query tokens), padded to 16 for `tl.dot`. The program walks the sequence's block table one block at a time,
loads that block's [block_size, head_dim] K and V tiles straight from the cache (masked loads: slots past the
sequence's length are never read, so NaN there cannot leak), computes scores and the weighted sum of V with
`tl.dot` on float32 tiles with IEEE products (decode is memory-bound: no need for TF32 / tensor-core inputs,
and every dtype matches a float32 reference), and keeps a float32 online softmax (running max, denominator,
accumulator). No gathered copy of the cache is made.

On a machine without a GPU, set TRITON_INTERPRET=1 *before* importing this module to run it on CPU tensors
(slowly: a few ms per program step).
"""

import torch
import triton
import triton.language as tl

FULL_WINDOW = 1 << 62  # the window passed for full attention: longer than any sequence


@triton.jit
def _paged_rows_kernel(
    q_ptr,  # [S, KV, R, D]
    k_ptr,  # [num_blocks, block_size, KV, D]
    v_ptr,
    table_ptr,  # [S, max_blocks] int32/int64
    lens_ptr,  # [S] int64
    row_pos_ptr,  # [S, R] int64, last position a row may see, -1 for none
    out_ptr,  # [S, KV, R, D]
    scale,
    window,  # a row sees positions max(0, row_pos - window + 1) .. row_pos (huge for full attention)
    num_rows,
    head_dim,
    block_size,
    stride_qs,
    stride_qh,
    stride_qr,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ts,
    stride_ps,
    stride_os,
    stride_oh,
    stride_or,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    row_ok = rows < num_rows
    dims = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    dim_ok = dims < head_dim
    slots = tl.arange(0, BLOCK_S)  # [BLOCK_S]

    q = tl.load(
        q_ptr + seq * stride_qs + kv_head * stride_qh + rows[:, None] * stride_qr + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_R, BLOCK_D]
    row_pos = tl.load(row_pos_ptr + seq * stride_ps + rows, mask=row_ok, other=-1)  # [BLOCK_R]
    length = tl.load(lens_ptr + seq)
    row_start, tile_start, first_block, num_blocks = _visible_blocks(row_pos, length, window, block_size)

    m = tl.full([BLOCK_R], -1.0e30, dtype=tl.float32)  # running max (finite: rows that see nothing stay at 0)
    denom = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for j in range(first_block, num_blocks):
        block = tl.load(table_ptr + seq * stride_ts + j).to(tl.int64)
        positions = j * block_size + slots  # [BLOCK_S]
        slot_ok = (slots < block_size) & (positions < length) & (positions >= tile_start)
        load_mask = slot_ok[:, None] & dim_ok[None, :]
        k = _load_block_tile(k_ptr, block, kv_head, slots, dims, load_mask, stride_kb, stride_ks, stride_kh)
        v = _load_block_tile(v_ptr, block, kv_head, slots, dims, load_mask, stride_vb, stride_vs, stride_vh)
        allowed = (
            slot_ok[None, :]
            & (positions[None, :] <= row_pos[:, None])
            & (positions[None, :] >= row_start[:, None])
        )  # [BLOCK_R, BLOCK_S]
        m, denom, acc = _online_softmax_step(q, k, v, scale, allowed, m, denom, acc)
    safe = tl.where(denom > 0, denom, 1.0)
    out = tl.where(denom[:, None] > 0, acc / safe[:, None], 0.0)
    tl.store(
        out_ptr + seq * stride_os + kv_head * stride_oh + rows[:, None] * stride_or + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


@triton.jit
def _visible_blocks(row_pos, length, window, block_size):
    """What one tile of rows may read: (row_start [BLOCK_R], the first position each row sees; tile_start, the
    first position any row sees, none before it is read; first_block and num_blocks, the block-table entries
    [first_block, num_blocks) that hold the visible positions). row_pos -1 marks a row that sees nothing."""
    visible = tl.minimum(length, tl.max(row_pos, axis=0) + 1)  # tokens any row of this tile may see
    num_blocks = (visible + block_size - 1) // block_size
    row_start = tl.maximum(row_pos - window + 1, 0)  # [BLOCK_R] first position each row may see
    tile_start = tl.min(tl.where(row_pos >= 0, row_start, length), axis=0)  # no position before it is read
    first_block = tl.minimum(tile_start, visible) // block_size
    return row_start, tile_start, first_block, num_blocks


@triton.jit
def _load_block_tile(ptr, block, kv_head, slots, dims, mask, stride_b, stride_s, stride_h):
    """One physical block's [BLOCK_S, BLOCK_D] K or V tile of `kv_head`, read in place from the cache as
    float32; masked slots and dims (past the sequence, before the tile's window, padding) read 0, never memory."""
    return tl.load(
        ptr + block * stride_b + slots[:, None] * stride_s + kv_head * stride_h + dims[None, :],
        mask=mask,
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _online_softmax_step(q, k, v, scale, allowed, m, denom, acc):
    """Fold one block into the online softmax (the paper's equation 4): scores q·k x scale [BLOCK_R, BLOCK_S]
    where `allowed`, -inf elsewhere; returns the new (running max [BLOCK_R], denominator [BLOCK_R], accumulator
    [BLOCK_R, BLOCK_D]), the old ones rescaled by exp(old max - new max)."""
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_R, BLOCK_S]
    scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp(m - m_new)
    probs = tl.exp(scores - m_new[:, None])  # 0 where not allowed
    denom = denom * alpha + tl.sum(probs, axis=1)
    acc = acc * alpha[:, None] + tl.dot(probs, v, input_precision="ieee")
    return m_new, denom, acc


def triton_paged_rows(
    rows: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    row_pos: torch.Tensor,
    scale: float,
    block_rows: int = 16,
    out: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """rows [S, KV, R, D] attend to the paged cache from max(0, row_pos - window + 1) (window None: 0) up to
    row_pos [S, R] (-1: nothing -> 0); returns [S, KV, R, D]. Blocks before the tile's first visible position
    are never loaded.

    Arguments are validated by `core.kernels.attention`; the head dimension of every tensor must be contiguous.
    `out` (contiguous, rows' shape and dtype) receives the result when given.
    """
    num_seqs, num_kv_heads, num_rows, head_dim = rows.shape
    block_size = key_cache.shape[1]
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    lens = lens.to(torch.int64).contiguous()
    row_pos = row_pos.to(torch.int64).contiguous()
    table = block_tables.contiguous()
    if out is None:
        out = torch.empty((num_seqs, num_kv_heads, num_rows, head_dim), dtype=rows.dtype, device=rows.device)
    block_r = block_rows  # tl.dot needs at least 16 rows; padding rows are masked
    grid = (num_seqs, num_kv_heads, triton.cdiv(num_rows, block_r))
    _paged_rows_kernel[grid](
        rows,
        key_cache,
        value_cache,
        table,
        lens,
        row_pos,
        out,
        float(scale),
        FULL_WINDOW if window is None else int(window),
        num_rows,
        head_dim,
        block_size,
        rows.stride(0),
        rows.stride(1),
        rows.stride(2),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        table.stride(0),
        row_pos.stride(0),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        BLOCK_R=block_r,
        BLOCK_S=max(16, triton.next_power_of_2(block_size)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
    )
    return out
