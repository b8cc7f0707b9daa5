"""The "gather" backend: copy every sequence's blocks into one contiguous tensor, then attend it.

The naive way, kept to show what the extra pass over memory costs; the attention itself is the torch backend's
fused chunk kernel over the whole gathered context.
"""

import torch

from core.common import cdiv
from core.kernels.torch_backend import CPU_FLASH, attend_chunk, used_entries


def gather_contiguous(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy every sequence's blocks into padded contiguous K and V, [num_seqs, max_len, num_kv_heads, head_dim].

    max_len = max(context_lens); slots at or past a sequence's length are zero. A full extra pass over memory:
    what paged kernels avoid.
    """
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    lens = context_lens.to(torch.long)
    longest = int(lens.max())
    num_cols = cdiv(longest, block_size)
    used = used_entries(block_tables[:, :num_cols], lens, block_size)
    table = torch.where(used, block_tables[:, :num_cols].long(), 0)  # [seqs, cols]; padding -> block 0
    num_seqs = table.shape[0]
    shape = (num_seqs, num_cols * block_size, num_kv_heads, head_dim)
    key = key_cache.index_select(0, table.reshape(-1)).view(shape)[:, :longest]
    value = value_cache.index_select(0, table.reshape(-1)).view(shape)[:, :longest]
    if int(lens.min()) < longest:
        pad = torch.arange(longest, device=lens.device)[None, :] >= lens[:, None]  # [seqs, tokens]
        key.masked_fill_(pad[:, :, None, None], 0)
        value.masked_fill_(pad[:, :, None, None], 0)
    return key, value


def gather_paged_rows(rows, key_cache, value_cache, block_tables, lens, row_pos, scale) -> torch.Tensor:
    key, value = gather_contiguous(key_cache, value_cache, block_tables, lens)  # [seqs, tokens, kv, dim]
    allowed = None
    if int(row_pos.min()) < key.shape[1] - 1:  # some row may not see every token
        positions = torch.arange(key.shape[1], device=rows.device)
        allowed = positions[None, None, :] <= row_pos[:, :, None]  # [seqs, R, tokens]
    use_flash = rows.device.type == "cpu" and CPU_FLASH is not None
    out, lse = attend_chunk(rows, key, value, allowed, scale, use_flash)
    return torch.where(torch.isinf(lse)[..., None], 0.0, out).to(rows.dtype)
