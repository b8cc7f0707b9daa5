"""The paged KV block allocator: which physical block holds which sequence's tokens.

Metadata only, no tensors: `KVCache` holds the data, and the serving simulator drives this class alone.

Invariants (checked by tests/test_block_manager_properties.py against a brute-force model):
- Every block is in exactly one of three states: *owned* (ref count >= 1, in at least one block table),
  *free uncached* (ref count 0, in `_free_uncached`) or *free cached* (ref count 0, holds a full block that
  prefix caching can revive, in `_free_cached`). `num_free_blocks` counts both free states.
- A block's ref count equals the number of block tables that contain it.
- `len(block_table(s)) == ceil(num_tokens(s) / block_size)` for every sequence.
- Only full blocks are ever cached or shared through the cache; a block that is written to (the partially
  filled last block of a sequence) has ref count 1, because `append_token` copies it first otherwise
  (copy-on-write).
- Eviction order: free uncached blocks are always taken first (oldest freed first); free cached blocks are
  then evicted least recently freed first. Freeing a sequence releases its blocks last-to-first, so its tail
  blocks are evicted before its head blocks (the head is the most shareable prefix).
- Every public method either succeeds or raises a `LabError` with the manager unchanged.
"""

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from core.errors import (
    DuplicateSequenceError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownSequenceError,
)

SeqId = Hashable


class AppendResult(NamedTuple):
    """Where the appended token's K/V go.

    slot: `block_id * block_size + offset` in the physical pool.
    cow: `None`, or `(src_block, dst_block)`: the caller must copy the K/V of `src_block` into `dst_block`
        before writing `slot`, because the sequence's last block was shared (after `fork`).
    """

    slot: int
    cow: tuple[int, int] | None


_new_tuple = tuple.__new__


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
    block_tables: sequence id -> its block table (logical index -> physical block id).
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


class _Sequence:
    __slots__ = ("block_hashes", "block_table", "num_tokens", "token_ids")

    def __init__(self, block_table: list[int], token_ids: list[int], block_hashes: list[int]):
        self.block_table = block_table
        self.token_ids = token_ids
        self.num_tokens = len(token_ids)
        self.block_hashes = block_hashes  # chained hash of each full block, in logical order


def _chain_hash(parent: int | None, tokens: tuple) -> int:
    return hash((parent, tokens))


class BlockManager:
    """Allocates fixed-size KV blocks to sequences, with ref-counted sharing and optional prefix caching.

    num_blocks: physical blocks in the pool (>= 1). block_size: tokens per block (>= 1).
    Sequences are identified by any hashable id.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        self._num_blocks = int(num_blocks)
        self._block_size = int(block_size)
        self._caching = bool(enable_prefix_caching)
        self._ref_counts = [0] * self._num_blocks
        self._free_uncached: deque[int] = deque(range(self._num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._hash_to_block: dict[int, int] = {}
        self._block_hash: list[int | None] = [None] * self._num_blocks
        self._seqs: dict[SeqId, _Sequence] = {}
        self._stats = PrefixCacheStats()

    # ---- properties -------------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def enable_prefix_caching(self) -> bool:
        return self._caching

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be taken now: free uncached plus evictable cached blocks."""
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached full block (evicted LRU first when needed)."""
        return len(self._free_cached)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self._stats

    # ---- queries ----------------------------------------------------------------------------------------

    def _seq(self, seq_id: SeqId) -> _Sequence:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}; live sequences: {self._live_summary()}")
        return seq

    def _live_summary(self) -> str:
        ids = list(self._seqs)
        shown = ", ".join(repr(s) for s in ids[:8])
        return f"[{shown}{', ...' if len(ids) > 8 else ''}] ({len(ids)} in all)"

    def seq_ids(self) -> list[SeqId]:
        """Live sequence ids, in the order they were allocated or forked."""
        return list(self._seqs)

    def block_table(self, seq_id: SeqId) -> list[int]:
        """A copy of the sequence's block table: logical block i lives in physical block table[i]."""
        return list(self._seq(seq_id).block_table)

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._seq(seq_id).num_tokens

    def token_ids(self, seq_id: SeqId) -> list[int]:
        return list(self._seq(seq_id).token_ids)

    def ref_count(self, block_id: int) -> int:
        if not isinstance(block_id, int | np.integer) or not 0 <= block_id < self._num_blocks:
            raise InvalidArgumentError(f"block_id must be in [0, {self._num_blocks}), got {block_id!r}")
        return self._ref_counts[block_id]

    def blocks_needed(self, num_tokens: int) -> int:
        """ceil(num_tokens / block_size): blocks a sequence of that many tokens holds."""
        return -(-num_tokens // self._block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new prompt of `num_tokens` fits in the free blocks, counting no prefix-cache hits."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int | np.integer) or num_tokens < 1:
            raise InvalidArgumentError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    # ---- block pool ---------------------------------------------------------------------------------------

    def _take_block(self) -> int:
        """Pop a free block (uncached first, then the least recently freed cached one) with ref count 1."""
        if self._free_uncached:
            block = self._free_uncached.popleft()
        elif self._free_cached:
            block, _ = self._free_cached.popitem(last=False)
            del self._hash_to_block[self._block_hash[block]]
            self._block_hash[block] = None
            s = self._stats
            self._stats = PrefixCacheStats(
                s.queries_tokens,
                s.hits_tokens,
                s.queries_blocks,
                s.hits_blocks,
                s.evictions_blocks + 1,
                s.evictions_tokens + self._block_size,
            )
        else:
            raise OutOfBlocksError(
                f"out of KV blocks: 1 more block needed, 0 of {self._num_blocks} free", needed=1, free=0
            )
        self._ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        count = self._ref_counts[block] - 1
        self._ref_counts[block] = count
        if count == 0:
            if self._block_hash[block] is not None:
                self._free_cached[block] = None
            else:
                self._free_uncached.append(block)

    def _register_full_block(self, seq: _Sequence, logical_index: int) -> None:
        """Record the chained hash of a sequence's newly full block; cache it if the hash is new."""
        bs = self._block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        start = logical_index * bs
        block_hash = _chain_hash(parent, tuple(seq.token_ids[start : start + bs]))
        seq.block_hashes.append(block_hash)
        if block_hash not in self._hash_to_block:
            block = seq.block_table[logical_index]
            self._hash_to_block[block_hash] = block
            self._block_hash[block] = block_hash

    # ---- operations ---------------------------------------------------------------------------------------

    def allocate(self, seq_id: SeqId, token_ids: Sequence[int]) -> int:
        """Give a new sequence the ceil(len(token_ids) / block_size) blocks of its prompt.

        With prefix caching, the longest prefix of full blocks already cached is reused (ref count + 1, a free
        cached block is revived in O(1)); at least the prompt's last token always lands in a newly taken block,
        as in vLLM (a prompt is never served entirely from cache). Returns the number of leading blocks that were
        prefix-cache hits (0 without caching); their tokens need no prefill.

        Raises DuplicateSequenceError, InvalidArgumentError (empty prompt, non-integer token), OutOfBlocksError;
        on any error nothing changes.
        """
        if seq_id in self._seqs:
            raise DuplicateSequenceError(f"sequence {seq_id!r} already exists; free it or choose a new id")
        tokens = list(token_ids)
        if not tokens:
            raise InvalidArgumentError(f"sequence {seq_id!r}: a prompt needs at least 1 token, got 0")
        if not all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in tokens):
            raise InvalidArgumentError(f"sequence {seq_id!r}: token ids must be integers")
        bs = self._block_size
        num_needed = self.blocks_needed(len(tokens))

        hashes: list[int] = []
        hit_blocks: list[int] = []
        if self._caching:
            parent = None
            for i in range(len(tokens) // bs):
                parent = _chain_hash(parent, tuple(tokens[i * bs : (i + 1) * bs]))
                hashes.append(parent)
            for i in range((len(tokens) - 1) // bs):
                block = self._hash_to_block.get(hashes[i])
                if block is None:
                    break
                hit_blocks.append(block)

        revived = sum(1 for b in hit_blocks if self._ref_counts[b] == 0)
        num_new = num_needed - len(hit_blocks)
        available = self.num_free_blocks - revived
        if num_new > available:
            raise OutOfBlocksError(
                f"out of KV blocks: sequence {seq_id!r} ({len(tokens):,} tokens) needs {num_new:,} new blocks "
                f"of {bs} tokens, {available:,} of {self._num_blocks:,} free",
                needed=num_new,
                free=available,
            )

        for block in hit_blocks:
            if self._ref_counts[block] == 0:
                del self._free_cached[block]
            self._ref_counts[block] += 1
        table = hit_blocks + [self._take_block() for _ in range(num_new)]
        seq = _Sequence(table, tokens, [])
        self._seqs[seq_id] = seq
        if self._caching:
            seq.block_hashes = hashes[: len(hit_blocks)]
            for i in range(len(hit_blocks), len(hashes)):
                self._register_full_block(seq, i)
            s = self._stats
            self._stats = PrefixCacheStats(
                s.queries_tokens + len(tokens),
                s.hits_tokens + len(hit_blocks) * bs,
                s.queries_blocks + num_needed,
                s.hits_blocks + len(hit_blocks),
                s.evictions_blocks,
                s.evictions_tokens,
            )
        return len(hit_blocks)

    def append_token(self, seq_id: SeqId, token_id: int) -> AppendResult:
        """Make room for one more token of `seq_id` and say where its K/V go.

        A new block is taken only when the last block is full (the token starts a new block), or for
        copy-on-write when the partially filled last block is shared: then `cow = (src, dst)` names the copy the
        caller must make. Raises UnknownSequenceError or OutOfBlocksError with nothing changed.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}; live sequences: {self._live_summary()}")
        bs = self._block_size
        offset = seq.num_tokens % bs
        table = seq.block_table
        cow = None
        if offset == 0:
            block = self._take_block()
            table.append(block)
        else:
            block = table[-1]
            if self._ref_counts[block] > 1:
                new_block = self._take_block()
                self._ref_counts[block] -= 1
                table[-1] = new_block
                cow = (block, new_block)
                block = new_block
        seq.num_tokens += 1
        tokens = seq.token_ids
        tokens.append(token_id)
        if (
            offset == bs - 1 and self._caching
        ):  # the block is now full: hash it (inlined _register_full_block)
            hashes = seq.block_hashes
            block_hash = hash((hashes[-1] if hashes else None, tuple(tokens[-bs:])))
            hashes.append(block_hash)
            if block_hash not in self._hash_to_block:
                self._hash_to_block[block_hash] = block
                self._block_hash[block] = block_hash
        return _new_tuple(
            AppendResult, (block * bs + offset, cow)
        )  # AppendResult(slot, cow), without its frame

    def append_tokens(self, seq_id: SeqId, token_ids: Sequence[int]) -> list[AppendResult]:
        """`append_token` for each token in order, all or nothing: if the pool runs out part-way, the
        sequence and the pool are restored to their state before the call and OutOfBlocksError is raised."""
        seq = self._seq(seq_id)
        tokens = list(token_ids)
        needed = self._blocks_for_append(seq, len(tokens))
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(
                f"out of KV blocks: {len(tokens):,} more tokens for sequence {seq_id!r} need {needed:,} new "
                f"blocks, {self.num_free_blocks:,} of {self._num_blocks:,} free",
                needed=needed,
                free=self.num_free_blocks,
            )
        return [self.append_token(seq_id, t) for t in tokens]

    def extend(self, seq_id: SeqId, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """Exactly `append_tokens(seq_id, token_ids)` (same blocks taken in the same order, same cache
        registrations, all or nothing), without building one AppendResult per token: for bulk replay such as the
        serving simulator. Returns the copy-on-write pair `(src_block, dst_block)` of the first token, or None
        (only the first token can need one). Raises UnknownSequenceError or OutOfBlocksError with nothing changed.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}; live sequences: {self._live_summary()}")
        tokens = token_ids if isinstance(token_ids, list | tuple) else list(token_ids)
        if not tokens:
            return None
        bs = self._block_size
        table = seq.block_table
        old = seq.num_tokens
        new = old + len(tokens)
        shared_tail = old % bs != 0 and self._ref_counts[table[-1]] > 1
        needed = shared_tail + -(-new // bs) - len(table)
        if needed > 0:
            free = len(self._free_uncached) + len(self._free_cached)
            if needed > free:
                raise OutOfBlocksError(
                    f"out of KV blocks: {len(tokens):,} more tokens for sequence {seq_id!r} need {needed:,} new "
                    f"blocks, {free:,} of {self._num_blocks:,} free",
                    needed=needed,
                    free=free,
                )
        cow = None
        if shared_tail:
            src = table[-1]
            dst = self._take_block()
            self._ref_counts[src] -= 1
            table[-1] = dst
            cow = (src, dst)
        seq.num_tokens = new
        seq.token_ids.extend(tokens)
        if needed or self._caching:
            for index in range(old // bs, -(-new // bs)):  # take and register in append_token's order
                if index == len(table):
                    table.append(self._take_block())
                if self._caching and (index + 1) * bs <= new:
                    self._register_full_block(seq, index)
        return cow

    def _blocks_for_append(self, seq: _Sequence, count: int) -> int:
        if count <= 0:
            return 0
        bs = self._block_size
        offset = seq.num_tokens % bs
        cow = 1 if offset and self._ref_counts[seq.block_table[-1]] > 1 else 0
        return cow + self.blocks_needed(seq.num_tokens + count) - len(seq.block_table)

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """The child shares every block of the parent (each ref count + 1), as for parallel sampling and beam
        search. Raises UnknownSequenceError (parent) or DuplicateSequenceError (child) with nothing changed."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise DuplicateSequenceError(f"cannot fork into {child_id!r}: that sequence already exists")
        for block in parent.block_table:
            self._ref_counts[block] += 1
        self._seqs[child_id] = _Sequence(
            list(parent.block_table), list(parent.token_ids), list(parent.block_hashes)
        )

    def free(self, seq_id: SeqId) -> None:
        """Drop the sequence. Each of its blocks loses one reference; a block whose count reaches 0 becomes
        free (cached-free if it holds a cached full block). Blocks are released last to first."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        for block in reversed(seq.block_table):
            self._release(block)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block hash; free cached blocks become plain free blocks. Returns how many
        hashes were dropped."""
        dropped = len(self._hash_to_block)
        for block in self._hash_to_block.values():
            self._block_hash[block] = None
        self._hash_to_block.clear()
        self._free_uncached.extend(self._free_cached)
        self._free_cached.clear()
        return dropped

    # ---- snapshot ---------------------------------------------------------------------------------------------

    def snapshot(self) -> BlockSnapshot:
        """An immutable numpy view of every physical block (see `BlockSnapshot`). O(blocks + sequences)."""
        n, bs = self._num_blocks, self._block_size
        ref_count = np.array(self._ref_counts, dtype=np.int64)
        owner = np.full(n, -1, dtype=np.int64)
        fill = np.zeros(n, dtype=np.int64)
        is_cached = np.zeros(n, dtype=bool)
        if self._hash_to_block:
            is_cached[np.fromiter(self._hash_to_block.values(), dtype=np.int64)] = True
        fill[is_cached] = bs
        seq_ids = tuple(self._seqs)
        for index in range(len(seq_ids) - 1, -1, -1):
            seq = self._seqs[seq_ids[index]]
            if not seq.block_table:
                continue
            table = np.asarray(seq.block_table, dtype=np.int64)
            owner[table] = index
            fill[table] = bs
            fill[table[-1]] = seq.num_tokens - (len(table) - 1) * bs
        free_order = np.fromiter(
            (*self._free_uncached, *self._free_cached), dtype=np.int64, count=self.num_free_blocks
        )
        is_free = np.zeros(n, dtype=bool)
        is_free[free_order] = True
        for array in (owner, ref_count, fill, is_free, is_cached, free_order):
            array.setflags(write=False)
        return BlockSnapshot(
            num_blocks=n,
            block_size=bs,
            seq_ids=seq_ids,
            owner=owner,
            ref_count=ref_count,
            fill=fill,
            is_free=is_free,
            is_cached=is_cached,
            free_order=free_order,
            block_tables={s: tuple(q.block_table) for s, q in self._seqs.items()},
            num_tokens={s: q.num_tokens for s, q in self._seqs.items()},
        )
