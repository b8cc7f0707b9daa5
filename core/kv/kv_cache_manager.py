"""`KVCacheManager`: every KV cache group of a model over ONE block pool (vLLM V1's `kv_cache_manager.py` and
`kv_cache_coordinator.py` in one class), plus what vLLM V1 dropped and this lab teaches: `fork` with
ref-counted sharing and copy-on-write (parallel sampling, beam search).

A request's life: `allocate(request_id, prompt)` makes room for the whole prompt in every group (returns the
prompt tokens served by the prefix cache); `mark_computed(request_id, n)` says the K/V of the first n tokens are
written (only then do their full blocks enter the prefix cache, and window groups release what no later token
reads); `append_token` makes room for one decode token; `fork` shares a request's blocks with a new request;
`free` ends it. `block_ids(request_id)` gives one block table per group, -1 for released entries. Its parts
beside it: the prefix-cache hit lookup (`core.kv.prefix_hits.PrefixHits`), the host tier's loads
(`core.kv.host_loads.HostLoads`) and the bulk decode path (`core.kv.bulk_decode.BulkDecode`), all composed; its block-count arithmetic over the groups
(`core.kv.block_counts`) and `slot_usage`'s count (`core.kv.snapshot.slot_usage`).

Invariants (with those of `BlockPool` and the single-type managers; tests/kv checks them against a
brute-force model):
- Every group draws from the one pool: a block id is in at most one group's tables, `num_free_blocks` plus
  the distinct held blocks equals `num_blocks`.
- For a request with n tokens (room made) and c computed, group g's table has
  `num_required_blocks(n)` entries; its leading `num_skipped_blocks(c)` entries are -1, the rest are held.
- Nothing enters the prefix cache before it is computed: `mark_computed` is the only way in (hits count as
  computed). A hit is the longest prefix of full blocks cached in EVERY group, rounded down to a multiple of
  every group's block size, and never includes the last prompt token (it is always computed, as in vLLM), so a
  group that never caches (Mamba) means no hits. A sliding-window or chunked group needs all the prefix's
  blocks cached to hit (vLLM also accepts hits whose out-of-window blocks were evicted; not done here), but
  holds only the hit blocks the next token reads: the others are -1 from the start.
- A refused call (OutOfBlocksError, UnknownSequenceError, DuplicateSequenceError, InvalidArgumentError)
  changes nothing: capacity is checked before anything is taken.
- Counters, in tokens, as vLLM's `prefix_cache_queries` / `prefix_cache_hits`: each allocated prompt adds its
  length to queries and its hit tokens to hits (only while prefix caching is on). With a host tier,
  `prefix_cache_hits` counts both tiers, `gpu_cache_hits` + `host_cache_hits` == `prefix_cache_hits`.
- Host tier (`host_tier`: the pool's hook, `core.kv.block_pool.PoolHook`, e.g. `HostTier`, vLLM's native CPU
  offloading; one full-attention group with prefix caching on): the pool tells it of every computed chain and
  every eviction; a prompt's hit is the pool's longest hit, then the tier's consecutive run after it
  (`BlockPool.lookup_external`; never the last prompt token). The host-hit blocks take new GPU blocks,
  count as computed, and are listed as `HostLoad(src, dst)` by `take_host_loads()`, which the executor copies
  before the request's first step (as it copies a `BlockCopy`). They enter the pool's prefix cache at the next
  `mark_computed`.
"""

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

import core.kv.block_counts as block_counts
from core.common import check_int
from core.errors import DuplicateSequenceError, InvalidArgumentError, OutOfBlocksError, UnknownSequenceError
from core.kv.block_hash import event_block_hash, extend_block_hashes, hash_block_tokens
from core.kv.block_pool import BlockPool, PoolHook
from core.kv.bulk_decode import BulkDecode
from core.kv.events import KVEvent
from core.kv.host_loads import HostLoads, check_host_tier
from core.kv.host_tier import HostLoad
from core.kv.prefix_hits import PrefixHits
from core.kv.request import KVRequest, check_kv_token_ids
from core.kv.single_type_manager import (
    BlockCopy,
    FullAttentionManager,
    KVCacheBlocks,
    SingleTypeKVCacheManager,
    manager_for,
)
from core.kv.snapshot import KVCacheSnapshot, build_snapshot, slot_usage
from core.kv.specs import KVCacheSpec


class KVCacheManager:
    """Block tables for `groups` (one spec per KV cache group, in order) over `num_blocks` shared block ids.

    enable_prefix_caching: computed full blocks are cached by chained hash and reused by later prompts.
    enable_kv_cache_events: the pool queues vLLM's KV cache events; drain them with `take_events()`.
    block_hasher: the chained key of a full block, `block_hasher(parent key or None, tokens)`
    (`core.kv.block_hash`): Python's hash by default, or a `VllmBlockHasher` for the keys a vLLM server uses
    (its events then carry the same hashes as vLLM's).
    Request ids are any hashable values.
    """

    def __init__(
        self,
        groups: Sequence[KVCacheSpec],
        num_blocks: int,
        *,
        enable_prefix_caching: bool = False,
        enable_kv_cache_events: bool = False,
        host_tier: PoolHook | None = None,
        block_hasher=hash_block_tokens,
    ):
        groups = tuple(groups)
        if not groups or not all(isinstance(spec, KVCacheSpec) for spec in groups):
            raise InvalidArgumentError(f"groups must be a non-empty list of KV cache specs, got {groups!r}")
        self.groups = groups
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.block_hasher = block_hasher
        self.pool = BlockPool(num_blocks, groups, enable_kv_cache_events=enable_kv_cache_events)
        self.managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            manager_for(spec, self.pool, index) for index, spec in enumerate(groups)
        )
        self._can_hit = all(manager.caches_blocks for manager in self.managers)
        self._all_full = all(type(manager) is FullAttentionManager for manager in self.managers)
        self._one_full_group = self._all_full and len(self.managers) == 1
        self._requests: dict[Hashable, KVRequest] = {}
        self._hits = PrefixHits(self.managers, block_hasher)  # the prefix-cache hit lookup, composed
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens served by it (both tiers)
        self.gpu_cache_hits = 0  # of those, tokens served by the GPU pool
        self.host_cache_hits = 0  # of those, tokens loaded from the host tier
        self.host_tier = check_host_tier(host_tier, groups, self._one_full_group, self.enable_prefix_caching)
        self._host = HostLoads(self.host_tier)  # its host loads and reused keys, composed
        self.pool.hook = self.host_tier
        self._bulk = BulkDecode(
            self
        )  # the bulk decode path, composed (`decode_steps`, the k-step prediction)

    def take_host_loads(self) -> list[HostLoad]:
        """Host-to-GPU copies listed by `allocate` since the last call (host tier hits), oldest first; the
        executor copies each before the request's first step. The list is emptied (`HostLoads.take`)."""
        return self._host.take()

    # ---- pool-wide counts -------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (free uncached plus evictable cached)."""
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """1 - num_free_blocks / num_blocks: the fraction of the pool requests hold."""
        return self.pool.usage

    def take_events(self) -> list[KVEvent]:
        """KV cache events since the last call, oldest first (always empty unless events are enabled): the
        pool's (medium "GPU"), then the pool hook's (a host tier's, medium "CPU") when there is one."""
        events = self.pool.take_events()
        if self.pool.hook is not None:
            events.extend(self.pool.hook.take_events())
        return events

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (AllBlocksCleared); returns how many were dropped. Blocks computed before
        the reset are not offered to the cache again."""
        return self.pool.reset_prefix_cache()

    def cached_block_hashes(self) -> set[tuple[int, int]]:
        """Every (group index, block hash) in the prefix cache now, the hash as KV events carry it."""
        return {(group, event_block_hash(key)) for group, key in self.pool.cached_hashes()}

    def num_cached_prefix_blocks(self, block_hashes: Sequence[int], group: int = 0) -> int:
        """How many leading keys of `block_hashes` (a prompt's chained full-block keys, `core.kv.block_hash`)
        the prefix cache of `group` holds now, by key (`BlockPool.num_leading_cached`): what a prefix-aware
        router asks of each replica. Changes nothing."""
        return self.pool.num_leading_cached(group, block_hashes)

    # ---- per-request queries ----------------------------------------------------------------------------

    def _request(self, request_id: Hashable) -> KVRequest:
        req = self._requests.get(request_id)
        if req is None:
            live = list(self._requests)
            shown = ", ".join(repr(r) for r in live[:8])
            raise UnknownSequenceError(
                f"unknown request {request_id!r}; live requests: [{shown}{', ...' if len(live) > 8 else ''}] "
                f"({len(live)} in all)"
            )
        return req

    def record(self, request_id: Hashable) -> KVRequest:
        """The live request's own `KVRequest` (its tokens, computed count, per-group `RequestBlocks`, block keys),
        for the KV core's composed parts (`BulkDecode`): read it, change it only through this manager. Raises
        UnknownSequenceError."""
        return self._requests.get(request_id) or self._request(request_id)

    def records(self, request_ids: Iterable[Hashable]) -> list[KVRequest]:
        """`record` of each request, in order (one call for a batch: the bulk paths' lookup). Raises
        UnknownSequenceError."""
        out = list(map(self._requests.get, request_ids))
        if None in out:
            for request_id, req in zip(request_ids, out, strict=True):
                if req is None:
                    self._request(request_id)
        return out

    @property
    def all_full_attention(self) -> bool:
        """Every group is full attention (nothing is ever released before a request ends)."""
        return self._all_full

    def __contains__(self, request_id: Hashable) -> bool:
        """Whether `request_id` is a live request."""
        return request_id in self._requests

    def request_ids(self) -> list[Hashable]:
        """Live request ids, in the order they were allocated or forked."""
        return list(self._requests)

    def block_ids(self, request_id: Hashable) -> KVCacheBlocks:
        """Copies of the request's block tables, one per group in order: logical block i of group g lives in
        physical block `block_ids(r)[g][i]`; -1 marks an entry the group released."""
        return KVCacheBlocks(list(rec.table) for rec in self._request(request_id).blocks)

    def num_held_blocks(self, request_id: Hashable) -> tuple[int, ...]:
        """Blocks the request holds now in each group (table entries that are not -1)."""
        return tuple(rec.num_held for rec in self._request(request_id).blocks)

    def num_tokens(self, request_id: Hashable) -> int:
        """Tokens the request has room for (prompt plus appended tokens)."""
        return self._request(request_id).num_tokens

    def num_computed_tokens(self, request_id: Hashable) -> int:
        """Leading tokens whose K/V are written (prefix-cache hits included)."""
        return self._request(request_id).num_computed

    def token_ids(self, request_id: Hashable) -> list[int]:
        return list(self._request(request_id).token_ids)

    def blocks_needed(self, num_tokens: int, num_seqs: int = 1, num_shared_tokens: int | None = None) -> int:
        """Free blocks a new request takes over all groups, counting no prefix-cache hits
        (`core.kv.block_counts.blocks_needed`: `num_seqs` forks of one prompt of `num_shared_tokens`)."""
        return block_counts.blocks_needed(self.managers, num_tokens, num_seqs, num_shared_tokens)

    def max_blocks_held(self, prompt_len: int, num_tokens: int) -> int:
        """The most blocks one unshared request holds at any time over all groups while it grows from a
        `prompt_len`-token prompt to `num_tokens` tokens (`core.kv.block_counts.max_blocks_held`)."""
        return block_counts.max_blocks_held(self.managers, prompt_len, num_tokens)

    def num_blocks_held(self, num_tokens: int) -> tuple[int, ...]:
        """Blocks one unshared request of `num_tokens` tokens holds in each group once all but its newest token
        are computed (`core.kv.block_counts.num_blocks_held`)."""
        return block_counts.num_blocks_held(self.managers, num_tokens)

    def num_blocks_to_append(self, new_tokens: Mapping[Hashable, int]) -> int:
        """THE blocks-per-step question (vLLM's coordinator summing each manager's `get_num_blocks_to_allocate`):
        net free blocks taken when each request r of `new_tokens` gets `new_tokens[r]` more tokens as
        `decode_steps` does it (its tokens but the newest computed first, which releases what a window no
        longer reads; then copy-on-write of a shared written last block, then new table entries). Per group and
        request it adds the manager's `num_new_blocks` and `written_tail`; across requests it replays ref
        counts: a released block is freed when every holder releases it, and a shared written tail is copied by
        all its writers but the last holder. The engine (after `mark_computed` of every computed token: nothing
        left to release), the serving simulator's paged policy and the scheduler's preemption all ask this.
        Changes nothing; raises UnknownSequenceError for an unknown request."""
        requests = self._requests
        reqs = [requests.get(request_id) or self._request(request_id) for request_id in new_tokens]
        return self._blocks_to_append(reqs, list(new_tokens.values()))

    def num_blocks_for_decode(self, request_ids: Iterable[Hashable]) -> int:
        """`num_blocks_to_append` of one decode token for each of `request_ids`."""
        requests = self._requests
        return self._blocks_to_append([requests.get(rid) or self._request(rid) for rid in request_ids], 1)

    def decode_steps(
        self,
        token_ids: Mapping[Hashable, Sequence[int]],
        *,
        trusted: bool = False,
        copies: list | None = None,
    ) -> None:
        """Several decode steps of several requests at once, in O(blocks): the bulk path (`BulkDecode.decode_steps`
        says what it does and guarantees; `copies` gets its copy-on-writes)."""
        self._bulk.decode_steps(token_ids, trusted=trusted, copies=copies)

    def num_free_blocks_after_decode(
        self, request_groups: Sequence[Sequence[Hashable]], steps: int, lengths: np.ndarray | None = None
    ) -> np.ndarray:
        """THE k-step decode prediction: int64 [steps], the free blocks after decode steps 1..t of every request,
        each step one token per request (as `decode_steps` runs them). `request_groups`: the requests decoding
        together, grouped by equal length (a scheduler group's sequences); a group whose forks still share a
        written last block copies it once per fork but the last holder. `BulkDecode.num_free_blocks_after` says
        how (table growth by `num_required_blocks`, releases by the window rule). lengths: int64, each group's
        tokens (its requests' `num_tokens`) when the caller keeps them (the scheduler's groups do), so they are
        not looked up. Changes nothing; raises UnknownSequenceError for an unknown request."""
        return self._bulk.num_free_blocks_after(request_groups, steps, lengths)

    def slot_usage(self) -> dict:
        """Where the live requests' held slots are, over every group (`core.kv.snapshot.slot_usage` says what
        each count is)."""
        return slot_usage(self.pool, self.managers, self._requests.values())

    def num_blocks_to_append_records(self, reqs: list[KVRequest], counts: list[int] | int) -> int:
        """`num_blocks_to_append` for requests given by their `record`s, `counts[i]` more tokens for `reqs[i]`
        (`counts` each, for an int)."""
        return self._blocks_to_append(reqs, counts)

    def _blocks_to_append(self, reqs: list[KVRequest], counts: list[int] | int) -> int:
        """`num_blocks_to_append` when request `reqs[i]` gets `counts[i]` more tokens (`counts` each, for an
        int): `core.kv.block_counts.blocks_to_append` over this manager's groups and pool."""
        return block_counts.blocks_to_append(
            self.managers, self.pool.ref_counts, reqs, counts, self._one_full_group
        )

    @property
    def skips_keys(self) -> bool:
        """False when every group is full attention: then `num_keys_read` is the plain sum of the starts."""
        return not self._all_full

    def num_keys_read(self, starts, layers: Sequence[int]):
        """Earlier keys read by query spans starting at positions `starts` (an int64 array; each group's window
        rule, `SingleTypeKVCacheManager.num_keys_read`), summed over its last axis and averaged over the model's
        layers (`layers[g]` of them in group g), rounded down."""
        total = sum(n * m.num_keys_read(starts) for m, n in zip(self.managers, layers, strict=True))
        return total // sum(layers)

    def num_blocks_to_admit(self, token_ids: Sequence[int]) -> int:
        """Free blocks `allocate(token_ids)` would take now, prefix-cache hits counted as vLLM V1's
        `allocate_slots` counts them before it admits a request: the new blocks past the hit plus the hit blocks
        that are free now (reviving an evictable cached block takes it off the free queue; a hit block another
        request holds costs nothing). Without caching: `blocks_needed(len(token_ids))`. Changes nothing (the
        lookup's key chains are remembered for the allocation that follows)."""
        tokens = list(token_ids)
        hits = [[] for _ in self.managers]
        if self.enable_prefix_caching and self._can_hit:
            _, hits = self._hits.find(tokens, {})
        return sum(m.num_blocks_to_allocate(len(tokens), h) for m, h in zip(self.managers, hits, strict=True))

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new prompt of `num_tokens` fits in the free blocks without any prefix-cache hit."""
        return self.blocks_needed(num_tokens) <= self.pool.num_free_blocks

    def snapshot(self) -> KVCacheSnapshot:
        """A frozen view of every block of the pool (see `KVCacheSnapshot`)."""
        return build_snapshot(
            self.pool, self.managers, {rid: req.num_tokens for rid, req in self._requests.items()}
        )

    # ---- operations -------------------------------------------------------------------------------------

    def check_room(self, needed: int, what: str) -> None:
        """Raise OutOfBlocksError (before anything changes) when `needed` blocks exceed the free ones."""
        free = self.pool.num_free_blocks
        if needed > free:
            raise OutOfBlocksError(
                f"out of KV blocks: {what} needs {needed:,} free blocks over {len(self.managers)} groups, "
                f"{free:,} of {self.num_blocks:,} free",
                needed=needed,
                free=free,
            )

    def allocate(self, request_id: Hashable, token_ids: Sequence[int], trusted: bool = False) -> int:
        """Make room for a new request's whole prompt in every group. Returns how many leading prompt tokens the
        prefix cache served (0 without caching): their blocks are shared, their K/V need no prefill, and they
        count as computed. The request keeps its own checked copy of `token_ids` (trusted: the caller checked them at
        its edge, as the engine does, so they are copied unchecked: a request's ids are checked once). Raises
        DuplicateSequenceError, InvalidArgumentError (empty prompt, non-integer token) or OutOfBlocksError, with
        nothing changed."""
        if request_id in self._requests:
            raise DuplicateSequenceError(f"request {request_id!r} already exists; free it or choose a new id")
        tokens = list(token_ids) if trusted else check_kv_token_ids(request_id, token_ids)
        n = len(tokens)
        hashes: dict[int, list[int]] = {}
        hit_tokens, hits = 0, [[] for _ in self.managers]
        if self.enable_prefix_caching and self._can_hit:
            hit_tokens, hits = self._hits.find(tokens, hashes)
        host_blocks: list[int] = []
        if self.host_tier is not None:
            bs = self.managers[0].block_size
            host_blocks = self.pool.lookup_external(hashes[bs], tokens, len(hits[0]), (n - 1) // bs)
        needed = sum(m.num_blocks_to_allocate(n, h) for m, h in zip(self.managers, hits, strict=True))
        self.check_room(needed, f"request {request_id!r} ({n:,} tokens, {hit_tokens:,} cached)")
        # every group's hits first: taking new blocks must not evict a later group's free cached hit
        blocks = tuple(m.save_hits(request_id, h) for m, h in zip(self.managers, hits, strict=True))
        for manager, rec in zip(self.managers, blocks, strict=True):
            manager.append_slots(rec, 0, n)
        gpu_hit_tokens = hit_tokens
        if host_blocks:
            hit_tokens += self._host.list_loads(
                request_id, blocks[0].table, len(hits[0]), host_blocks, hashes
            )
        self._requests[request_id] = KVRequest(tokens, hit_tokens, blocks, hashes)
        if self.enable_prefix_caching:
            self.prefix_cache_queries += n
            self.prefix_cache_hits += hit_tokens
            self.gpu_cache_hits += gpu_hit_tokens
            self.host_cache_hits += hit_tokens - gpu_hit_tokens
        return hit_tokens

    def mark_computed(self, request_id: Hashable, num_tokens: int) -> None:
        """The K/V of the request's first `num_tokens` tokens are written (a running total, never lower than
        before, at most the tokens it has room for). Their newly full blocks enter the prefix cache (with
        caching on; BlockStored events), then each group releases the blocks no uncomputed token reads.
        Raises UnknownSequenceError or InvalidArgumentError with nothing changed."""
        req = self._request(request_id)
        tokens = req.token_ids
        num = check_int(num_tokens, "num_tokens", minimum=req.num_computed, maximum=req.num_tokens)
        req.num_computed = num
        for manager, rec in zip(self.managers, req.blocks, strict=True):
            if self.enable_prefix_caching and manager.caches_blocks:
                keys = req.block_hashes.setdefault(manager.block_size, [])
                extend_block_hashes(
                    keys, tokens, manager.block_size, num // manager.block_size, self.block_hasher
                )
                manager.cache_blocks(rec, keys, tokens, num)
            manager.remove_skipped_blocks(rec, num)

    def append_token(
        self, request_id: Hashable, token_id: int, trusted: bool = False
    ) -> tuple[BlockCopy | None, ...]:
        """Make room for one decode token `token_id` in every group (the request appends it to its tokens).
        Returns, per group, the copy-on-write `BlockCopy(src, dst)` whose K/V the caller copies before writing
        (the last block was shared after a fork), or None. Raises UnknownSequenceError, InvalidArgumentError or
        OutOfBlocksError with nothing changed (trusted: as `allocate`'s)."""
        req = self._request(request_id)
        if not trusted:
            check_kv_token_ids(request_id, [token_id])
        old = req.num_tokens
        needed = sum(
            m.num_blocks_to_append(rec, old, old + 1)
            for m, rec in zip(self.managers, req.blocks, strict=True)
        )
        self.check_room(needed, f"one more token for request {request_id!r}")
        req.token_ids.append(token_id)
        req.num_tokens = old + 1
        return tuple(
            m.append_slots(rec, old, old + 1) for m, rec in zip(self.managers, req.blocks, strict=True)
        )

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """A new request `child_id` sharing every block `parent_id` holds in every group (ref counts + 1), with
        copies of the parent's tokens, block hashes and computed count; the first of them to write a shared last
        block copies it. Raises UnknownSequenceError (parent) or DuplicateSequenceError (child) with nothing
        changed."""
        parent = self._request(parent_id)
        if child_id in self._requests:
            raise DuplicateSequenceError(f"cannot fork into {child_id!r}: that request already exists")
        blocks = tuple(m.fork(parent_id, child_id) for m in self.managers)
        hashes = {bs: list(keys) for bs, keys in parent.block_hashes.items()}
        self._requests[child_id] = KVRequest(list(parent.token_ids), parent.num_computed, blocks, hashes)

    def free(self, request_id: Hashable) -> None:
        """End the request: every block it holds loses a reference, last to first in each group; blocks at 0
        become free (cached-free when cached). Raises UnknownSequenceError with nothing changed."""
        req = self._request(request_id)
        if self.host_tier is not None:
            self._host.request_finished(request_id, req, self.managers[0].block_size)
        for manager in self.managers:
            manager.free(request_id)
        del self._requests[request_id]
