"""`BlockManager`: one KV cache group for callers that write K/V at once (the playground, the paged KVCache),
a thin facade over `core.kv`, whose pool and single-type manager (full attention, or a sliding window) make
every take, release, copy-on-write and cache registration. It adds: a full block is cached at once; before the
token at position n takes room, a window releases what no token from n on reads (`num_skipped_blocks(n)`);
each token's slot. Invariants: the pool's and the manager's (tests/paging checks them against brute force)."""

from collections.abc import Hashable, Sequence

from core.common import cdiv, check_int
from core.errors import DuplicateSequenceError, UnknownSequenceError
from core.kv.block_hash import extend_block_hashes, hash_block_tokens
from core.kv.block_pool import BlockPool
from core.kv.events import KVEvent
from core.kv.kv_cache_manager import check_kv_token_ids
from core.kv.single_type_manager import RequestBlocks, manager_for
from core.kv.snapshot import KVCacheSnapshot, build_snapshot
from core.kv.specs import FullAttentionSpec, SlidingWindowSpec
from core.paging.block_views import AppendResult, PrefixCacheStats, slot_results

__all__ = ["AppendResult", "BlockManager", "KVCacheSnapshot", "PrefixCacheStats"]

_chain_hash = hash_block_tokens  # the default key of a full block (looked up at call time: tests swap it)
_new_tuple = tuple.__new__


class _Sequence(list):
    """A sequence's tokens (the list itself: a fast append touches one object), block hashes, table (`blocks`,
    `block_table` its list); `fast` yields the results of next tokens needing only a slot in the tail (`_arm`)."""

    __slots__ = ("block_hashes", "block_table", "blocks", "fast")

    def __init__(self, blocks: RequestBlocks, token_ids: list[int], block_hashes: list[int]):
        super().__init__(token_ids)
        self.blocks, self.block_table, self.block_hashes = blocks, blocks.table, block_hashes
        self.fast = iter(())


class BlockManager:
    """KV blocks for sequences (hashable ids): sharing, prefix caching, a window, vLLM's KV cache events."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        sliding_window: int | None = None,
        enable_kv_cache_events: bool = False,
        block_hasher=None,
    ):
        self.block_size = bs = check_int(block_size, "block_size", minimum=1)
        window = None if sliding_window is None else check_int(sliding_window, "sliding_window", minimum=1)
        shape = {"block_size": bs, "num_kv_heads": 0, "head_size": 0}
        spec = SlidingWindowSpec(**shape, sliding_window=window) if window else FullAttentionSpec(**shape)
        self.sliding_window = window
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._block_hasher = block_hasher  # None: Python's hash (`_chain_hash`), else e.g. a VllmBlockHasher
        self.pool = BlockPool(num_blocks, [spec], enable_kv_cache_events=enable_kv_cache_events)
        self._manager = manager_for(spec, self.pool, 0)
        self._seqs: dict[Hashable, _Sequence] = {}
        self._counts = [0, 0, 0, 0]  # prefix-cache queries and hits, in tokens, then in blocks

    num_blocks = property(lambda self: self.pool.num_blocks)
    num_free_blocks = property(lambda self: self.pool.num_free_blocks)  # uncached and cached (evictable)
    num_cached_free_blocks = property(lambda self: self.pool.num_cached_free_blocks)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:  # the counters now, frozen
        evicted = self.pool.num_evicted_blocks
        return PrefixCacheStats(*self._counts, evicted, evicted * self.block_size)

    def take_events(self) -> list[KVEvent]:  # since the last call, oldest first (none unless enabled)
        return self.pool.take_events()

    def _seq(self, seq_id: Hashable) -> _Sequence:
        if seq_id in self._seqs:
            return self._seqs[seq_id]
        ids = list(self._seqs)
        shown = ", ".join(map(repr, ids[:8])) + (", ..." if len(ids) > 8 else "") + f"] ({len(ids)} in all)"
        raise UnknownSequenceError(f"unknown sequence {seq_id!r}; live sequences: [{shown}")

    def seq_ids(self) -> list[Hashable]:  # in the order they were allocated or forked
        return list(self._seqs)

    def block_table(self, seq_id: Hashable) -> list[int]:  # a copy; -1: released by the window
        return list(self._seq(seq_id).block_table)

    def num_held_blocks(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).blocks.num_held

    def num_tokens(self, seq_id: Hashable) -> int:
        return len(self._seq(seq_id))

    def token_ids(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id))

    def ref_count(self, block_id: int) -> int:
        return self.pool.ref_count(check_int(block_id, "block_id", minimum=0, maximum=self.num_blocks - 1))

    def blocks_needed(self, num_tokens: int) -> int:  # the blocks a new prompt holds (window or not)
        return cdiv(num_tokens, self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:  # counting no prefix-cache hits
        return self.blocks_needed(check_int(num_tokens, "num_tokens", minimum=1)) <= self.num_free_blocks

    def allocate(self, seq_id: Hashable, token_ids: Sequence[int]) -> int:
        """Room for a prompt, from its longest cached prefix (never its last token's block): returns hits."""
        if seq_id in self._seqs:
            raise DuplicateSequenceError(f"sequence {seq_id!r} already exists; free it or choose a new id")
        tokens = check_kv_token_ids(seq_id, token_ids)
        bs, manager, n = self.block_size, self._manager, len(tokens)
        hashes, hits = [], []
        if self.enable_prefix_caching:
            extend_block_hashes(hashes, tokens, bs, n // bs, self._block_hasher or _chain_hash)
            hits = manager.find_longest_cache_hit(hashes, tokens, (n - 1) // bs)
        num_new = self.blocks_needed(n) - len(hits)
        available = self.num_free_blocks - sum(1 for b in hits if not self.pool.ref_count(b))  # revived hits
        self.pool.check_free(num_new, f"sequence {seq_id!r} ({n:,} tokens) needs", free=available)
        rec = manager.save_hits(seq_id, hits, release_skipped=False)
        manager.append_slots(rec, 0, n)
        self._seqs[seq_id] = seq = _Sequence(rec, tokens, hashes)
        self._arm(seq)
        if self.enable_prefix_caching:
            manager.cache_blocks(rec, hashes, tokens, n)
            added = (n, len(hits) * bs, self.blocks_needed(n), len(hits))
            self._counts = [count + more for count, more in zip(self._counts, added, strict=True)]
        return len(hits)

    def append_token(self, seq_id: Hashable, token_id: int) -> AppendResult:
        """Room for one more token: `AppendResult(slot, cow)`, cow = (src, dst) when the shared last block was
        copied. The one append path: the next fast slot (`_Sequence.fast`), else `_append_slow`."""
        try:
            seq = self._seqs[seq_id]
        except KeyError:
            seq = self._seq(seq_id)  # raises UnknownSequenceError
        for result in seq.fast:  # AppendResult(slot, None) for a token that needs no block work
            seq.append(token_id)
            return result
        return self._append_slow(seq, seq_id, token_id)

    def _append_slow(self, seq: _Sequence, seq_id: Hashable, token_id: int) -> AppendResult:
        """`append_token` past the fast slots: window releases, a block or a copy, caching a full block."""
        manager, rec, tokens, bs = self._manager, seq.blocks, seq, self.block_size
        p, table, window = len(tokens), seq.block_table, self.sliding_window is not None
        if window:  # what the token at p no longer reads goes first
            self.pool.check_free(manager.num_blocks_to_write(rec, p, p + 1), "sequence %r needs", seq_id)
            manager.remove_skipped_blocks(rec, p)
            cow = manager.append_slots(rec, p, p + 1)
        elif p % bs == 0:  # full attention's `append_slots` for one token: a new block, no copy (None)
            cow = table.append(self.pool.take_one())  # OutOfBlocksError before any change
        else:  # or a copy of a shared last block (`take_one` raises before any change)
            cow = manager.copy_on_write(rec, p)  # None unless the last block is shared
        tokens.append(token_id)
        if self.enable_prefix_caching and (p + 1) % bs == 0:  # a full block: hashed, cached
            hashes, full = seq.block_hashes, tuple(tokens[-bs:])
            parent = hashes[-1] if hashes else None
            hashes.append((self._block_hasher or _chain_hash)(parent, full))
            self.pool.cache_block(0, table[-1], hashes[-1], parent, full)
            rec.num_cached = len(hashes)
        slot = table[-1] * bs + p % bs
        if not window:  # the last block is this sequence's alone now: its next tokens take fast slots
            seq.fast = slot_results(slot + 1, slot - p % bs + bs - self.enable_prefix_caching)
        return _new_tuple(AppendResult, (slot, cow))

    def _arm(self, seq: _Sequence) -> None:  # fast slots for full attention in an unshared tail (a filling
        table, bs, seq.fast = seq.block_table, self.block_size, iter(())  # token is hashed: never fast)
        if self.sliding_window is None and self.pool.ref_count(table[-1]) == 1:
            start = table[-1] * bs + len(seq) - (len(table) - 1) * bs
            seq.fast = slot_results(start, table[-1] * bs + bs - self.enable_prefix_caching)

    def append_tokens(self, seq_id: Hashable, token_ids: Sequence[int]) -> list[AppendResult]:
        """`append_token` for each token, all or nothing."""
        tokens, n = list(token_ids), self.num_tokens(seq_id)
        room = self._manager.num_blocks_to_write(self._seqs[seq_id].blocks, n, n + len(tokens))
        self.pool.check_free(room, f"{len(tokens):,} more tokens for sequence {seq_id!r} need")
        return [self.append_token(seq_id, t) for t in tokens]

    def extend(self, seq_id: Hashable, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """`append_tokens` returning only the copy-on-write pair of the first token (only it can need one)."""
        return next((result.cow for result in self.append_tokens(seq_id, token_ids)), None)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:  # shares every block the parent holds
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise DuplicateSequenceError(f"cannot fork into {child_id!r}: that sequence already exists")
        rec = self._manager.fork(parent_id, child_id)
        self._seqs[child_id] = child = _Sequence(rec, parent, list(parent.block_hashes))
        for seq in (parent, child):
            self._arm(seq)  # the tail is shared now: both take the slow path (copy-on-write) next

    def free(self, seq_id: Hashable) -> None:  # each held block loses a reference, last to first
        self._seq(seq_id)
        del self._seqs[seq_id]
        self._manager.free(seq_id)

    def reset_prefix_cache(self) -> int:  # how many hashes were dropped
        return self.pool.reset_prefix_cache()

    def snapshot(self) -> KVCacheSnapshot:  # one group: a holder is a sequence
        lengths = {seq_id: len(seq) for seq_id, seq in self._seqs.items()}
        return build_snapshot(self.pool, [self._manager], lengths)
