"""Prefix-cache keys of full blocks, chained like vLLM's `hash_block_tokens` (`vllm/v1/core/kv_cache_utils.py`).

A full block's key is a 64-bit hash of (its parent block's key, its tokens): equal keys mean equal prefixes up
to a hash collision, which is why the pool also compares the block's tokens and parent key before a hit. The
hash is Python's `hash` of a tuple of ints (None for a first block), which does not depend on PYTHONHASHSEED,
so keys are stable across processes and runs; they are signed 64-bit ints.
"""

from collections.abc import Sequence

BlockKey = tuple  # (parent block hash or None, the block's tokens as a tuple)


def hash_block_tokens(parent_block_hash: int | None, tokens: tuple) -> int:
    """The chained key of one full block holding `tokens` after the block whose key is `parent_block_hash`."""
    return hash((parent_block_hash, tokens))


def extend_block_hashes(
    hashes: list[int], token_ids: Sequence[int], block_size: int, num_blocks: int, hash_fn=hash_block_tokens
) -> None:
    """Append to `hashes` (the keys of the first len(hashes) full blocks of `token_ids`) the keys of the next
    blocks, up to `num_blocks` keys in all, computed by `hash_fn(parent, tokens)`. The caller guarantees
    `num_blocks * block_size <= len(token_ids)`."""
    parent = hashes[-1] if hashes else None
    for index in range(len(hashes), num_blocks):
        parent = hash_fn(parent, tuple(token_ids[index * block_size : (index + 1) * block_size]))
        hashes.append(parent)
