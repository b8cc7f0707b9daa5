"""`BlockManager`: one KV cache group for callers that write K/V at once (the playground, the paged `KVCache`),
a thin facade over `core.kv`: its blocks come from a `BlockPool` and its tables live in one single-type manager
(full attention, or sliding window W), which makes every take, release, copy-on-write and cache registration.
The facade adds: a block enters the prefix cache as soon as it is full; before the token at position n takes
room, the window releases the blocks no token from n on reads (the KV core's `num_skipped_blocks(n)`; a prompt is
allocated whole); and the slot of each token's K/V. Metadata only. Invariants (tests/paging check them against a
brute-force model), with the pool's (`core.kv.block_pool`): `len(block_table(s)) == ceil(num_tokens(s) /
block_size)`, -1 for the entries a window released (a prefix); a block's ref count is the number of tables
holding it, and the block a token is written to has ref count 1 (copy-on-write); a prompt is never served
entirely from cache; a sequence is freed last block first; a refused call raises a `LabError`, nothing changed.
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
_chain_hash = hash_block_tokens  # the default key of a full block (looked up at call time: tests swap it)
_new_tuple = tuple.__new__


class _Sequence:
    """A sequence's tokens, chained block hashes and table (`blocks`, its `table` as `block_table`). While
    `next_slot < fast_end` the next token lands in the unshared last block without filling a block that must be
    hashed, and needs nothing but its slot (`BlockManager._arm` sets both; 0 under a window or a shared tail)."""

    __slots__ = ("block_hashes", "block_table", "blocks", "fast_end", "next_slot", "token_ids")

    def __init__(self, blocks: RequestBlocks, token_ids: list[int], block_hashes: list[int]):
        self.blocks, self.block_table = blocks, blocks.table
        self.token_ids, self.block_hashes = token_ids, block_hashes
        self.next_slot = self.fast_end = 0


class BlockManager:
    """Fixed-size KV blocks for sequences (any hashable id), with ref-counted sharing and optional prefix caching.

    num_blocks, block_size: >= 1. sliding_window: None, or W >= 1 (each token attends to the last W positions).
    enable_kv_cache_events: queue vLLM's KV cache events (group_idx 0) for `take_events()`.
    block_hasher: the chained key of a full block (`core.kv.block_hash`; None: Python's hash), e.g. a
    `VllmBlockHasher` for the keys, and so the events, of a vLLM server."""

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
        self.block_size = bs = check_int(block_size, "block_size", minimum=1)
        self.sliding_window = window = sliding_window and check_int(
            sliding_window, "sliding_window", minimum=1
        )
        shape = {"block_size": bs, "num_kv_heads": 0, "head_size": 0}
        spec = (
            FullAttentionSpec(**shape)
            if window is None
            else SlidingWindowSpec(**shape, sliding_window=window)
        )
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._block_hasher = block_hasher
        self.pool = BlockPool(num_blocks, [spec], enable_kv_cache_events=enable_kv_cache_events)
        self._manager = manager_for(spec, self.pool, 0)
        self._ref_counts = self.pool.ref_counts  # the pool's live list (read-only here)
        self._fast_fill = bs - 1 if self.enable_prefix_caching else bs  # a filling token is hashed: not fast
        self._seqs: dict[SeqId, _Sequence] = {}
        self._stats = PrefixCacheCounters()

    num_blocks = property(lambda self: self.pool.num_blocks)
    num_free_blocks = property(lambda self: self.pool.num_free_blocks)  # uncached and cached (evictable)
    num_cached_free_blocks = property(lambda self: self.pool.num_cached_free_blocks)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """A frozen copy of the counters now (later operations do not change it)."""
        self._stats.evictions_blocks = self.pool.num_evicted_blocks
        self._stats.evictions_tokens = self.pool.num_evicted_blocks * self.block_size
        return self._stats.frozen()

    def take_events(self) -> list[KVEvent]:
        """vLLM KV cache events since the last call, oldest first (always empty unless events are enabled)."""
        return self.pool.take_events()

    def _seq(self, seq_id: SeqId) -> _Sequence:
        seq = self._seqs.get(seq_id)
        if seq is None:
            ids = list(self._seqs)
            shown = ", ".join(repr(s) for s in ids[:8]) + (", ..." if len(ids) > 8 else "")
            raise UnknownSequenceError(
                f"unknown sequence {seq_id!r}; live sequences: [{shown}] ({len(ids)} in all)"
            )
        return seq

    def seq_ids(self) -> list[SeqId]:
        """Live sequence ids, in the order they were allocated or forked."""
        return list(self._seqs)

    def block_table(self, seq_id: SeqId) -> list[int]:
        """A copy of the sequence's block table (-1: released by the sliding window)."""
        return list(self._seq(seq_id).block_table)

    def num_held_blocks(self, seq_id: SeqId) -> int:
        return self._seq(seq_id).blocks.num_held

    def num_tokens(self, seq_id: SeqId) -> int:
        return len(self._seq(seq_id).token_ids)

    def token_ids(self, seq_id: SeqId) -> list[int]:
        return list(self._seq(seq_id).token_ids)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[check_int(block_id, "block_id", minimum=0, maximum=self.num_blocks - 1)]

    def blocks_needed(self, num_tokens: int) -> int:
        """ceil(num_tokens / block_size): the blocks a new prompt of that many tokens holds (window or not)."""
        return cdiv(num_tokens, self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new prompt of `num_tokens` fits in the free blocks, counting no prefix-cache hits."""
        return self.blocks_needed(check_int(num_tokens, "num_tokens", minimum=1)) <= self.num_free_blocks

    def _cache_full_blocks(self, seq: _Sequence, num_full: int) -> None:
        """Offer the sequence's blocks up to `num_full` (full, K/V written) to the prefix cache."""
        hasher = self._block_hasher or _chain_hash
        extend_block_hashes(seq.block_hashes, seq.token_ids, self.block_size, num_full, hasher)
        self._manager.cache_blocks(seq.blocks, seq.block_hashes, seq.token_ids, num_full * self.block_size)

    def allocate(self, seq_id: SeqId, token_ids: Sequence[int]) -> int:
        """Give a new sequence the blocks of its whole prompt, reusing the longest prefix of cached full blocks
        (never the last token's block, as in vLLM). Returns the number of leading blocks served by the cache.
        Raises DuplicateSequenceError, InvalidArgumentError (empty prompt, non-integer token), OutOfBlocksError."""
        if seq_id in self._seqs:
            raise DuplicateSequenceError(f"sequence {seq_id!r} already exists; free it or choose a new id")
        tokens = check_kv_token_ids(seq_id, token_ids)
        bs, manager, n = self.block_size, self._manager, len(tokens)
        hashes: list[int] = []
        hits: list[int] = []
        if self.enable_prefix_caching:
            extend_block_hashes(hashes, tokens, bs, n // bs, self._block_hasher or _chain_hash)
            hits = manager.find_longest_cache_hit(hashes, tokens, (n - 1) // bs)
        num_new = self.blocks_needed(n) - len(hits)
        available = self.num_free_blocks - sum(1 for b in hits if self._ref_counts[b] == 0)  # revived hits
        if num_new > available:
            self._out_of_blocks(f"sequence {seq_id!r} ({n:,} tokens) needs", num_new, available)
        rec = manager.save_hits(seq_id, hits, release_skipped=False)
        manager.append_slots(rec, 0, n)
        self._seqs[seq_id] = seq = _Sequence(rec, tokens, hashes)
        self._arm(seq)
        if self.enable_prefix_caching:
            manager.cache_blocks(rec, hashes, tokens, n)
            stats = self._stats
            stats.queries_tokens, stats.hits_tokens = (
                stats.queries_tokens + n,
                stats.hits_tokens + len(hits) * bs,
            )
            stats.queries_blocks += self.blocks_needed(n)
            stats.hits_blocks += len(hits)
        return len(hits)

    def append_token(self, seq_id: SeqId, token_id: int) -> AppendResult:
        """Make room for one more token and say where its K/V go: `AppendResult(slot, cow)`, cow = (src, dst)
        when the shared last block was copied first (the caller copies the K/V). Under a window the blocks behind
        the token's window are released first. Raises UnknownSequenceError or OutOfBlocksError, nothing changed.
        The hot path: a token that lands in the unshared last block without filling a block it must hash
        touches two attributes and the token list (`_Sequence`)."""
        seq = self._seqs.get(seq_id) or self._seq(seq_id)
        slot = seq.next_slot
        if slot < seq.fast_end:
            seq.next_slot = slot + 1
            seq.token_ids.append(token_id)
            return _new_tuple(AppendResult, (slot, None))  # AppendResult(slot, None), without its frame
        self._check_room(seq_id, seq, 1)
        manager, rec, tokens, bs = self._manager, seq.blocks, seq.token_ids, self.block_size
        p = len(tokens)
        if manager.skips_tokens:
            manager.remove_skipped_blocks(rec, p)  # what the token at p no longer reads
        cow = manager.append_slots(rec, p, p + 1)
        tokens.append(token_id)
        if self.enable_prefix_caching and (p + 1) % bs == 0:
            self._cache_full_blocks(seq, (p + 1) // bs)
        self._arm(seq)
        return _new_tuple(AppendResult, (seq.block_table[-1] * bs + p % bs, cow))

    def _arm(self, seq: _Sequence) -> None:
        """Set the fast path's bounds (see `_Sequence`): armed only under full attention with an unshared tail."""
        table = seq.block_table
        if self.sliding_window is not None or self._ref_counts[table[-1]] > 1:
            seq.next_slot = seq.fast_end = 0
            return
        base = table[-1] * self.block_size
        seq.next_slot = base + len(seq.token_ids) - (len(table) - 1) * self.block_size
        seq.fast_end = base + self._fast_fill

    def _check_room(self, seq_id: SeqId, seq: _Sequence, count: int) -> None:
        """Raise OutOfBlocksError (nothing changed) unless `count` more tokens fit, one at a time (the KV core's
        `num_blocks_to_write`: a window's releases free blocks on the way)."""
        old = len(seq.token_ids)
        needed = self._manager.num_blocks_to_write(seq.blocks, old, old + count)
        if needed > self.num_free_blocks:
            self._out_of_blocks(
                f"{count:,} more tokens for sequence {seq_id!r} need", needed, self.num_free_blocks
            )

    def _out_of_blocks(self, what: str, needed: int, free: int):
        raise OutOfBlocksError(
            f"out of KV blocks: {what} {needed:,} new blocks of {self.block_size} tokens, {free:,} of "
            f"{self.num_blocks:,} free",
            needed=needed,
            free=free,
        )

    def append_tokens(self, seq_id: SeqId, token_ids: Sequence[int]) -> list[AppendResult]:
        """`append_token` for each token in order, all or nothing (room is checked for all of them first)."""
        tokens = list(token_ids)
        self._check_room(seq_id, self._seq(seq_id), len(tokens))
        return [self.append_token(seq_id, t) for t in tokens]

    def extend(self, seq_id: SeqId, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """`append_tokens` returning only the copy-on-write pair of the first token (only it can need one)."""
        results = self.append_tokens(seq_id, token_ids)
        return results[0].cow if results else None

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """The child shares every block the parent still holds (each ref count + 1; released entries stay -1).
        Raises UnknownSequenceError (parent) or DuplicateSequenceError (child) with nothing changed."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise DuplicateSequenceError(f"cannot fork into {child_id!r}: that sequence already exists")
        rec = self._manager.fork(parent_id, child_id)
        self._seqs[child_id] = child = _Sequence(rec, list(parent.token_ids), list(parent.block_hashes))
        self._arm(parent)  # the tail is shared now: both take the slow path (copy-on-write) next
        self._arm(child)

    def free(self, seq_id: SeqId) -> None:
        """Drop the sequence: its held blocks lose one reference each, last to first (free at 0, cached-free
        when cached)."""
        self._seq(seq_id)
        del self._seqs[seq_id]
        self._manager.free(seq_id)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block hash; returns how many were dropped."""
        return self.pool.reset_prefix_cache()

    def snapshot(self) -> KVCacheSnapshot:
        """The pool and the sequences' tables as the one snapshot type (one group: a holder is a sequence)."""
        return build_snapshot(
            self.pool, [self._manager], {s: len(q.token_ids) for s, q in self._seqs.items()}
        )
