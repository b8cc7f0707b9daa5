"""What `BlockManager` hands out: where an appended token goes, the prefix-cache counters, a snapshot of the pool.

All are values: a `PrefixCacheStats` or `BlockSnapshot` never changes after the manager returns it.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class AppendResult(NamedTuple):
    """Where the appended token's K/V go.

    slot: `block_id * block_size + offset` in the physical pool.
    cow: `None`, or `(src_block, dst_block)`: the caller must copy the K/V of `src_block` into `dst_block`
        before writing `slot`, because the sequence's last block was shared (after `fork`).
    """

    slot: int
    cow: tuple[int, int] | None


@dataclass(frozen=True)
class PrefixCacheStats:
    """Prefix-cache counters since construction. Tokens count like vLLM's `prefix_cache_queries` /
    `prefix_cache_hits`: every prompt token is a query, and the tokens of reused blocks are hits."""

    queries_tokens: int = 0
    hits_tokens: int = 0
    queries_blocks: int = 0
    hits_blocks: int = 0
    evictions_blocks: int = 0
    evictions_tokens: int = 0

    @property
    def misses_tokens(self) -> int:
        return self.queries_tokens - self.hits_tokens

    @property
    def misses_blocks(self) -> int:
        return self.queries_blocks - self.hits_blocks

    @property
    def hit_rate(self) -> float:
        """Hits / queries in tokens; 0.0 before the first query."""
        return self.hits_tokens / self.queries_tokens if self.queries_tokens else 0.0


@dataclass(slots=True)
class PrefixCacheCounters:
    """The manager's mutable prefix-cache counters; `PrefixCacheStats` is the frozen copy handed out."""

    queries_tokens: int = 0
    hits_tokens: int = 0
    queries_blocks: int = 0
    hits_blocks: int = 0
    evictions_blocks: int = 0
    evictions_tokens: int = 0

    def frozen(self) -> PrefixCacheStats:
        return PrefixCacheStats(**{name: getattr(self, name) for name in self.__slots__})


@dataclass(frozen=True, eq=False)
class BlockSnapshot:
    """An immutable view of the pool for plots. Arrays are read-only and indexed by physical block id.

    seq_ids: live sequences in admission order; `owner[b]` indexes into it.
    owner: int64, the first live sequence (in `seq_ids` order) whose table holds block b, or -1.
    ref_count: int64, number of block tables holding block b.
    fill: int64, tokens stored in block b (block_size for a full or cached block, 0 for a free uncached one).
    is_free: bool, block b can be taken now (free uncached or free cached).
    is_cached: bool, block b holds a full block registered in the prefix cache (owned or free).
    free_order: int64 block ids in the order they will be taken: uncached first, then cached LRU first.
    block_tables: sequence id -> its block table (logical index -> physical block id, -1 once released by a
        sliding window).
    num_tokens: sequence id -> tokens it holds.
    """

    num_blocks: int
    block_size: int
    seq_ids: tuple
    owner: np.ndarray
    ref_count: np.ndarray
    fill: np.ndarray
    is_free: np.ndarray
    is_cached: np.ndarray
    free_order: np.ndarray
    block_tables: dict
    num_tokens: dict

    @property
    def num_free_blocks(self) -> int:
        return int(self.free_order.size)

    @property
    def is_shared(self) -> np.ndarray:
        return self.ref_count > 1

    def owners(self, block_id: int) -> list:
        """Every live sequence whose block table holds `block_id`, in `seq_ids` order."""
        return [s for s in self.seq_ids if block_id in self.block_tables[s]]
