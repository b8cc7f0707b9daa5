"""The paged KV block allocator: which physical block holds which sequence's tokens.

Metadata only, no tensors: `KVCache` holds the data, and the serving simulator drives this class alone.

Invariants (checked by tests/paging/test_block_manager_properties.py against a brute-force model):
- Every block is in exactly one of three states: *owned* (ref count >= 1, in at least one block table),
  *free uncached* (ref count 0, in `_free_uncached`) or *free cached* (ref count 0, holds a full block that
  prefix caching can revive, in `_free_cached`). `num_free_blocks` counts both free states.
- A block's ref count equals the number of block tables that contain it.
- `len(block_table(s)) == ceil(num_tokens(s) / block_size)` for every sequence; logical block i is always
  `block_table(s)[i]`. With a sliding window W, entries are -1 for released blocks: a prefix of the table.
- Sliding window W: before sequence s takes room for the token at position n (= num_tokens(s) before the
  append), every block wholly before position n - W + 1 (index i < (n - W + 1) // block_size) is released
  (one reference dropped, its entry set to -1): the new token attends to positions n - W + 1 .. n only. A prompt
  is allocated whole (its first token reads position 0); releases happen on appends. A released block's hash
  stays in the prefix cache until the block is evicted; a fork shares only the blocks still held.
- Only full blocks are ever cached or shared through the cache, and a cache hit is taken only when the cached
  block holds the same tokens under the same parent hash (a collision of the 64-bit hash is a miss); a block that is written to (the partially
  filled last block of a sequence) has ref count 1, because `append_token` copies it first otherwise
  (copy-on-write).
- Eviction order: free uncached blocks are always taken first (oldest freed first); free cached blocks are
  then evicted least recently freed first. Freeing a sequence releases its blocks last-to-first, so its tail
  blocks are evicted before its head blocks (the head is the most shareable prefix).
- Every public method either succeeds or raises a `LabError` with the manager unchanged.
"""

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence

import numpy as np

from core.common import cdiv, check_int
from core.errors import (
    DuplicateSequenceError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from core.paging.block_views import AppendResult, BlockSnapshot, PrefixCacheCounters, PrefixCacheStats

__all__ = ["AppendResult", "BlockManager", "BlockSnapshot", "PrefixCacheStats"]

SeqId = Hashable
_new_tuple = tuple.__new__


class _Sequence:
    __slots__ = ("block_hashes", "block_table", "first_held", "num_tokens", "token_ids")

    def __init__(
        self, block_table: list[int], token_ids: list[int], block_hashes: list[int], first_held: int = 0
    ):
        self.block_table = block_table  # -1 for the entries [0, first_held) a sliding window released
        self.token_ids = token_ids
        self.num_tokens = len(token_ids)
        self.block_hashes = block_hashes  # chained hash of each full block, in logical order
        self.first_held = first_held


def _chain_hash(parent: int | None, tokens: tuple) -> int:
    """The prefix-cache key of a full block: Python's 64-bit hash of (parent block's hash, the block's tokens)."""
    return hash((parent, tokens))


class BlockManager:
    """Allocates fixed-size KV blocks to sequences, with ref-counted sharing and optional prefix caching.

    num_blocks: physical blocks in the pool (>= 1). block_size: tokens per block (>= 1).
    sliding_window: None (full attention), or W >= 1: each token attends to the last W positions (itself
        included), and blocks wholly outside every future token's window are released (see the invariants).
    Sequences are identified by any hashable id.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        sliding_window: int | None = None,
    ):
        self._num_blocks = check_int(num_blocks, "num_blocks", minimum=1)
        self._block_size = check_int(block_size, "block_size", minimum=1)
        self._window = (
            None if sliding_window is None else check_int(sliding_window, "sliding_window", minimum=1)
        )
        self._caching = bool(enable_prefix_caching)
        self._ref_counts = [0] * self._num_blocks
        self._free_uncached: deque[int] = deque(range(self._num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._hash_to_block: dict[int, int] = {}
        self._block_hash: list[int | None] = [None] * self._num_blocks
        self._block_key: list[tuple | None] = [
            None
        ] * self._num_blocks  # (parent hash, tokens) of a cached block
        self._seqs: dict[SeqId, _Sequence] = {}
        self._stats = PrefixCacheCounters()

    # ---- properties -------------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def sliding_window(self) -> int | None:
        return self._window

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
        """A frozen copy of the counters now (later operations do not change it)."""
        return self._stats.frozen()

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
        """A copy of the sequence's block table: logical block i lives in physical block table[i] (-1: released
        by the sliding window)."""
        return list(self._seq(seq_id).block_table)

    def num_held_blocks(self, seq_id: SeqId) -> int:
        """Blocks the sequence holds now: its table's entries that are not -1."""
        seq = self._seq(seq_id)
        return len(seq.block_table) - seq.first_held

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._seq(seq_id).num_tokens

    def token_ids(self, seq_id: SeqId) -> list[int]:
        return list(self._seq(seq_id).token_ids)

    def ref_count(self, block_id: int) -> int:
        block_id = check_int(block_id, "block_id", minimum=0, maximum=self._num_blocks - 1)
        return self._ref_counts[block_id]

    def blocks_needed(self, num_tokens: int) -> int:
        """ceil(num_tokens / block_size): blocks a sequence of that many tokens holds (a new prompt holds them
        all, with or without a sliding window)."""
        return cdiv(num_tokens, self._block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new prompt of `num_tokens` fits in the free blocks, counting no prefix-cache hits."""
        num_tokens = check_int(num_tokens, "num_tokens", minimum=1)
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
            self._block_key[block] = None
            self._stats.evictions_blocks += 1
            self._stats.evictions_tokens += self._block_size
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

    def _cache_block(self, block: int, parent: int | None, tokens: tuple) -> int:
        """Hash a newly full block; register it in the prefix cache when the hash is new. Returns the hash."""
        block_hash = _chain_hash(parent, tokens)
        if block_hash not in self._hash_to_block:
            self._hash_to_block[block_hash] = block
            self._block_hash[block] = block_hash
            self._block_key[block] = (parent, tokens)
        return block_hash

    def _register_full_block(self, seq: _Sequence, logical_index: int) -> None:
        """Record the chained hash of a sequence's newly full block; cache it if the hash is new."""
        bs = self._block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        start = logical_index * bs
        tokens = tuple(seq.token_ids[start : start + bs])
        seq.block_hashes.append(self._cache_block(seq.block_table[logical_index], parent, tokens))

    def _cache_hits(self, tokens: list, hashes: list[int]) -> list[int]:
        """The cached blocks holding the prompt's leading full blocks (never its last token's block): a block
        counts only when it holds the same tokens under the same parent hash, so a hash collision is a miss."""
        bs = self._block_size
        hits: list[int] = []
        parent = None
        for i in range((len(tokens) - 1) // bs):
            block = self._hash_to_block.get(hashes[i])
            if block is None or self._block_key[block] != (parent, tuple(tokens[i * bs : (i + 1) * bs])):
                break
            hits.append(block)
            parent = hashes[i]
        return hits

    # ---- sliding window -------------------------------------------------------------------------------------

    def _window_steps(self, seq: _Sequence, count: int):
        """The block events of appending `count` tokens to `seq` under the sliding window, in append_token order.

        Yields ("release", i) (drop logical block i), ("take", i) (logical block i gets a new block, appended to
        the table or, for copy-on-write, replacing the shared tail) and ("full", i) (logical block i is now full).
        Only positions where something happens are visited: O(blocks), not O(tokens).
        """
        bs, window = self._block_size, self._window
        old, new = seq.num_tokens, seq.num_tokens + count
        held = seq.first_held
        release_phase = (window - 1) % bs  # positions p where (p - window + 1) is a multiple of bs
        p = old
        while p < new:
            target = (p - window + 1) // bs  # blocks [0, target) lie wholly before token p's window
            while held < target:
                yield "release", held
                held += 1
            index = p // bs
            if p % bs == 0 or (p == old and self._ref_counts[seq.block_table[-1]] > 1):
                yield "take", index
            block_end = (index + 1) * bs
            next_release = p + 1 + (release_phase - (p + 1)) % bs
            nxt = min(block_end, next_release, new)
            if nxt == block_end:
                yield "full", index
            p = nxt

    def _check_window_room(self, seq_id: SeqId, seq: _Sequence, count: int) -> None:
        """Raise OutOfBlocksError (nothing changed) unless every block the `count` appends take is free when taken,
        counting the blocks that the window's releases free on the way."""
        free = self.num_free_blocks
        refs = {i: self._ref_counts[b] for i, b in enumerate(seq.block_table) if i >= seq.first_held}
        needed = 0
        for kind, index in self._window_steps(seq, count):
            if kind == "release":
                free += refs.pop(index) == 1
            elif kind == "take":
                needed += 1
                free -= 1
                if free < 0:
                    raise OutOfBlocksError(
                        f"out of KV blocks: {count:,} more tokens for sequence {seq_id!r} need a new block "
                        f"of {self._block_size} tokens when none of {self._num_blocks:,} is free (window "
                        f"{self._window:,} tokens)",
                        needed=needed,
                        free=needed - 1,
                    )
                refs[index] = 1

    def _extend_windowed(self, seq: _Sequence, tokens: list) -> tuple[int, int] | None:
        """Apply the appends of `tokens` under the window (room already checked); returns the copy-on-write pair."""
        table = seq.block_table
        steps = list(self._window_steps(seq, len(tokens)))
        seq.token_ids.extend(tokens)
        cow = None
        for kind, index in steps:
            if kind == "release":
                self._release(table[index])
                table[index] = -1
                seq.first_held = index + 1
            elif kind == "take":
                block = self._take_block()
                if index == len(table):
                    table.append(block)
                else:  # the shared, partly filled tail: copy on write
                    cow = (table[index], block)
                    self._ref_counts[table[index]] -= 1
                    table[index] = block
            elif self._caching:
                self._register_full_block(seq, index)
        seq.num_tokens += len(tokens)
        return cow

    # ---- operations ---------------------------------------------------------------------------------------

    def allocate(self, seq_id: SeqId, token_ids: Sequence[int]) -> int:
        """Give a new sequence the ceil(len(token_ids) / block_size) blocks of its prompt.

        With prefix caching, the longest prefix of full blocks already cached is reused (ref count + 1, a free
        cached block is revived in O(1)); at least the prompt's last token always lands in a newly taken block,
        as in vLLM (a prompt is never served entirely from cache). Returns the number of leading blocks that were
        prefix-cache hits (0 without caching); their tokens need no prefill. With a sliding window the whole
        prompt is still allocated (its first tokens' windows reach back to position 0).

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
            hit_blocks = self._cache_hits(tokens, hashes)

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
            stats = self._stats
            stats.queries_tokens += len(tokens)
            stats.hits_tokens += len(hit_blocks) * bs
            stats.queries_blocks += num_needed
            stats.hits_blocks += len(hit_blocks)
        return len(hit_blocks)

    def append_token(self, seq_id: SeqId, token_id: int) -> AppendResult:
        """Make room for one more token of `seq_id` and say where its K/V go.

        A new block is taken only when the last block is full (the token starts a new block), or for
        copy-on-write when the partially filled last block is shared: then `cow = (src, dst)` names the copy the
        caller must make. With a sliding window, the blocks that fall out of the new token's window are
        released first (and count as free for this token). Raises UnknownSequenceError or OutOfBlocksError with
        nothing changed.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}; live sequences: {self._live_summary()}")
        bs = self._block_size
        offset = seq.num_tokens % bs
        table = seq.block_table
        if self._window is not None:
            self._check_window_room(seq_id, seq, 1)
            cow = self._extend_windowed(seq, [token_id])
            return AppendResult(table[-1] * bs + offset, cow)
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
        if offset == bs - 1 and self._caching:  # the block is now full: hash it and maybe cache it
            hashes = seq.block_hashes
            hashes.append(self._cache_block(block, hashes[-1] if hashes else None, tuple(tokens[-bs:])))
        return _new_tuple(
            AppendResult, (block * bs + offset, cow)
        )  # AppendResult(slot, cow), without its frame

    def append_tokens(self, seq_id: SeqId, token_ids: Sequence[int]) -> list[AppendResult]:
        """`append_token` for each token in order, all or nothing: if the pool runs out part-way, the
        sequence and the pool are restored to their state before the call and OutOfBlocksError is raised."""
        seq = self._seq(seq_id)
        tokens = list(token_ids)
        if self._window is not None:
            self._check_window_room(seq_id, seq, len(tokens))
            return [self.append_token(seq_id, t) for t in tokens]
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
        """Exactly `append_tokens(seq_id, token_ids)` (same blocks taken and released in the same order, same
        cache registrations, all or nothing), without building one AppendResult per token: for bulk replay such
        as the serving simulator. Returns the copy-on-write pair `(src_block, dst_block)` of the first token, or
        None (only the first token can need one). Raises UnknownSequenceError or OutOfBlocksError with nothing
        changed.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}; live sequences: {self._live_summary()}")
        tokens = token_ids if isinstance(token_ids, list | tuple) else list(token_ids)
        if not tokens:
            return None
        if self._window is not None:
            self._check_window_room(seq_id, seq, len(tokens))
            return self._extend_windowed(seq, list(tokens))
        bs = self._block_size
        table = seq.block_table
        old = seq.num_tokens
        new = old + len(tokens)
        shared_tail = old % bs != 0 and self._ref_counts[table[-1]] > 1
        needed = shared_tail + cdiv(new, bs) - len(table)
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
            for index in range(old // bs, cdiv(new, bs)):  # take and register in append_token's order
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
        """The child shares every block the parent still holds (each ref count + 1; released entries stay -1),
        as for parallel sampling and beam search. Raises UnknownSequenceError (parent) or DuplicateSequenceError
        (child) with nothing changed."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise DuplicateSequenceError(f"cannot fork into {child_id!r}: that sequence already exists")
        for block in parent.block_table[parent.first_held :]:
            self._ref_counts[block] += 1
        self._seqs[child_id] = _Sequence(
            list(parent.block_table), list(parent.token_ids), list(parent.block_hashes), parent.first_held
        )

    def free(self, seq_id: SeqId) -> None:
        """Drop the sequence. Each block it still holds loses one reference; a block whose count reaches 0
        becomes free (cached-free if it holds a cached full block). Blocks are released last to first."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        for block in reversed(seq.block_table[seq.first_held :]):
            self._release(block)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block hash; free cached blocks become plain free blocks. Returns how many
        hashes were dropped."""
        dropped = len(self._hash_to_block)
        for block in self._hash_to_block.values():
            self._block_hash[block] = None
            self._block_key[block] = None
        self._hash_to_block.clear()
        self._free_uncached.extend(self._free_cached)
        self._free_cached.clear()
        return dropped

    def cached_block_keys(self) -> dict[int, tuple[int | None, tuple]]:
        """hash -> (parent block's hash or None, the block's tokens) of every block in the prefix cache, held
        or free (a copy): what a KV-event publisher announces. Empty without prefix caching."""
        return {h: self._block_key[b] for h, b in self._hash_to_block.items()}

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
            if len(seq.block_table) == seq.first_held:
                continue
            table = np.asarray(seq.block_table[seq.first_held :], dtype=np.int64)
            owner[table] = index
            fill[table] = bs
            fill[table[-1]] = seq.num_tokens - (len(seq.block_table) - 1) * bs
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
