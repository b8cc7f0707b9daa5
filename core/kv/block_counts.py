"""How many blocks, over a KV core's groups: the block-count arithmetic `KVCacheManager` answers its questions with,
from its single-type managers (each group's table-length and window rules) and, for appends, the pool's ref
counts. Nothing here holds state or changes a table: the manager passes its managers, its requests' records
(`KVRequest`) and its pool's `ref_counts`.

- `blocks_needed`: free blocks a new request (or its forks) takes, no prefix-cache hit counted;
- `max_blocks_held` / `num_blocks_held`: blocks one unshared request holds at most while it grows / once all but
  its newest token are computed;
- `blocks_to_append`: THE blocks-per-step count (`KVCacheManager.num_blocks_to_append`), with its fast path for one
  full-attention group, `blocks_to_append_one_full`.
"""

from collections.abc import Sequence
from itertools import repeat

from core.common import check_int
from core.kv.request import KVRequest
from core.kv.single_type_manager import SingleTypeKVCacheManager


def blocks_needed(
    managers: Sequence[SingleTypeKVCacheManager],
    num_tokens: int,
    num_seqs: int = 1,
    num_shared_tokens: int | None = None,
) -> int:
    """Free blocks a new request takes over all groups, counting no prefix-cache hits: `num_seqs` sequences
    of `num_tokens` tokens forked from one prompt of `num_shared_tokens` (default: all of them). The forks
    share the prompt's full blocks, and its partly filled last block while none has written past the
    prompt; each sequence's own entries are its manager's `num_new_blocks` past the shared full blocks.
    Worked example, block size 4, 2 sequences of 10 tokens forked from a 6-token prompt: 1 shared full
    block + 2 x (3 - 1) own entries = 5 blocks per full-attention group; with 6 tokens each, 2 blocks."""
    if type(num_tokens) is not int or num_tokens < 1:  # the common case skips the full check
        num_tokens = check_int(num_tokens, "num_tokens", minimum=1)
    shared = num_tokens if num_shared_tokens is None else num_shared_tokens
    if num_seqs == 1 or shared >= num_tokens:
        return sum(manager.num_required_blocks(num_tokens) for manager in managers)
    need = 0
    for manager in managers:
        full = shared // manager.block_size
        need += full + num_seqs * manager.num_new_blocks(full, num_tokens, 0)
    return need


def max_blocks_held(managers: Sequence[SingleTypeKVCacheManager], prompt_len: int, num_tokens: int) -> int:
    """The most blocks one unshared request holds at any time over all groups while it grows from a
    `prompt_len`-token prompt to `num_tokens` tokens (each manager's `max_blocks_held` bound)."""
    return sum(m.max_blocks_held(prompt_len, num_tokens) for m in managers)


def num_blocks_held(managers: Sequence[SingleTypeKVCacheManager], num_tokens: int) -> tuple[int, ...]:
    """Blocks one unshared request of `num_tokens` tokens holds in each group once all but its newest token
    are computed (a window group has released what no later token reads):
    `num_required_blocks(n) - num_skipped_blocks(n - 1)` per group."""
    return tuple(m.num_required_blocks(num_tokens) - m.num_skipped_blocks(num_tokens - 1) for m in managers)


def blocks_to_append(
    managers: Sequence[SingleTypeKVCacheManager],
    ref_counts,
    reqs: list[KVRequest],
    counts: list[int] | int,
    one_full: bool,
) -> int:
    """`num_blocks_to_append` when request `reqs[i]` gets `counts[i]` more tokens (`counts` each, for an
    int)."""
    counts = repeat(counts) if isinstance(counts, int) else counts
    if one_full:
        return blocks_to_append_one_full(managers[0], ref_counts, reqs, counts)
    releases: dict[int, int] = {}  # block -> table entries released first
    tails: dict[int, int] = {}  # shared written last block -> requests that write it
    takes = 0
    # per group: its window rule (None: never skips), growth rule and written tail, bound once
    rules = [
        (m.num_skipped_blocks if m.skips_tokens else None, m.num_new_entries, m.written_tail)
        for m in managers
    ]
    for req, count in zip(reqs, counts, strict=False):
        old = req.num_tokens
        new = old + count
        computed = req.num_computed if req.num_computed > new - 1 else new - 1
        for (skipped_blocks, new_entries, written_tail), rec in zip(rules, req.blocks, strict=True):
            table = rec.table
            skip = 0
            if skipped_blocks is not None:
                skip = skipped_blocks(computed)
                if skip > rec.first_held:  # it releases entries [first_held, skip) of its table
                    for index in range(rec.first_held, min(skip, len(table))):
                        releases[table[index]] = releases.get(table[index], 0) + 1
            takes += new_entries(len(table), new, skip)  # num_new_blocks(len(table), new, computed)
            last = table[-1] if table else -1
            if last >= 0 and ref_counts[last] > 1 and written_tail(rec, old, skip) >= 0:  # shared, written
                tails[last] = tails.get(last, 0) + 1
    freed = sum(1 for block, count in releases.items() if count == ref_counts[block])
    copies = sum(  # the holders left after the releases copy it, all but the last
        max(0, min(count, ref_counts[block] - releases.get(block, 0) - 1)) for block, count in tails.items()
    )
    return takes + copies - freed


def blocks_to_append_one_full(
    manager: SingleTypeKVCacheManager, ref_counts, reqs: list[KVRequest], counts
) -> int:
    """`blocks_to_append` for one full-attention group (the paper's vLLM; tested equal to the general
    path): nothing is skipped or released, so `num_new_blocks` is the table's growth and the written tail
    is the last block of a table whose tokens end inside it."""
    tails: dict[int, int] = {}
    takes = 0
    bs = manager.block_size
    for req, count in zip(reqs, counts, strict=False):
        table = req.blocks[0].table
        old = req.num_tokens
        grow = -(-(old + count) // bs) - len(table)
        if grow > 0:
            takes += grow
        if old % bs and ref_counts[table[-1]] > 1:
            tails[table[-1]] = tails.get(table[-1], 0) + 1
    return takes + sum(min(count, ref_counts[block] - 1) for block, count in tails.items())
