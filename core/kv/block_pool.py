"""`BlockPool`: the one pool of KV block ids that every KV cache group draws from (vLLM V1's
`vllm/v1/core/block_pool.py`), with ref counts, the prefix cache and the KV cache event queue.

Metadata only: the pool hands out ids; the tensors live elsewhere. The single-type managers
(`core.kv.single_type_manager`) own the block tables and call the pool.

Invariants (checked by tests/kv against a brute-force model):
- Every block id in [0, num_blocks) is in exactly one state: *held* (ref count >= 1: in at least one block
  table of some group), *free uncached* (ref count 0, in the uncached free queue) or *free cached* (ref count 0,
  holds a full, computed block the prefix cache can revive, in the cached LRU queue). `num_free_blocks` counts
  both free states, so `num_free_blocks + held == num_blocks`.
- A block belongs to at most one group at a time (ids are unique across groups); its ref count is the number
  of block-table entries (over all requests of its group) that name it.
- The prefix cache maps (group, block hash) -> block for full blocks only, at most one block per (group, hash):
  a newly full block whose hash is already cached in its group stays uncached (the first block keeps the key).
  A cached block's (parent hash, tokens) are kept, and a lookup is a hit only when they are equal too, so a
  64-bit hash collision is a miss. Cached blocks may be held or free; only a free cached block can be evicted.
- Take order: free uncached blocks first (least recently freed first), then free cached blocks, least recently
  freed first (LRU). Callers free a request's blocks last to first, so its tail is evicted before its head (the
  most shareable prefix). vLLM keeps one queue for both states; preferring empty blocks over cached ones keeps
  more of the cache and is the order this lab's BlockManager has always shown.
- Block hashes are the keys the managers compute (`core.kv.block_hash`): ints, or vLLM's 32-byte digests, which
  events carry as their low 64 bits (`event_block_hash`), as vLLM's do.
- Events (when enabled, drained by `take_events`): BlockStored when blocks enter the cache (one event per
  `cache_blocks` chain, split where a block was already cached), BlockRemoved when a free cached block is
  evicted because its slot is taken, AllBlocksCleared on `reset_prefix_cache`. Freeing a request emits nothing.
- `usage` = 1 - num_free_blocks / num_blocks (vLLM divides by num_blocks - 1 because its block 0 is a reserved
  null block; this pool has none: released table entries are -1 instead).
- Every public method either succeeds or raises a `LabError` with the pool unchanged.

The connector seam (vLLM's KV connector, `vllm/distributed/kv_transfer/kv_connector/v1/base.py`, whose native
host-memory backend is `core.kv.host_tier.HostTier`): `hook` is None or a `PoolHook`, told of what enters and
what leaves the prefix cache and asked for blocks the pool does not hold:
- `on_stored`: every chain `cache_blocks` registers (newly computed full blocks, those whose hash was cached
  already included) is offered afterwards (vLLM stores as blocks are produced: the host tier is inclusive).
- `on_evicted`: a cached block whose slot is taken (the BlockRemoved moment) hands over its hash, parent and
  tokens, so what eviction drops can be stored elsewhere (the host tier ignores it: it stored the block already).
- `lookup_external`: the pool's caller (`KVCacheManager.allocate`) continues a prompt's longest pool hit with
  the hook's consecutive run after it (the blocks it holds, which the executor then loads).
The hook sees blocks and keys only; it never changes the pool.
"""

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from operator import is_not, itemgetter

from core.common import check_int
from core.errors import InvalidArgumentError, OutOfBlocksError
from core.kv.block_hash import event_block_hash
from core.kv.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from core.kv.specs import KVCacheSpec, SlidingWindowSpec


class PoolHook:
    """The pool's connector seam (module docstring): a second tier behind the pool subclasses it and overrides
    what it needs; every method does nothing by default. `block_size`: the GPU block size it stores (the
    pool's); `blocks_per_host_block`: GPU blocks per block of its own (a lookup returns its own block ids)."""

    block_size = 0
    blocks_per_host_block = 1

    def on_stored(
        self, hashes: Sequence[int], parent_hash: int | None, token_ids: Sequence[int], first_block: int
    ) -> object:
        """A chain of newly computed full blocks entered the pool's cache: block `first_block + i` of its
        request has chained hash `hashes[i]` (parent `hashes[i-1]`, `parent_hash` for i = 0) and tokens
        `token_ids[i*B:(i+1)*B]`."""

    def on_evicted(self, group: int, block_hash: int, parent_hash: int | None, tokens: tuple) -> None:
        """A free cached block of `group` left the pool's cache because its slot was taken."""

    def lookup(
        self, hashes: Sequence[int], token_ids: Sequence[int], start: int, max_blocks: int
    ) -> list[int]:
        """This tier's blocks holding the consecutive run of full blocks `start` .. (at most) `max_blocks` - 1 of
        the prompt whose chained hashes are `hashes`; changes nothing."""
        return []

    def on_request_finished(self, keys: Sequence[int], reused: set[int]) -> None:
        """A request that stored or loaded keys `keys` (head to tail; `reused`: loaded from this tier) ended."""

    def take_events(self) -> list[KVEvent]:
        """This tier's KV events since the last call (none by default)."""
        return []


class BlockPool:
    """`num_blocks` block ids shared by the groups whose specs are `group_specs` (used for the events'
    block_size, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window). hook: a `PoolHook` (the connector
    seam, module docstring) or None.

    `ref_counts` is the pool's live list of ref counts, indexed by block id: read it, never write it.
    """

    def __init__(
        self,
        num_blocks: int,
        group_specs: Sequence[KVCacheSpec],
        *,
        enable_kv_cache_events: bool = False,
        hook: PoolHook | None = None,
    ):
        self.num_blocks = check_int(num_blocks, "num_blocks", minimum=1)
        if not group_specs:
            raise InvalidArgumentError("a block pool needs at least one KV cache group spec, got none")
        self.group_specs = tuple(group_specs)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.ref_counts = [0] * self.num_blocks
        self._free_uncached: deque[int] = deque(range(self.num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self._cached: list[dict[int, int]] = [{} for _ in self.group_specs]  # per group: hash -> block
        self._block_hash: list[int | None] = [None] * self.num_blocks
        self._block_key: list[tuple | None] = [None] * self.num_blocks  # (parent hash, tokens) when cached
        self._block_group: list[int] = [-1] * self.num_blocks  # the group of a cached block
        self._events: list[KVEvent] = []
        self.num_evicted_blocks = 0  # cached blocks evicted to reuse their slots, since construction
        self.hook = hook  # the connector seam (module docstring)

    @property
    def offload(self) -> PoolHook | None:
        """The hook under its earlier name (the playground sets it)."""
        return self.hook

    @offload.setter
    def offload(self, hook: PoolHook | None) -> None:
        self.hook = hook

    # ---- counts -----------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be taken now: free uncached plus free cached (evictable) blocks."""
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached full block."""
        return len(self._free_cached)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (held or free), over all groups."""
        return sum(len(cache) for cache in self._cached)

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests: 1 - num_free_blocks / num_blocks (in [0, 1])."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_order(self) -> list[int]:
        """Free block ids in the order they will be taken: uncached first, then cached LRU first."""
        return list(self.iter_free_order())

    def iter_free_order(self) -> Iterator[int]:
        """`free_order()` without building the list (num_free_blocks items)."""
        return chain(self._free_uncached, self._free_cached)

    def ref_count(self, block_id: int) -> int:
        """Holders of block `block_id` now (0: free)."""
        return self.ref_counts[block_id]

    def block_hash(self, block_id: int) -> int | None:
        """The prefix-cache hash of `block_id`, or None when it is not cached."""
        return self._block_hash[block_id]

    def cached_group(self, block_id: int) -> int:
        """The group whose cache holds `block_id`, or -1 when it is not cached."""
        return self._block_group[block_id]

    def cached_hashes(self) -> set[tuple[int, int]]:
        """Every (group index, block hash) in the prefix cache now."""
        return {(group, h) for group, cache in enumerate(self._cached) for h in cache}

    def num_leading_cached(self, group: int, block_hashes) -> int:
        """How many leading keys of `block_hashes` (one prompt's chained full-block keys) `group` caches now, by
        key alone, as a router that learns a replica's keys from its BlockStored / BlockRemoved events knows
        them (a lookup to allocate also compares tokens: `get_cached`). Changes nothing."""
        cache = self._cached[group]
        count = 0
        for block_hash in block_hashes:
            if block_hash not in cache:
                break
            count += 1
        return count

    def cached_blocks(self, group: int) -> list[int]:
        """The block ids in `group`'s prefix cache now (held or free)."""
        return list(self._cached[group].values())

    def iter_cached_blocks(self) -> Iterator[int]:
        """Every block id in the prefix cache now (held or free): num_cached_blocks items, group by group."""
        return chain.from_iterable(cache.values() for cache in self._cached)

    # ---- taking and freeing -----------------------------------------------------------------------------

    def take(self, count: int) -> list[int]:
        """`count` free blocks, each with ref count 1, in take order (evicting cached ones as needed).
        Raises OutOfBlocksError with nothing changed when fewer are free."""
        free = self.num_free_blocks
        if count > free:
            raise OutOfBlocksError(
                f"out of KV blocks: {count:,} needed, {free:,} of {self.num_blocks:,} free",
                needed=count,
                free=free,
            )
        ref_counts, uncached, cached = self.ref_counts, self._free_uncached, self._free_cached
        blocks = []
        for _ in range(count):  # `take_one`'s body inlined
            if uncached:
                block = uncached.popleft()
            else:
                block, _ = cached.popitem(last=False)
                if self.hook is not None or self.enable_kv_cache_events:
                    self._evict(block)
                else:  # `_evict`'s body without a hook or events (a new prompt's blocks evict dozens at once)
                    group = self._block_group[block]
                    del self._cached[group][self._block_hash[block]]
                    self._block_hash[block] = None
                    self._block_key[block] = None
                    self._block_group[block] = -1
                    self.num_evicted_blocks += 1
            ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def check_free(self, needed: int, what: str, *args, free: int | None = None) -> None:
        """Raise OutOfBlocksError ("out of KV blocks: {what % args} {needed} new blocks, ...", the message made
        only then) unless `needed` blocks are free (`free`: the count to compare with, default
        `num_free_blocks`). Changes nothing."""
        free = self.num_free_blocks if free is None else free
        if needed > free:
            raise OutOfBlocksError(
                f"out of KV blocks: {what % args if args else what} {needed:,} new blocks, {free:,} of {self.num_blocks:,} free",
                needed=needed,
                free=free,
            )

    def take_one(self) -> int:
        """One free block with ref count 1: the oldest free uncached block, else the least recently freed
        cached block, which leaves the cache (BlockRemoved). Raises OutOfBlocksError when none is free."""
        if self._free_uncached:
            block = self._free_uncached.popleft()
        elif self._free_cached:
            block, _ = self._free_cached.popitem(last=False)
            self._evict(block)
        else:
            raise OutOfBlocksError(
                f"out of KV blocks: 1 more block needed, 0 of {self.num_blocks:,} free", needed=1, free=0
            )
        self.ref_counts[block] = 1
        return block

    def _evict(self, block: int) -> None:
        group = self._block_group[block]
        block_hash = self._block_hash[block]
        if self.hook is not None:
            self.hook.on_evicted(group, block_hash, *self._block_key[block])
        del self._cached[group][block_hash]
        self._block_hash[block] = None
        self._block_key[block] = None
        self._block_group[block] = -1
        self.num_evicted_blocks += 1
        if self.enable_kv_cache_events:
            self._events.append(
                BlockRemoved(block_hashes=[event_block_hash(block_hash)], medium=MEDIUM_GPU, group_idx=group)
            )

    def touch(self, block: int) -> None:
        """One more reference to `block`: a prefix-cache hit (a free cached block is revived, O(1)) or a fork."""
        if self.ref_counts[block] == 0:
            del self._free_cached[block]
        self.ref_counts[block] += 1

    def touch_all(self, blocks: Iterable[int]) -> None:
        """`touch` each block in order (its body inlined: the per-block loop of saving a prompt's hits)."""
        ref_counts, free_cached = self.ref_counts, self._free_cached
        for block in blocks:
            if ref_counts[block] == 0:
                del free_cached[block]
            ref_counts[block] += 1

    def release(self, block: int) -> None:
        """One reference fewer; at 0 the block becomes free (cached-free when cached), newest in its queue."""
        count = self.ref_counts[block] - 1
        self.ref_counts[block] = count
        if count == 0:
            if self._block_hash[block] is not None:
                self._free_cached[block] = None
            else:
                self._free_uncached.append(block)

    def release_all(self, blocks: Iterable[int]) -> None:
        """`release` each block in order: the first freed is the first taken again among equals. (`release`'s
        body inlined: this is the per-block loop of freeing a request.)"""
        ref_counts, block_hash = self.ref_counts, self._block_hash
        free_cached, free_uncached = self._free_cached, self._free_uncached
        for block in blocks:
            count = ref_counts[block] - 1
            ref_counts[block] = count
            if count == 0:
                if block_hash[block] is not None:
                    free_cached[block] = None
                else:
                    free_uncached.append(block)

    # ---- prefix cache -----------------------------------------------------------------------------------

    def get_cached(self, group: int, block_hash: int, parent_hash: int | None, tokens: tuple) -> int | None:
        """The block cached in `group` under `block_hash` holding `tokens` after `parent_hash`, or None."""
        block = self._cached[group].get(block_hash)
        if block is None or self._block_key[block] != (parent_hash, tokens):
            return None
        return block

    def longest_cached_run(
        self,
        group: int,
        hashes: Sequence[int],
        token_ids: Sequence[int],
        block_size: int,
        max_blocks: int,
        known_keys: Sequence[tuple] = (),
    ) -> list[int]:
        """The blocks `get_cached` finds for the leading full blocks of `token_ids` (at most `max_blocks`),
        whose chained keys are `hashes`, up to the first miss. The keys are probed, and the found blocks'
        parents and tokens compared with the prompt's as whole lists (loops in C), then block by block only
        when they differ (a key collision ends the run there).

        known_keys: the (parent, tokens) of the prompt's leading blocks as tuples the caller keeps (a shared
        prefix's, `PrefixChains`). Found blocks whose keys equal them adopt those very tuples (the same values),
        so the next prompt of that prefix compares its keys by identity, without reading its ids again."""
        cache, block_key = self._cached[group], self._block_key
        count = min(max_blocks, len(hashes))
        blocks = list(map(cache.get, hashes[:count]))
        if None in blocks:
            count = blocks.index(None)
            del blocks[count:]
        if not blocks:
            return blocks
        found = list(map(block_key.__getitem__, blocks))  # (parent, tokens) of each
        known = min(len(known_keys), count)
        head = list(known_keys[:known])
        if known and found[:known] == head:  # by identity once adopted
            if any(map(is_not, found[:known], head)):
                for block, key in zip(blocks, head, strict=False):
                    block_key[block] = key
        else:
            known = 0
        if known == count:
            return blocks
        window = token_ids[known * block_size : count * block_size]
        if type(window) is not tuple:
            window = tuple(window)
        rest = found[known:]
        parents = [hashes[known - 1] if known else None, *hashes[known : count - 1]]
        if list(map(itemgetter(0), rest)) != parents or window != tuple(
            chain.from_iterable(map(itemgetter(1), rest))
        ):  # a block whose (parent, tokens) differ: the run ends there
            for i, key in enumerate(rest):
                start = i * block_size
                if key != (parents[i], window[start : start + block_size]):
                    del blocks[known + i :]
                    break
        return blocks

    def cache_block(
        self, group: int, block: int, block_hash: int, parent_hash: int | None, tokens: tuple
    ) -> bool:
        """Register the newly full, computed `block` of `group` under `block_hash`. Returns whether it entered
        the cache (False when the group already caches that hash, or the block is cached already)."""
        cache = self._cached[group]
        if block_hash in cache or self._block_hash[block] is not None:
            return False
        cache[block_hash] = block
        self._block_hash[block] = block_hash
        self._block_key[block] = (parent_hash, tokens)
        self._block_group[block] = group
        if self.enable_kv_cache_events:
            self._events.append(self._stored_event(group, [block_hash], parent_hash, tokens))
        return True

    def cache_blocks(
        self,
        group: int,
        blocks: Sequence[int],
        hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        first_block: int = 0,
    ) -> int:
        """Register a chain of newly full, computed blocks of `group`: blocks[i] holds
        token_ids[i*B:(i+1)*B] (B = the group's block size) under hashes[i], whose parent is hashes[i-1]
        (`parent_hash` for i = 0). Blocks already cached, or whose hash the group caches already, are skipped.
        Emits one BlockStored per run of newly cached blocks. Returns how many entered the cache.
        `first_block`: the logical index of blocks[0] in its request (a host tier aligns its blocks on it); the
        whole chain is then offered to the hook (`on_stored`) when there is one."""
        bs = self.group_specs[group].block_size
        cache = self._cached[group]
        events = self.enable_kv_cache_events
        run_hashes: list[int] = []
        run_start = 0
        run_parent = parent_hash
        added = 0
        parent = parent_hash
        for i, (block, block_hash) in enumerate(zip(blocks, hashes, strict=True)):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            fresh = block_hash not in cache and self._block_hash[block] is None
            if fresh:
                cache[block_hash] = block
                self._block_hash[block] = block_hash
                self._block_key[block] = (parent, tokens)
                self._block_group[block] = group
                added += 1
                if events:
                    if not run_hashes:
                        run_start, run_parent = i, parent
                    run_hashes.append(block_hash)
            elif run_hashes:
                self._flush_run(group, run_hashes, run_parent, token_ids, run_start, bs)
                run_hashes = []
            parent = block_hash
        if run_hashes:
            self._flush_run(group, run_hashes, run_parent, token_ids, run_start, bs)
        if self.hook is not None:
            self.hook.on_stored(hashes, parent_hash, token_ids, first_block)
        return added

    def lookup_external(
        self, hashes: Sequence[int], token_ids: Sequence[int], start: int, max_blocks: int
    ) -> list[int]:
        """The hook's blocks continuing a prompt's pool hit of `start` full blocks (at most up to full block
        `max_blocks`): `PoolHook.lookup`, or [] without a hook. Changes nothing."""
        return [] if self.hook is None else self.hook.lookup(hashes, token_ids, start, max_blocks)

    def _flush_run(self, group, hashes, parent, token_ids, start, bs) -> None:
        self._events.append(
            self._stored_event(group, hashes, parent, token_ids[start * bs : (start + len(hashes)) * bs])
        )

    def _stored_event(
        self, group: int, hashes: list[int], parent: int | None, tokens: Sequence
    ) -> BlockStored:
        spec = self.group_specs[group]
        if isinstance(hashes[0], bytes):  # vLLM's digests (`VllmBlockHasher`): events carry their low 64 bits
            hashes = [event_block_hash(h) for h in hashes]
            parent = None if parent is None else event_block_hash(parent)
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=[int(t) for t in tokens],
            block_size=spec.block_size,
            lora_id=None,
            medium=MEDIUM_GPU,
            lora_name=None,
            group_idx=group,
            kv_cache_spec_kind=spec.kind,
            kv_cache_spec_sliding_window=spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None,
        )

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash (held blocks keep their data but can no longer be hit; free cached blocks
        become free uncached, keeping their order). Emits AllBlocksCleared. Returns how many hashes were dropped."""
        dropped = 0
        for cache in self._cached:
            dropped += len(cache)
            for block in cache.values():
                self._block_hash[block] = None
                self._block_key[block] = None
                self._block_group[block] = -1
            cache.clear()
        self._free_uncached.extend(self._free_cached)
        self._free_cached.clear()
        if self.enable_kv_cache_events:
            self._events.append(AllBlocksCleared())
        return dropped

    def take_events(self) -> list[KVEvent]:
        """The events since the last call, oldest first (empty when events are disabled); the queue is emptied."""
        events, self._events = self._events, []
        return events
