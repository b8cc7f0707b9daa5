"""The paged KV block allocator of one KV cache group: which physical block holds which sequence's tokens.

The one-group facade over `core.kv`: its blocks come from a `BlockPool` and its tables live in one
single-type manager (full attention, or sliding window when `sliding_window` is set), exactly as a group of
`KVCacheManager` would hold them. Unlike `KVCacheManager`, its callers write K/V at once, so a block enters
the prefix cache as soon as it is full (at `allocate`, `append_token`, `extend`), and the window releases
blocks before the token at position num_tokens takes room. Metadata only, no tensors: `KVCache` holds the
data, and the serving simulator drives this class alone. With `enable_kv_cache_events` the pool queues vLLM's
KV cache events; drain them with `take_events()`.

Invariants (checked by tests/paging/test_block_manager_properties.py against a brute-force model):
- Every block is in exactly one of three states: *owned* (ref count >= 1, in at least one block table),
  *free uncached* (ref count 0) or *free cached* (ref count 0, holds a full block that prefix caching can
  revive). `num_free_blocks` counts both free states (the pool's invariants, `core.kv.block_pool`).
- A block's ref count equals the number of block tables that contain it.
- `len(block_table(s)) == ceil(num_tokens(s) / block_size)` for every sequence; logical block i is always
  `block_table(s)[i]`. With a sliding window W, entries are -1 for released blocks: a prefix of the table.
- Sliding window W: before sequence s takes room for the token at position n (= num_tokens(s) before the
  append), every block wholly before position n - W + 1 (index i < (n - W + 1) // block_size) is released
  (one reference dropped, its entry set to -1): the new token attends to positions n - W + 1 .. n only. A prompt
  is allocated whole (its first token reads position 0); releases happen on appends. A released block's hash
  stays in the prefix cache until the block is evicted; a fork shares only the blocks still held.
- Only full blocks are ever cached or shared through the cache, and a cache hit is taken only when the cached
  block holds the same tokens under the same parent hash (a collision of the 64-bit hash is a miss); a block
  that is written to (the partially filled last block of a sequence) has ref count 1, because `append_token` copies it first otherwise
  (copy-on-write).
- Eviction order: free uncached blocks are always taken first (oldest freed first); free cached blocks are
  then evicted least recently freed first. Freeing a sequence releases its blocks last-to-first, so its tail
  blocks are evicted before its head blocks (the head is the most shareable prefix).
- Every public method either succeeds or raises a `LabError` with the manager unchanged.
"""

from collections.abc import Hashable, Sequence

from core.common import cdiv, check_int
from core.errors import DuplicateSequenceError, OutOfBlocksError, UnknownSequenceError
from core.kv.block_hash import extend_block_hashes, hash_block_tokens
from core.kv.block_pool import BlockPool
from core.kv.events import KVEvent
from core.kv.kv_cache_manager import check_kv_token_ids
from core.kv.single_type_manager import RequestBlocks, manager_for
from core.kv.snapshot import KVCacheSnapshot, build_snapshot
from core.kv.specs import FullAttentionSpec, SlidingWindowSpec
from core.paging.block_views import AppendResult, PrefixCacheCounters, PrefixCacheStats

__all__ = ["AppendResult", "BlockManager", "KVCacheSnapshot", "PrefixCacheStats"]

SeqId = Hashable
_chain_hash = (
    hash_block_tokens  # the prefix-cache key of a full block (looked up at call time: tests swap it)
)
_new_tuple = tuple.__new__


class _Sequence:
    """A sequence's tokens and chained block hashes; `blocks` is its table in the group's manager, and
    `block_table` the same list object (read on the hot path).

    The append fast path (`BlockManager.append_token`): while `next_slot < fast_end`, the next token goes to
    slot `next_slot` of the unshared last block and needs nothing else (no new block, no copy-on-write, no
    hash). `BlockManager._arm` keeps this true: armed, `next_slot` is the slot after the last token in
    `block_table[-1]` (ref count 1) and `fast_end` that block's last slot (prefix caching: the token that fills
    the block takes the slow path, which hashes it) or its end (no caching); disarmed, both are 0 (sliding
    window, or a tail shared after `fork`), so every append takes the slow path, which re-arms.
    """

    __slots__ = ("block_hashes", "block_table", "blocks", "fast_end", "next_slot", "token_ids")

    def __init__(self, blocks: RequestBlocks, token_ids: list[int], block_hashes: list[int]):
        self.blocks = blocks
        self.block_table = blocks.table  # -1 for the entries [0, first_held) a sliding window released
        self.token_ids = token_ids
        self.block_hashes = block_hashes  # chained hash of each full block, in logical order
        self.next_slot = 0
        self.fast_end = 0  # disarmed until BlockManager._arm

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class BlockManager:
    """Allocates fixed-size KV blocks to sequences, with ref-counted sharing and optional prefix caching.

    num_blocks: physical blocks in the pool (>= 1). block_size: tokens per block (>= 1).
    sliding_window: None (full attention), or W >= 1: each token attends to the last W positions (itself
        included), and blocks wholly outside every future token's window are released (see the invariants).
    enable_kv_cache_events: queue vLLM's KV cache events (group_idx 0) for `take_events()`.
    block_hasher: the chained key of a full block (`core.kv.block_hash`; None: Python's hash), e.g. a
        `VllmBlockHasher` for the keys, and so the events, of a vLLM server.
    Sequences are identified by any hashable id.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        sliding_window: int | None = None,
        enable_kv_cache_events: bool = False,
        block_hasher=None,
    ):
        num_blocks = check_int(num_blocks, "num_blocks", minimum=1)
        self._block_size = check_int(block_size, "block_size", minimum=1)
        self._window = (
            None if sliding_window is None else check_int(sliding_window, "sliding_window", minimum=1)
        )
        if self._window is None:
            spec = FullAttentionSpec(block_size=self._block_size, num_kv_heads=0, head_size=0)
        else:
            spec = SlidingWindowSpec(
                block_size=self._block_size, num_kv_heads=0, head_size=0, sliding_window=self._window
            )
        self._caching = bool(enable_prefix_caching)
        self._block_hasher = block_hasher  # None: the module's _chain_hash, looked up at call time
        self._pool = BlockPool(num_blocks, [spec], enable_kv_cache_events=enable_kv_cache_events)
        self._manager = manager_for(spec, self._pool, 0)
        self._ref_counts = self._pool.ref_counts  # the pool's live list (read-only here)
        # the fast path's last slot in a block: the filling token takes the slow path when it must be hashed
        self._fast_fill = self._block_size - 1 if self._caching else self._block_size
        self._seqs: dict[SeqId, _Sequence] = {}
        self._stats = PrefixCacheCounters()

    # ---- properties -------------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._pool.num_blocks

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
    def pool(self) -> BlockPool:
        """The block pool under this manager (read it; change it only through the manager)."""
        return self._pool

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be taken now: free uncached plus evictable cached blocks."""
        return self._pool.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached full block (evicted LRU first when needed)."""
        return self._pool.num_cached_free_blocks

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """A frozen copy of the counters now (later operations do not change it)."""
        self._stats.evictions_blocks = self._pool.num_evicted_blocks
        self._stats.evictions_tokens = self._pool.num_evicted_blocks * self._block_size
        return self._stats.frozen()

    def take_events(self) -> list[KVEvent]:
        """vLLM KV cache events since the last call, oldest first (always empty unless events are enabled)."""
        return self._pool.take_events()

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
        return self._seq(seq_id).blocks.num_held

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._seq(seq_id).num_tokens

    def token_ids(self, seq_id: SeqId) -> list[int]:
        return list(self._seq(seq_id).token_ids)

    def ref_count(self, block_id: int) -> int:
        block_id = check_int(block_id, "block_id", minimum=0, maximum=self.num_blocks - 1)
        return self._ref_counts[block_id]

    def blocks_needed(self, num_tokens: int) -> int:
        """ceil(num_tokens / block_size): blocks a sequence of that many tokens holds (a new prompt holds them
        all, with or without a sliding window)."""
        return cdiv(num_tokens, self._block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new prompt of `num_tokens` fits in the free blocks, counting no prefix-cache hits."""
        num_tokens = check_int(num_tokens, "num_tokens", minimum=1)
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    # ---- prefix cache -------------------------------------------------------------------------------------

    def _hash_fn(self):
        return self._block_hasher or _chain_hash

    def _cache_full_blocks(self, seq: _Sequence, num_full: int) -> None:
        """Offer the sequence's blocks up to `num_full` (now full, K/V written) to the prefix cache."""
        extend_block_hashes(seq.block_hashes, seq.token_ids, self._block_size, num_full, self._hash_fn())
        self._manager.cache_blocks(seq.blocks, seq.block_hashes, seq.token_ids, num_full * self._block_size)

    # ---- sliding window -------------------------------------------------------------------------------------

    def _window_steps(self, seq: _Sequence, count: int):
        """The block events of appending `count` tokens to `seq` under the sliding window, in append_token order.

        Yields ("release", i) (drop logical blocks up to i), ("take", p) (the token at position p needs a new
        block: appended to the table or, for copy-on-write, replacing the shared tail) and ("full", i) (logical
        block i is now full). Only positions where something happens are visited: O(blocks), not O(tokens).
        """
        bs = self._block_size
        old, new = seq.num_tokens, seq.num_tokens + count
        held = seq.blocks.first_held
        skipped_blocks = self._manager.num_skipped_blocks  # the KV core's window rule, nothing repeated here
        p = old
        while p < new:  # the first position, then each block's first position
            target = skipped_blocks(p)  # blocks [0, target) lie wholly before token p's window
            while held < target:
                yield "release", held
                held += 1
            index = p // bs
            if p % bs == 0 or (p == old and self._ref_counts[seq.block_table[-1]] > 1):
                yield "take", p
            p = (index + 1) * bs
            if p <= new:
                yield "full", index
        # releases between the last block start and the newest token (a release frees a block to the pool and
        # touches no block being filled, so yielding it at the next block start, before its take, or here at
        # the end leaves the pool as appending token by token does)
        target = skipped_blocks(new - 1)
        while held < target:
            yield "release", held
            held += 1

    def _check_window_room(self, seq_id: SeqId, seq: _Sequence, count: int) -> None:
        """Raise OutOfBlocksError (nothing changed) unless every block the `count` appends take is free when taken,
        counting the blocks that the window's releases free on the way."""
        free = self.num_free_blocks
        table = seq.block_table
        refs = {i: self._ref_counts[table[i]] for i in range(seq.blocks.first_held, len(table))}
        needed = 0
        for kind, where in self._window_steps(seq, count):
            if kind == "release":
                free += refs.pop(where) == 1
            elif kind == "take":
                needed += 1
                free -= 1
                if free < 0:
                    raise OutOfBlocksError(
                        f"out of KV blocks: {count:,} more tokens for sequence {seq_id!r} need a new block "
                        f"of {self._block_size} tokens when none of {self.num_blocks:,} is free (window "
                        f"{self._window:,} tokens)",
                        needed=needed,
                        free=needed - 1,
                    )
                refs[where // self._block_size] = 1

    def _extend_windowed(self, seq: _Sequence, tokens: list) -> tuple[int, int] | None:
        """Apply the appends of `tokens` under the window (room already checked); returns the copy-on-write pair."""
        manager, rec = self._manager, seq.blocks
        steps = list(self._window_steps(seq, len(tokens)))
        seq.token_ids.extend(tokens)
        cow = None
        for kind, where in steps:
            if kind == "release":
                manager.release_leading(rec, where + 1)
            elif kind == "take":
                cow = manager.append_slots(rec, where, where + 1) or cow
            elif self._caching:
                self._cache_full_blocks(seq, where + 1)
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
        tokens = check_kv_token_ids(seq_id, token_ids)
        bs = self._block_size
        num_needed = self.blocks_needed(len(tokens))
        hashes: list[int] = []
        hits: list[int] = []
        manager = self._manager
        if self._caching:
            extend_block_hashes(hashes, tokens, bs, len(tokens) // bs, self._hash_fn())
            hits = manager.find_longest_cache_hit(hashes, tokens, (len(tokens) - 1) // bs)
        revived = sum(1 for b in hits if self._ref_counts[b] == 0)
        num_new = num_needed - len(hits)
        available = self.num_free_blocks - revived
        if num_new > available:
            raise OutOfBlocksError(
                f"out of KV blocks: sequence {seq_id!r} ({len(tokens):,} tokens) needs {num_new:,} new blocks "
                f"of {bs} tokens, {available:,} of {self.num_blocks:,} free",
                needed=num_new,
                free=available,
            )
        rec = manager.save_hits(seq_id, hits, release_skipped=False)
        manager.append_slots(rec, 0, len(tokens))
        seq = _Sequence(rec, tokens, hashes)
        self._seqs[seq_id] = seq
        self._arm(seq)
        if self._caching:
            manager.cache_blocks(rec, hashes, tokens, len(tokens))
            stats = self._stats
            stats.queries_tokens += len(tokens)
            stats.hits_tokens += len(hits) * bs
            stats.queries_blocks += num_needed
            stats.hits_blocks += len(hits)
        return len(hits)

    def append_token(self, seq_id: SeqId, token_id: int) -> AppendResult:
        """Make room for one more token of `seq_id` and say where its K/V go.

        A new block is taken only when the last block is full (the token starts a new block), or for
        copy-on-write when the partially filled last block is shared: then `cow = (src, dst)` names the copy the
        caller must make. With a sliding window, the blocks that fall out of the new token's window are
        released first (and count as free for this token). Raises UnknownSequenceError or OutOfBlocksError with
        nothing changed.

        The per-token hot path: a token that lands in the unshared last block without filling it (all but 2
        of every block_size decode tokens with prefix caching, all but 1 without) touches two attributes and
        the token list (see `_Sequence`); the rest go through `_append_slow`.
        """
        try:
            seq = self._seqs[seq_id]
        except KeyError:
            raise UnknownSequenceError(
                f"unknown sequence {seq_id!r}; live sequences: {self._live_summary()}"
            ) from None
        slot = seq.next_slot
        if slot < seq.fast_end:
            seq.next_slot = slot + 1
            seq.token_ids.append(token_id)
            return _new_tuple(AppendResult, (slot, None))  # AppendResult(slot, None), without its frame
        return self._append_slow(seq_id, seq, token_id)

    def _append_slow(self, seq_id: SeqId, seq: _Sequence, token_id: int) -> AppendResult:
        """`append_token` when the token starts a block, fills one, needs copy-on-write, or a window applies.
        Full attention's cases are inlined (each is what the single-type manager and `_cache_full_blocks`
        would do for one token): this runs for 2 of every block_size decode tokens."""
        bs = self._block_size
        table = seq.block_table
        tokens = seq.token_ids
        n = len(tokens)
        offset = n % bs
        if self._window is not None:
            self._check_window_room(seq_id, seq, 1)
            cow = self._extend_windowed(seq, [token_id])
            return AppendResult(table[-1] * bs + offset, cow)
        cow = None
        if offset == 0:  # the token starts a block: `append_slots` of full attention, for one token
            table.append(self._pool.take_one())  # raises before any change
        elif self._ref_counts[table[-1]] > 1:  # copy-on-write of a shared tail
            cow = self._manager.append_slots(seq.blocks, n, n + 1)  # take_one raises before any change
        block = table[-1]
        tokens.append(token_id)
        if offset == bs - 1 and self._caching:  # the block is now full: hash it and maybe cache it
            hashes = seq.block_hashes
            parent = hashes[-1] if hashes else None
            full = tuple(tokens[-bs:])
            block_hash = self._hash_fn()(parent, full)
            hashes.append(block_hash)
            self._pool.cache_block(0, block, block_hash, parent, full)
            seq.blocks.num_cached = len(hashes)
        slot = block * bs + offset
        seq.next_slot = slot + 1  # the last block is this sequence's alone now (ref count 1): arm
        seq.fast_end = block * bs + self._fast_fill
        return _new_tuple(AppendResult, (slot, cow))

    def _arm(self, seq: _Sequence) -> None:
        """Set the append fast path's bounds after the sequence's table or its tail's sharing changed (see
        `_Sequence`): armed only under full attention with an unshared last block."""
        table = seq.block_table
        if self._window is not None or self._ref_counts[table[-1]] > 1:
            seq.next_slot = seq.fast_end = 0
            return
        base = table[-1] * self._block_size
        seq.next_slot = base + len(seq.token_ids) - (len(table) - 1) * self._block_size
        seq.fast_end = base + self._fast_fill

    def append_tokens(self, seq_id: SeqId, token_ids: Sequence[int]) -> list[AppendResult]:
        """`append_token` for each token in order, all or nothing: if the pool runs out part-way, the
        sequence and the pool are restored to their state before the call and OutOfBlocksError is raised."""
        seq = self._seq(seq_id)
        tokens = list(token_ids)
        if self._window is not None:
            self._check_window_room(seq_id, seq, len(tokens))
        else:
            self._check_room(seq_id, seq, len(tokens))
        return [self.append_token(seq_id, t) for t in tokens]

    def _check_room(self, seq_id: SeqId, seq: _Sequence, count: int) -> None:
        """Raise OutOfBlocksError (nothing changed) unless `count` more tokens fit (full attention)."""
        old = seq.num_tokens
        needed = self._manager.num_blocks_to_append(seq.blocks, old, old + count) if count > 0 else 0
        free = self.num_free_blocks
        if needed > free:
            raise OutOfBlocksError(
                f"out of KV blocks: {count:,} more tokens for sequence {seq_id!r} need {needed:,} new "
                f"blocks, {free:,} of {self.num_blocks:,} free",
                needed=needed,
                free=free,
            )

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
        self._check_room(seq_id, seq, len(tokens))
        bs = self._block_size
        old = seq.num_tokens
        new = old + len(tokens)
        seq.token_ids.extend(tokens)
        if not self._caching:
            cow = self._manager.append_slots(seq.blocks, old, new)
        else:
            cow = None
            for index in range(old // bs, cdiv(new, bs)):  # take and cache block by block, as append_token
                end = min(new, (index + 1) * bs)
                cow = self._manager.append_slots(seq.blocks, max(old, index * bs), end) or cow
                if end == (index + 1) * bs:
                    self._cache_full_blocks(seq, index + 1)
        self._arm(seq)
        return cow

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """The child shares every block the parent still holds (each ref count + 1; released entries stay -1),
        as for parallel sampling and beam search. Raises UnknownSequenceError (parent) or DuplicateSequenceError
        (child) with nothing changed."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise DuplicateSequenceError(f"cannot fork into {child_id!r}: that sequence already exists")
        rec = self._manager.fork(parent_id, child_id)
        child = _Sequence(rec, list(parent.token_ids), list(parent.block_hashes))
        self._seqs[child_id] = child
        self._arm(parent)  # the tail is shared now: both take the slow path (copy-on-write) next
        self._arm(child)

    def free(self, seq_id: SeqId) -> None:
        """Drop the sequence. Each block it still holds loses one reference; a block whose count reaches 0
        becomes free (cached-free if it holds a cached full block). Blocks are released last to first."""
        if self._seqs.pop(seq_id, None) is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}; live sequences: {self._live_summary()}")
        self._manager.free(seq_id)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block hash; free cached blocks become plain free blocks. Returns how many
        hashes were dropped."""
        return self._pool.reset_prefix_cache()

    # ---- snapshot ---------------------------------------------------------------------------------------------

    def snapshot(self) -> KVCacheSnapshot:
        """The pool and the sequences' tables as the one snapshot type (`core.kv.snapshot`, one group: a holder
        is a sequence, `snapshot.table(s)` its block table). O(blocks + table entries)."""
        return build_snapshot(self._pool, [self._manager], {s: q.num_tokens for s, q in self._seqs.items()})
