"""Single-type managers: the block tables of ONE KV cache group, by layer kind (vLLM V1's
`vllm/v1/core/single_type_kv_cache_manager.py`), all drawing block ids from one shared `BlockPool`.

A manager holds, per request, a `RequestBlocks`: its block table (logical block i -> physical block id, -1 once
released), the index of its first held entry, and how many of its leading full blocks it has offered to the
prefix cache. Token ids, computed counts and block hashes belong to the caller (`KVCacheManager` or the
`BlockManager` facade); managers receive them as arguments.

Kinds (chosen by spec with `manager_for`):
- `FullAttentionManager`: the table covers every token; nothing is released before the request ends.
- `SlidingWindowManager` (window W): once `c` tokens are computed, the next token (position c) reads positions
  c - W + 1 .. c, so the leading (c - W + 1) // B blocks are released.
- `ChunkedLocalAttentionManager` (chunk C): the next token reads only its own chunk, which starts at
  (c // C) * C, so the leading ((c // C) * C) // B blocks are released.
- `MambaManager`: one state block per request, whatever its length; never cached, never released early.

Invariants every manager keeps (with the pool's):
- `len(table) == num_required_blocks(num_tokens)` for the tokens the caller made room for; entries
  [0, first_held) are -1 and every other entry is a block id held (ref count >= 1) for this request.
- Blocks are released only when the computed tokens have moved past them (`remove_skipped_blocks`), never
  blocks of uncomputed tokens: a prompt is held whole until computed.
- A block that will be written (a partially filled last block; Mamba's state block) is never shared when it is
  written: `append_slots` copies it first (copy-on-write) and returns the (src, dst) pair.
- A request releases its blocks last to first when freed, so its tail is evicted before its head.
"""

import functools
from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

from core.kv.block_pool import BlockPool
from core.kv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)


class RequestBlocks:
    """One request's blocks in one group: `table` (-1 for released entries [0, first_held)), `first_held`,
    and `num_cached` (leading full blocks already offered to the prefix cache)."""

    __slots__ = ("first_held", "num_cached", "table")

    def __init__(self, table: list[int], first_held: int = 0, num_cached: int = 0):
        self.table = table
        self.first_held = first_held
        self.num_cached = num_cached

    @property
    def num_held(self) -> int:
        return len(self.table) - self.first_held


class BlockCopy(NamedTuple):
    """A copy-on-write: the K/V of block `src` (shared, about to be written) are copied into `dst`, the
    writer's own block, before the write."""

    src: int
    dst: int


class KVCacheBlocks(tuple):
    """One request's block tables, one per KV cache group in order (vLLM V1's `KVCacheBlocks`):
    `blocks[g][i]` is the physical block of logical block i in group g, -1 where the group released it. A
    tuple of lists, so it indexes, iterates and compares like the tuples it replaces."""

    __slots__ = ()

    @property
    def num_held(self) -> tuple[int, ...]:
        """Blocks held in each group (entries that are not -1)."""
        return tuple(sum(1 for b in table if b >= 0) for table in self)


_MANAGER_OF_SPEC: dict[type[KVCacheSpec], type["SingleTypeKVCacheManager"]] = {}


class SingleTypeKVCacheManager:
    """Full attention's behaviour; subclasses change which blocks are needed, skipped, cached and written."""

    caches_blocks = True  # whether its full blocks enter the prefix cache
    skips_tokens = False  # whether `num_skipped_tokens` is overridden (set for each subclass)
    spec_type: type[KVCacheSpec] | None = None  # the spec class this manager serves (see `manager_for`)

    def __init_subclass__(cls, **kwargs):
        """A subclass that names its `spec_type` is the manager of that spec class: a new layer kind is its
        spec (core/kv/specs.py) plus one manager class here, nothing else to edit."""
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("spec_type") is not None:
            _MANAGER_OF_SPEC[cls.spec_type] = cls
        # whether `num_skipped_tokens` may be > 0 (a kind that overrides it): lets sums skip the call
        cls.skips_tokens = cls.num_skipped_tokens is not SingleTypeKVCacheManager.num_skipped_tokens

    def __init__(self, spec: KVCacheSpec, pool: BlockPool, group_idx: int):
        self.spec = spec
        self.pool = pool
        self.group_idx = group_idx
        self.block_size = spec.block_size
        self.requests: dict[Hashable, RequestBlocks] = {}

    # ---- arithmetic (pure) --------------------------------------------------------------------------------

    def num_required_blocks(self, num_tokens: int) -> int:
        """Table length once room is made for `num_tokens` tokens: ceil(num_tokens / block_size) (elementwise for
        an int64 array too)."""
        return -(-num_tokens // self.block_size)

    def num_skipped_tokens(self, num_computed: int) -> int:
        """THE window rule (vLLM's `get_num_skipped_tokens`): how many leading tokens no uncomputed token reads
        once `num_computed` tokens are computed, i.e. the first position the next token (position
        `num_computed`) attends to. Full attention (and MLA, Mamba): 0, every token stays readable.

        Worked example, block size B = 4, 10 tokens computed (the next token is position 10):
        - sliding window W = 4: position 10 reads 7..10, so 10 - 4 + 1 = 7 tokens are skipped and 7 // 4 = 1
          leading block (positions 0..3) is released; block 1 (4..7) stays, position 7 is still read.
        - chunked local attention C = 8: position 10 is in the chunk 8..15, so 10 // 8 * 8 = 8 tokens are
          skipped and 8 // 4 = 2 blocks are released.
        - full attention: 0 tokens, 0 blocks.
        Every caller that asks which blocks a request no longer needs, or which tokens a query reads, goes
        through this method (the block manager facade, `num_skipped_blocks`, hits behind a window, the serving
        policy's release prediction, the engine's fit check, `num_keys_read`: the K/V a step reads);
        subclasses override only this, and keep it non-decreasing in `num_computed` and elementwise for an int64
        array."""
        return 0

    def num_keys_read(self, starts: np.ndarray) -> np.ndarray:
        """Earlier keys read by query spans that start at positions `starts` (int64 array): a span starting at s
        (a decode: s is its context; a prefill chunk: its first position) reads s - num_skipped_tokens(s) keys
        before itself (its first query's window; its later queries read their own span too); summed over the
        last axis."""
        return (starts - self.num_skipped_tokens(starts)).sum(axis=-1)

    def max_blocks_held(self, prompt_len: int, num_tokens: int) -> int:
        """An upper bound on the blocks one unshared request holds at any time while it grows from a
        `prompt_len`-token prompt (held whole until computed) to `num_tokens` tokens: all of them under full
        attention; otherwise the blocks covering the most tokens one of its queries reads, plus one because
        those need not start on a block boundary (a window W: ceil((W + B - 1) / B)), never more than all."""
        every = self.num_required_blocks(num_tokens)
        lengths = np.arange(1, max(num_tokens, 1) + 1, dtype=np.int64)
        most_read = int((lengths - self.num_skipped_tokens(lengths - 1)).max())
        reading = self.num_required_blocks(most_read + self.block_size - 1)
        return min(every, max(self.num_required_blocks(prompt_len), reading))

    def num_skipped_blocks(self, num_computed: int) -> int:
        """Leading blocks no uncomputed token will read once `num_computed` tokens are computed: the blocks
        wholly inside `num_skipped_tokens(num_computed)`."""
        return self.num_skipped_tokens(num_computed) // self.block_size

    def tail_is_written(self, num_tokens: int) -> bool:
        """Whether the next token writes into the existing last block (so a shared one must be copied)."""
        return num_tokens % self.block_size != 0

    # ---- planning (no change) -----------------------------------------------------------------------------

    def find_longest_cache_hit(
        self, hashes: Sequence[int], token_ids: Sequence[int], max_blocks: int, known_keys: Sequence = ()
    ) -> list[int]:
        """The cached blocks holding the longest run of leading full blocks (at most `max_blocks`) of
        `token_ids`, whose chained hashes are `hashes`; a block is a hit only with equal tokens and parent.
        known_keys: as `BlockPool.longest_cached_run` takes them."""
        return self.pool.longest_cached_run(
            self.group_idx, hashes, token_ids, self.block_size, max_blocks, known_keys
        )

    def num_new_blocks(self, num_entries: int, num_tokens: int, num_computed: int) -> int:
        """THE blocks-per-step rule of one group (vLLM's `get_num_blocks_to_allocate`): table entries to take
        anew so that a table of `num_entries` entries makes room for `num_tokens` tokens once `num_computed` of
        them are computed. Entries wholly behind the window (`num_skipped_blocks(num_computed)`) are never
        taken: `max(0, num_required_blocks(num_tokens) - max(num_skipped_blocks(num_computed), num_entries))`.

        Worked example, block size 4, a table of 3 entries (room for 9..12 tokens), 12 tokens computed:
        - full attention, room for 13 tokens: 4 - max(0, 3) = 1 new block.
        - sliding window W = 4 (skips 9 tokens, 2 blocks), room for 20 tokens: 5 - max(2, 3) = 2.
        - sliding window W = 4, 18 computed (skips 15 tokens, 3 blocks), room for 20: 5 - max(3, 3) = 2;
          with 19 computed (skips 16 tokens, 4 blocks), 5 - 4 = 1: logical block 3 is never taken.
        Every "how many blocks does this take" question of `KVCacheManager` (admission, a decode step, a run
        of decode steps) and of the serving policies adds up this method's answers over groups and requests
        (through `num_new_entries` where the caller already knows the skipped blocks)."""
        return self.num_new_entries(
            num_entries, num_tokens, self.num_skipped_blocks(num_computed) if self.skips_tokens else 0
        )

    def num_new_entries(self, num_entries: int, num_tokens: int, num_skipped_blocks: int) -> int:
        """`num_new_blocks` given `num_skipped_blocks(num_computed)`, the formula itself: the coordinator's
        decode question has already asked the window rule for the skipped blocks (it releases them), so it asks
        this instead of asking the rule twice."""
        new = self.num_required_blocks(num_tokens) - (
            num_skipped_blocks if num_skipped_blocks > num_entries else num_entries
        )
        return new if new > 0 else 0

    def written_tail(self, rec: RequestBlocks, num_tokens: int, num_skipped_blocks: int) -> int:
        """The held last block that the token at position `num_tokens` writes once the leading
        `num_skipped_blocks` blocks are released (`num_skipped_blocks(num_computed)`), or -1: the block a shared
        table must copy first (copy-on-write)."""
        table = rec.table
        last = len(table) - 1
        if last < num_skipped_blocks or last < rec.first_held or not self.tail_is_written(num_tokens):
            return -1
        return table[last]

    def num_blocks_to_allocate(self, num_tokens: int, hits: Sequence[int]) -> int:
        """Free blocks a new request of `num_tokens` tokens consumes with these hits (computed): the new entries
        (`num_new_blocks` of a table of the hits) plus the hit blocks it holds that are free now (reviving them
        takes them off the free queues). Hit blocks that no uncomputed token reads (behind a window) are not
        held."""
        ref_counts = self.pool.ref_counts
        computed = len(hits) * self.block_size
        skip = self.num_skipped_blocks(computed)
        revived = list(map(ref_counts.__getitem__, hits[skip:])).count(0)  # free now: taken off the queue
        return self.num_new_blocks(len(hits), num_tokens, computed) + revived

    def num_blocks_to_append(self, rec: RequestBlocks, old_tokens: int, new_tokens: int) -> int:
        """Free blocks taken to grow the request from `old_tokens` to `new_tokens` tokens, nothing released on
        the way: one for copy-on-write of a shared, written last block, plus `num_new_blocks`."""
        tail = self.written_tail(rec, old_tokens, 0)
        cow = tail >= 0 and self.pool.ref_counts[tail] > 1
        return int(cow) + self.num_new_blocks(len(rec.table), new_tokens, 0)

    def num_blocks_to_write(self, rec: RequestBlocks, old_tokens: int, new_tokens: int) -> int:
        """Free blocks needed to grow the request one token at a time from `old_tokens` to `new_tokens` when each
        token's K/V are written at once (the block manager facade): before the token at position p takes room,
        the blocks no token from p on reads (`num_skipped_blocks(p)`) are released, freeing those this request
        alone holds. The most blocks short at any take (0 for no token; `num_blocks_to_append` when nothing is
        skipped): the same order of releases and takes as `BlockManager.append_token`, token by token.

        Worked example, block size 2, window 4, a table of 3 blocks (6 tokens) shared with a fork: token 6
        releases block 0 (its fork still holds it, nothing is freed) and takes a block: 1 needed."""
        if new_tokens <= old_tokens:
            return 0
        if not self.skips_tokens:
            return self.num_blocks_to_append(rec, old_tokens, new_tokens)
        ref_counts, table, bs = self.pool.ref_counts, rec.table, self.block_size
        refs = {i: ref_counts[table[i]] for i in range(rec.first_held, len(table))}
        held, short, most = rec.first_held, 0, 0
        shared_tail = old_tokens % bs and ref_counts[table[-1]] > 1  # copied by the first token
        starts = range(-(-old_tokens // bs) * bs, new_tokens, bs)  # the tokens that start a block
        for p in [old_tokens, *starts] if shared_tail else starts:
            skip = self.num_skipped_blocks(p)
            for index in range(held, skip):  # released before the token at p
                short -= refs.pop(index) == 1
            held = max(held, skip)
            short += 1  # the token at p takes a block (a new one, or its copy of the shared tail)
            most = max(most, short)
            refs[p // bs] = 1
        return most

    # ---- changes ------------------------------------------------------------------------------------------

    def save_hits(
        self, request_id: Hashable, hits: Sequence[int], *, release_skipped: bool = True
    ) -> RequestBlocks:
        """Start a new request's table with its prefix-cache hits (computed: one more reference each, a free
        cached one revived; with `release_skipped`, the leading hits no uncomputed token reads stay -1 and are
        not held). Call it for every group before any group takes new blocks, so that taking cannot evict
        another group's hit."""
        pool = self.pool
        skip = self.num_skipped_blocks(len(hits) * self.block_size) if release_skipped else 0
        pool.touch_all(hits[skip:] if skip else hits)
        rec = RequestBlocks([-1] * skip + list(hits[skip:]), skip, len(hits) if self.caches_blocks else 0)
        self.requests[request_id] = rec
        return rec

    def append_slots(self, rec: RequestBlocks, old_tokens: int, new_tokens: int) -> BlockCopy | None:
        """Make room for tokens [old_tokens, new_tokens): copy a shared written last block first, then grow
        the table. Returns the copy-on-write pair (src, dst) whose K/V the caller copies, or None. The caller
        has checked capacity (`num_blocks_to_append`)."""
        pool = self.pool
        table = rec.table
        cow = self.copy_on_write(rec, old_tokens)
        new = self.num_new_blocks(len(table), new_tokens, 0)
        if new:
            table.extend(pool.take(new) if new > 1 else (pool.take_one(),))
        return cow

    def copy_on_write(
        self, rec: RequestBlocks, num_tokens: int, num_skipped_blocks: int = 0
    ) -> BlockCopy | None:
        """Before the token at position `num_tokens` is written: when the held last block it writes
        (`written_tail`) is shared, the request gets its own copy (a new block in the table; the shared one
        loses a reference). Returns `BlockCopy(src, dst)`, whose K/V the caller copies, or None. The one place
        a table copies on write (the per-token and the bulk decode paths both call it)."""
        src = self.written_tail(rec, num_tokens, num_skipped_blocks)
        if src < 0 or self.pool.ref_counts[src] <= 1:
            return None
        dst = self.pool.take_one()
        self.pool.release(src)
        rec.table[-1] = dst
        return BlockCopy(src, dst)

    def cache_blocks(
        self, rec: RequestBlocks, hashes: Sequence[int], token_ids: Sequence[int], num_computed: int
    ):
        """Offer the request's newly full computed blocks (up to num_computed // B) to the prefix cache;
        `hashes` holds at least that many chained keys."""
        if not self.caches_blocks:
            return
        bs = self.block_size
        num_full = min(num_computed // bs, len(rec.table))
        start = rec.num_cached
        if num_full <= start:
            return
        parent = hashes[start - 1] if start else None
        self.pool.cache_blocks(
            self.group_idx,
            rec.table[start:num_full],
            hashes[start:num_full],
            parent,
            token_ids[start * bs : num_full * bs],
            start,
        )
        rec.num_cached = num_full

    def remove_skipped_blocks(self, rec: RequestBlocks, num_computed: int) -> None:
        """Release the leading blocks no uncomputed token reads (entries become -1), oldest first."""
        self.release_leading(rec, self.num_skipped_blocks(num_computed))

    def release_leading(self, rec: RequestBlocks, stop: int) -> None:
        """Release entries [first_held, stop) of the table, oldest first, and set them to -1."""
        table = rec.table
        stop = min(stop, len(table))
        pool = self.pool
        for index in range(rec.first_held, stop):
            pool.release(table[index])
            table[index] = -1
        rec.first_held = max(rec.first_held, stop)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> RequestBlocks:
        """The child shares every block the parent holds (one more reference each); released entries stay -1."""
        parent = self.requests[parent_id]
        pool = self.pool
        for block in parent.table[parent.first_held :]:
            pool.touch(block)
        rec = RequestBlocks(list(parent.table), parent.first_held, parent.num_cached)
        self.requests[child_id] = rec
        return rec

    def free(self, request_id: Hashable) -> None:
        """Drop the request: its held blocks lose one reference each, last to first."""
        rec = self.requests.pop(request_id)
        table = rec.table
        self.pool.release_all(reversed(table[rec.first_held :] if rec.first_held else table))


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every block is kept until the request ends."""

    spec_type = FullAttentionSpec


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding window W: blocks wholly before the next token's window are released."""

    spec_type = SlidingWindowSpec

    def __init__(self, spec: SlidingWindowSpec, pool: BlockPool, group_idx: int):
        super().__init__(spec, pool, group_idx)
        self.sliding_window = spec.sliding_window

    def num_skipped_tokens(self, num_computed: int) -> int:
        skipped = num_computed - self.sliding_window + 1
        return skipped * (skipped > 0)  # max(0, skipped), for an int or elementwise for an int64 array


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention (chunk C): blocks wholly before the next token's chunk are released."""

    spec_type = ChunkedLocalAttentionSpec

    def __init__(self, spec: ChunkedLocalAttentionSpec, pool: BlockPool, group_idx: int):
        super().__init__(spec, pool, group_idx)
        self.attention_chunk_size = spec.attention_chunk_size

    def num_skipped_tokens(self, num_computed: int) -> int:
        chunk = self.attention_chunk_size
        return num_computed // chunk * chunk


class MambaManager(SingleTypeKVCacheManager):
    """A recurrent state: one block per request, rewritten by every token (shared after a fork until one side
    writes: copy-on-write), never cached, never a prefix-cache hit."""

    caches_blocks = False
    spec_type = MambaSpec

    def num_required_blocks(self, num_tokens: int) -> int:
        return 1 if num_tokens > 0 else 0

    def tail_is_written(self, num_tokens: int) -> bool:
        return True

    def find_longest_cache_hit(
        self, hashes: Sequence[int], token_ids: Sequence[int], max_blocks: int, known_keys: Sequence = ()
    ) -> list[int]:
        return []


@functools.cache
def rule_of(spec: KVCacheSpec) -> SingleTypeKVCacheManager:
    """The manager of `spec`'s kind without a pool, for its arithmetic only (`num_required_blocks`,
    `num_skipped_tokens`, `num_new_blocks`, `max_blocks_held`): what planners, counted policies and read
    counts ask without block tables. One per spec (specs are frozen and hashable)."""
    return manager_for(spec, None, -1)


def manager_for(spec: KVCacheSpec, pool: BlockPool | None, group_idx: int) -> SingleTypeKVCacheManager:
    """The manager of a group of `spec`'s kind: the manager registered for the nearest class of the spec's
    MRO (MLA layers keep their latents like full attention; an unregistered spec kind is full attention)."""
    for cls in type(spec).__mro__:
        manager = _MANAGER_OF_SPEC.get(cls)
        if manager is not None:
            return manager(spec, pool, group_idx)
    return FullAttentionManager(spec, pool, group_idx)
