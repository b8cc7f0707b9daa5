"""What `BlockManager` hands out besides its snapshot: where an appended token goes, the prefix-cache counters.

Both are values: a `PrefixCacheStats` never changes after the manager returns it. They stay beside the facade
(not in `core.kv`) because they are its API's records, not pool, table or snapshot types: the pool's state is
`core.kv.snapshot.KVCacheSnapshot`. `slot_results` builds the `AppendResult`s of a block's next slots in C
(an `AppendResult` subclass that tuple's own constructor builds): the fast append's result costs no Python frame.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple


class AppendResult(NamedTuple):
    """Where the appended token's K/V go.

    slot: `block_id * block_size + offset` in the physical pool.
    cow: `None`, or `(src_block, dst_block)`: the caller must copy the K/V of `src_block` into `dst_block`
        before writing `slot`, because the sequence's last block was shared (after `fork`).
    """

    slot: int
    cow: tuple[int, int] | None


class _TupleNew(tuple):
    """A tuple whose `__new__` is tuple's own: a class deriving from it first is built by tuple's C constructor,
    not by `AppendResult.__new__` (Python, about twice the cost of the whole fast append)."""

    __slots__ = ()
    __new__ = tuple.__new__


class _SlotResult(_TupleNew, AppendResult):
    """`AppendResult(slot, None)` built in C from the pair `(slot, None)`: an `AppendResult` (equal, hashed,
    shown, pickled and copied as one), for `slot_results`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"AppendResult(slot={self[0]!r}, cow={self[1]!r})"

    def __reduce__(self):
        return AppendResult, tuple(self)


def slot_results(start: int, end: int) -> Iterator[AppendResult]:
    """`AppendResult(slot, None)` for slot = start, ..., end - 1, each built (in C) when it is asked for."""
    if end <= start:
        return _NO_SLOTS
    return map(_SlotResult, enumerate(repeat(None, end - start), start))


_NO_SLOTS: Iterator[AppendResult] = iter(())  # exhausted for good: one iterator with nothing left, shared


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
