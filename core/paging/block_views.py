"""What `BlockManager` hands out besides its snapshot: where an appended token goes, the prefix-cache counters.

Both are values: a `PrefixCacheStats` never changes after the manager returns it. They stay beside the facade
(not in `core.kv`) because they are its API's records, not pool, table or snapshot types: the pool's state is
`core.kv.snapshot.KVCacheSnapshot`.
"""

from dataclasses import dataclass
from typing import NamedTuple


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
    def misses_blocks(self) -> int:
        return self.queries_blocks - self.hits_blocks

    @property
    def hit_rate(self) -> float:
        """Hits / queries in tokens; 0.0 before the first query."""
        return self.hits_tokens / self.queries_tokens if self.queries_tokens else 0.0
