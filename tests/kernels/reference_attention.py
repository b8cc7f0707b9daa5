"""An independent float64 reference for paged attention: a per-token Python loop over the block table.

Deliberately naive and separate from core: it looks each token up slot by slot, builds K/V in float64 and
applies the textbook softmax. Also builds random paged problems shaped like vLLM's kernel tests.
"""

import math

import torch


def reference_paged(
    query,
    key_cache,
    value_cache,
    block_tables,
    context_lens,
    scale=None,
    query_lens=None,
    sliding_window=None,
):
    """Decode (query [S, H, D]) or prefill (query [S, Q, H, D] with query_lens) in float64; returns float64.
    With sliding_window W the token at position p attends to positions max(0, p - W + 1) .. p only."""
    decode = query.dim() == 3
    if decode:
        query = query[:, None]
        query_lens = [1] * query.shape[0]
    num_seqs, max_q, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    tables = block_tables.tolist()
    out = torch.zeros(num_seqs, max_q, num_heads, head_dim, dtype=torch.float64)
    for s in range(num_seqs):
        length = int(context_lens[s])
        qlen = int(query_lens[s])
        for i in range(qlen):
            position = length - qlen + i
            first = 0 if sliding_window is None else max(0, position - sliding_window + 1)
            slots = [(tables[s][t // block_size], t % block_size) for t in range(first, position + 1)]
            keys = torch.stack([key_cache[b, o] for b, o in slots]).double()  # [visible, kv, D], slot by slot
            values = torch.stack([value_cache[b, o] for b, o in slots]).double()
            for h in range(num_heads):
                q = query[s, i, h].double()
                k = keys[:, h // group]
                v = values[:, h // group]
                scores = (k @ q) * scale
                probs = torch.softmax(scores, dim=0)
                out[s, i, h] = probs @ v
    return out[:, 0] if decode else out


def make_problem(
    num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_len, dtype, seed=0, poison=True, lens=None
):
    """Random lengths (the last one is max_len), random non-sequential block tables with -1 / out-of-range
    padding, and (poison) NaN in every slot and block no sequence uses. Returns a dict of tensors."""
    gen = torch.Generator().manual_seed(seed)
    if lens is None:
        lens = torch.randint(1, max_len + 1, (num_seqs,), generator=gen)
        lens[-1] = max_len
    lens = torch.as_tensor(lens, dtype=torch.int32)
    max_blocks = -(-max_len // block_size) + 2  # two padding columns for everyone
    needed = [-(-int(n) // block_size) for n in lens]
    num_blocks = sum(needed) + 5  # some blocks nobody uses
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((num_seqs, max_blocks), -1, dtype=torch.int32)
    cursor = 0
    for s, n in enumerate(needed):
        tables[s, :n] = torch.tensor(perm[cursor : cursor + n], dtype=torch.int32)
        cursor += n
        if n < max_blocks:
            tables[s, n] = num_blocks + 7  # out of range padding
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    if poison:
        valid = torch.zeros(num_blocks, block_size, dtype=torch.bool)
        for s, n in enumerate(lens.tolist()):
            for t in range(n):
                valid[tables[s, t // block_size], t % block_size] = True
        key_cache[~valid] = float("nan")
        value_cache[~valid] = float("nan")
    query = torch.randn(num_seqs, num_heads, head_dim, generator=gen).to(dtype)
    return {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_tables": tables,
        "context_lens": lens,
    }


def release_outside_window(problem, window, query_lens=None):
    """What a sliding-window block manager does, applied to a `make_problem` problem in place: for each sequence,
    the blocks wholly before its earliest query's window (position len - query_len - window + 1) get table entry
    -1 and NaN in every slot, so a kernel that reads one shows NaN. Returns the problem."""
    block_size = problem["key_cache"].shape[1]
    for s, length in enumerate(problem["context_lens"].tolist()):
        qlen = 1 if query_lens is None else int(query_lens[s])
        first = max(0, length - qlen - window + 1)
        for i in range(first // block_size):
            block = int(problem["block_tables"][s, i])
            problem["key_cache"][block] = float("nan")
            problem["value_cache"][block] = float("nan")
            problem["block_tables"][s, i] = -1
    return problem
