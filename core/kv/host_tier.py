"""`HostTier`: KV blocks kept in host (CPU) memory behind the GPU block pool, as vLLM's native offloading
does it (`--kv-offloading-size GiB --kv-offloading-backend native`: the `OffloadingConnector` with a
`CPUOffloadingSpec` and its `CPUOffloadingManager`, `vllm/v1/kv_offload/cpu/`).

Metadata only, like `BlockPool`: the tier hands out host block ids; the bytes live elsewhere (the executor copies
them, one `HostLoad` per block, the way it copies a copy-on-write `BlockCopy`).

How vLLM does it, and this class with it:
- Capacity (`host_tier_num_blocks`): `cpu_bytes // round_up(worker KV bytes per GPU block x world size x
  GPU blocks per host block, page size)`. `--kv-offloading-size` is the total over the TP ranks of one
  data-parallel engine (each rank gets its share); one host block is a whole number of GPU blocks
  (`blocks_per_host_block`, vLLM's `blocks_per_chunk`) and spans every layer.
- Stores: every newly computed full block is offered as it is produced (prefill chunk by chunk, decode block by
  block); the tier is inclusive: it keeps copies of what HBM holds too. A host block is stored once all its GPU
  blocks are computed and is keyed by the chain hash of its LAST GPU block (vLLM's offload key). A block already
  in the tier is not stored again. With `store_threshold` >= 2 a new key is stored only once it has been
  offered that many times (a bounded LRU table of offer counts, `max_tracker_size` entries); below 2 every
  offer stores.
- Hits (`lookup`): the longest run of consecutive host blocks present, starting where the HBM hit ends
  (`KVCacheManager` asks it after the pool's own longest hit): a request's hit is HBM first, then the host tier.
  The hit blocks are loaded into new GPU blocks before the request runs (vLLM puts the request in
  WAITING_FOR_REMOTE_KVS while the DMA runs; other requests' steps go on meanwhile).
- Eviction when a store needs room: "lru" (least recently used first; a finished request refreshes its keys
  tail first, so its head is the most recent) or "arc" (vLLM's ARC: T1 once-seen, T2 reused, ghost lists B1/B2
  adapt the T1 target). Keys offered together are never evicted to make room for each other; when too few
  blocks can be evicted the whole store is skipped (vLLM's prepare_store returns None).
- Events (when enabled, drained by `take_events`): BlockStored with medium "CPU" per stored host block
  (its GPU block hashes, parent and tokens), BlockRemoved with medium "CPU" per eviction batch.

Invariants (tests/kv/test_host_tier.py checks them against a brute-force model):
- `num_used_blocks + num_free_blocks == num_blocks`; each stored key names one host block id in
  [0, num_blocks), no id twice.
- A key is in the tier iff it was stored and not evicted since; `lookup` never counts a key whose tokens or
  parent differ from the stored ones (a hash collision is a miss).
- Stores complete at once here (vLLM's complete_store comes a step later; the lab has no copy in flight), so a
  stored block is at once hittable and evictable. A `HostLoad`'s source must be copied before the next store
  (the executor drains loads before the step that computes more blocks).
- Every public method either succeeds or raises a `LabError` with the tier unchanged.
"""

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from core.common import check_int
from core.errors import InvalidArgumentError
from core.kv.block_hash import event_block_hash
from core.kv.block_pool import PoolHook
from core.kv.events import MEDIUM_CPU, BlockRemoved, BlockStored, KVEvent

HOST_PAGE_ALIGNMENT = 4096  # vLLM rounds one host block's bytes up to the OS page size (mmap.PAGESIZE)
OFFLOAD_POLICIES = ("lru", "arc")


class HostLoad(NamedTuple):
    """One block to copy from the host tier into the GPU pool before the request runs: host block `src` ->
    GPU block `dst` (`src` spans `blocks_per_host_block` GPU blocks; `dst_offset` is which of them)."""

    src: int
    dst: int
    dst_offset: int = 0


def host_tier_num_blocks(
    cpu_bytes: int, kv_bytes_per_block_per_worker: int, world_size: int = 1, blocks_per_host_block: int = 1
) -> int:
    """Host blocks that `cpu_bytes` of host memory hold, by vLLM's arithmetic (`CPUOffloadingSpec`):
    `cpu_bytes // round_up(kv_bytes_per_block_per_worker x world_size x blocks_per_host_block, 4096)`.

    `kv_bytes_per_block_per_worker` is one GPU block's bytes on one rank over all its layers (K and V);
    `cpu_bytes` is `--kv-offloading-size` x 2**30 for the whole engine (all TP ranks). Worked example: Qwen3-32B
    bf16 is 262,144 B a token; 16-token blocks on TP2 are 2 MiB a rank, 4 MiB a block over both ranks, so
    200 GiB holds 51,200 blocks = 819,200 tokens. Raises InvalidArgumentError (one message per bad value) for a
    negative or non-integer size, a non-positive block size, world size or blocks per host block."""
    cpu = _check_bytes(cpu_bytes, "cpu_bytes")
    per_worker = check_int(kv_bytes_per_block_per_worker, "kv_bytes_per_block_per_worker", minimum=1)
    world = check_int(world_size, "world_size", minimum=1)
    per_host = check_int(blocks_per_host_block, "blocks_per_host_block", minimum=1)
    block_bytes = per_worker * world * per_host
    aligned = -(-block_bytes // HOST_PAGE_ALIGNMENT) * HOST_PAGE_ALIGNMENT
    return cpu // aligned


def _check_bytes(value: object, name: str) -> int:
    """A byte count: an int >= 0, or a finite float >= 0 (GiB x 2**30 may be fractional) taken down to an int."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise InvalidArgumentError(f"{name} must be a finite number of bytes >= 0, got {value!r}")
        if value < 0:
            raise InvalidArgumentError(f"{name} must be at least 0, got {value:g}")
        return int(value)
    return check_int(value, name, minimum=0)


def host_block_size(gpu_block_size: int, host_block_tokens: int) -> int:
    """GPU blocks per host block for a host block of `host_block_tokens` tokens (vLLM's offloading
    `block_size`): it must be a positive multiple of the GPU block size. Raises InvalidArgumentError."""
    gpu = check_int(gpu_block_size, "gpu block size", minimum=1)
    host = check_int(host_block_tokens, "host block size (tokens)", minimum=1)
    if host % gpu:
        raise InvalidArgumentError(
            f"the host block size must be a multiple of the GPU block size {gpu}, got {host} tokens"
        )
    return host // gpu


class _Entry:
    """One stored host block: its id, and what a hit must match (parent hash of its first GPU block and the
    tokens of all its GPU blocks), plus the GPU hashes for the events."""

    __slots__ = ("block", "gpu_hashes", "parent", "tokens")

    def __init__(self, block: int, parent: int | None, tokens: tuple, gpu_hashes: list[int]):
        self.block = block
        self.parent = parent
        self.tokens = tokens
        self.gpu_hashes = gpu_hashes


class _LRU:
    """Least recently used first: an OrderedDict, oldest first."""

    def __init__(self, capacity: int):
        self.entries: OrderedDict[int, _Entry] = OrderedDict()

    def get(self, key: int) -> _Entry | None:
        return self.entries.get(key)

    def insert(self, key: int, entry: _Entry) -> None:
        self.entries[key] = entry

    def on_store_miss(self, keys: Sequence[int]) -> None:
        pass

    def on_request_finished(self, keys: Sequence[int], reused: set[int]) -> None:
        for key in reversed(keys):  # tail first: the head ends the most recent
            if key in self.entries:
                self.entries.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> list[tuple[int, _Entry]] | None:
        chosen = []
        if n > 0:
            for key in self.entries:  # oldest first, stopping at n
                if key not in protected:
                    chosen.append(key)
                    if len(chosen) == n:
                        break
        if len(chosen) < n:
            return None
        return [(key, self.entries.pop(key)) for key in chosen]

    def __len__(self) -> int:
        return len(self.entries)

    def keys(self):
        return self.entries.keys()


class _ARC:
    """vLLM's ARC policy: T1 (stored, not yet reused), T2 (reused), ghosts B1/B2 of their evictions; a store
    whose key is in a ghost list moves the T1 target (B1: up, B2: down); evict from T1 while it is at or above
    its target, else from T2."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.target_t1 = 0.0
        self.t1: OrderedDict[int, _Entry] = OrderedDict()
        self.t2: OrderedDict[int, _Entry] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def get(self, key: int) -> _Entry | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: int, entry: _Entry) -> None:
        self.t1[key] = entry
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def on_store_miss(self, keys: Sequence[int]) -> None:
        for key in reversed(keys):
            if key in self.b1:
                delta = max(1, len(self.b2) / len(self.b1))
                self.target_t1 = min(self.target_t1 + delta, self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                delta = max(1, len(self.b1) / len(self.b2))
                self.target_t1 = max(self.target_t1 - delta, 0)
                self.b2.move_to_end(key)

    def on_request_finished(self, keys: Sequence[int], reused: set[int]) -> None:
        for key in reversed(keys):
            if key in reused and key in self.t1:
                self.t2[key] = self.t1.pop(key)
            elif key in self.t1:
                self.t1.move_to_end(key)
            elif key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> list[tuple[int, _Entry]] | None:
        t1 = (k for k in self.t1 if k not in protected)
        t2 = (k for k in self.t2 if k not in protected)
        chosen: list[tuple[int, bool]] = []
        size_t1 = len(self.t1)
        for _ in range(n):
            key = None
            if size_t1 >= int(self.target_t1):
                key = next(t1, None)
                if key is not None:
                    chosen.append((key, True))
                    size_t1 -= 1
                    continue
            key = next(t2, None)
            if key is not None:
                chosen.append((key, False))
                continue
            key = next(t1, None)
            if key is None:
                return None
            chosen.append((key, True))
            size_t1 -= 1
        out = []
        for key, from_t1 in chosen:
            if from_t1:
                out.append((key, self.t1.pop(key)))
                self.b1[key] = None
            else:
                out.append((key, self.t2.pop(key)))
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return out

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def keys(self):
        return [*self.t1, *self.t2]


class HostTier(PoolHook):
    """`num_blocks` host blocks of `blocks_per_host_block` GPU blocks of `block_size` tokens each: the pool's
    hook (`core.kv.block_pool.PoolHook`): `on_stored` is `offer`, `lookup` answers `lookup_external`, and an
    eviction from the pool stores nothing (the tier stored the block when it was computed).

    policy: "lru" or "arc". store_threshold: offers a new key needs before it is stored (< 2: every offer).
    enable_kv_cache_events: queue BlockStored / BlockRemoved with medium "CPU" (drained by `take_events`)."""

    max_tracker_size = 64_000  # offer counts kept for the store threshold (vLLM's default)

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        blocks_per_host_block: int = 1,
        policy: str = "lru",
        store_threshold: int = 0,
        enable_kv_cache_events: bool = False,
    ):
        self.num_blocks = check_int(num_blocks, "host tier num_blocks", minimum=0)
        self.block_size = check_int(block_size, "block_size", minimum=1)
        self.blocks_per_host_block = check_int(blocks_per_host_block, "blocks_per_host_block", minimum=1)
        if policy not in OFFLOAD_POLICIES:
            raise InvalidArgumentError(
                f"offload policy must be one of {', '.join(OFFLOAD_POLICIES)}, got {policy!r}"
            )
        self.policy = policy
        self.store_threshold = check_int(store_threshold, "store_threshold", minimum=0)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self._policy = _LRU(self.num_blocks) if policy == "lru" else _ARC(self.num_blocks)
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))  # pop() gives the lowest id first
        self._counts: OrderedDict[int, int] = OrderedDict()  # offer counts (store_threshold >= 2)
        self._partial: dict[
            int, tuple
        ] = {}  # last hash -> (hashes, tokens, parent) of an unfinished host block
        self._events: list[KVEvent] = []
        self.num_stored_blocks = 0  # host blocks stored since construction
        self.num_evicted_blocks = 0  # host blocks evicted since construction
        self.num_skipped_stores = 0  # offers left unstored by the threshold or for want of room

    # ---- counts and queries -------------------------------------------------------------------------------

    @property
    def tokens_per_host_block(self) -> int:
        return self.block_size * self.blocks_per_host_block

    @property
    def num_used_blocks(self) -> int:
        return len(self._policy)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def stored_keys(self) -> set[int]:
        """Every host key (the chain hash of a host block's last GPU block) in the tier now."""
        return set(self._policy.keys())

    def host_block(self, key: int) -> int | None:
        """The host block id stored under `key`, or None."""
        entry = self._policy.get(key)
        return None if entry is None else entry.block

    def lookup(
        self, hashes: Sequence[int], token_ids: Sequence[int], start: int, max_blocks: int
    ) -> list[int]:
        """Host blocks holding the consecutive run of GPU blocks from GPU block `start` on (at most up to GPU
        block `max_blocks`), for the request whose chained GPU block hashes are `hashes` and tokens
        `token_ids`. The run starts at the host block holding GPU block `start` (`start` need not be aligned:
        the caller loads only the GPU blocks past it) and stops at the first host block missing, or whose
        parent or tokens differ. Returns the host block ids in order; changes nothing."""
        per = self.blocks_per_host_block
        bs = self.block_size
        span = per * bs
        out = []
        for chunk in range(start // per, min(max_blocks, len(hashes)) // per):
            last = (chunk + 1) * per - 1
            entry = self._policy.get(hashes[last])
            first = chunk * per
            parent = hashes[first - 1] if first else None
            if (
                entry is None
                or entry.parent != parent
                or entry.tokens != tuple(token_ids[first * bs : first * bs + span])
            ):
                break
            out.append(entry.block)
        return out

    # ---- stores -------------------------------------------------------------------------------------------

    def offer(
        self, hashes: Sequence[int], parent_hash: int | None, token_ids: Sequence[int], first_block: int
    ) -> int:
        """Offer a run of newly computed full GPU blocks: GPU block `first_block + i` has chain hash
        `hashes[i]` (its parent is `hashes[i-1]`, `parent_hash` for i = 0) and tokens
        `token_ids[i*B:(i+1)*B]`. Every host block the run completes whose key is not stored is a store
        candidate (subject to `store_threshold`); candidates are stored together, evicting as needed, or not at
        all when too few blocks can be evicted. A host block split over two runs (prefill chunks that end inside
        it) is completed from the first run's blocks, kept by their last hash. Returns how many host blocks were
        stored."""
        hashes, parent_hash, token_ids, first_block = self._join_partial(
            hashes, parent_hash, token_ids, first_block
        )
        offered, candidates = self._store_candidates(hashes, parent_hash, token_ids, first_block)
        if not offered:
            return 0
        if self.store_threshold >= 2:
            self._record_offers(offered)
            kept = [(k, e) for k, e in candidates if self._counts.get(k, 0) >= self.store_threshold]
            self.num_skipped_stores += len(candidates) - len(kept)
            candidates = kept
        return self._store(candidates, protected=set(offered)) if candidates else 0

    def _join_partial(
        self, hashes: Sequence[int], parent_hash: int | None, token_ids: Sequence[int], first_block: int
    ) -> tuple:
        """The run completed, at its head, by the blocks kept from an earlier run that ended inside the same host
        block; and the blocks of an unfinished host block at its tail kept for the next run (at most
        `max_tracker_size` such tails). Returns (hashes, parent_hash, token_ids, first_block) of the run."""
        per, bs = self.blocks_per_host_block, self.block_size
        if per == 1:
            return hashes, parent_hash, token_ids, first_block
        head = first_block % per
        if head:
            carried = self._partial.pop(parent_hash, None)
            if carried is not None and len(carried[0]) == head:  # the host block's first GPU blocks
                before, tokens_before, parent_before = carried
                hashes = [*before, *hashes]
                token_ids = [*tokens_before, *token_ids]
                parent_hash, first_block = parent_before, first_block - head
        tail = (first_block + len(hashes)) % per
        if tail and len(hashes) >= tail:  # keep the unfinished host block's blocks for the next run
            cut = len(hashes) - tail
            parent = hashes[cut - 1] if cut else parent_hash
            self._partial[hashes[-1]] = (
                list(hashes[cut:]),
                list(token_ids[cut * bs : len(hashes) * bs]),
                parent,
            )
            while len(self._partial) > self.max_tracker_size:
                self._partial.pop(next(iter(self._partial)))
        return hashes, parent_hash, token_ids, first_block

    def _store_candidates(
        self, hashes: Sequence[int], parent_hash: int | None, token_ids: Sequence[int], first_block: int
    ) -> tuple[list[int], list[tuple[int, _Entry]]]:
        """(the keys of every host block the run completes, those of them not stored yet with their entries)."""
        per, bs = self.blocks_per_host_block, self.block_size
        candidates: list[tuple[int, _Entry]] = []
        offered: list[int] = []
        for i in range(len(hashes)):
            if (first_block + i + 1) % per:
                continue  # not the last GPU block of a host block
            lo = i - per + 1
            if lo < 0:
                continue  # the host block began before this run: its first GPU blocks were offered earlier
            key = hashes[i]
            offered.append(key)
            if self._policy.get(key) is not None:
                continue
            parent = hashes[lo - 1] if lo else parent_hash
            tokens = tuple(int(t) for t in token_ids[lo * bs : (i + 1) * bs])
            candidates.append((key, _Entry(-1, parent, tokens, list(hashes[lo : i + 1]))))
        return offered, candidates

    def _store(self, candidates: list[tuple[int, _Entry]], protected: set[int]) -> int:
        """Store every candidate, evicting (never a `protected` key) as needed, or none when too few blocks can be
        evicted; queue the events. Returns how many host blocks were stored."""
        self._policy.on_store_miss([k for k, _ in candidates])
        need = len(candidates) - len(self._free)
        evicted: list[tuple[int, _Entry]] = []
        if need > 0:
            got = self._policy.evict(need, protected)
            if got is None:
                self.num_skipped_stores += len(candidates)
                return 0
            evicted = got
        for _, entry in evicted:
            self._free.append(entry.block)
        self.num_evicted_blocks += len(evicted)
        if evicted and self.enable_kv_cache_events:
            removed = [event_block_hash(h) for _, entry in evicted for h in entry.gpu_hashes]
            self._events.append(BlockRemoved(block_hashes=removed, medium=MEDIUM_CPU, group_idx=0))
        for key, entry in candidates:
            entry.block = self._free.pop()
            self._policy.insert(key, entry)
            if self.enable_kv_cache_events:
                self._events.append(self._stored_event(entry))
        self.num_stored_blocks += len(candidates)
        return len(candidates)

    def _stored_event(self, entry: _Entry) -> BlockStored:
        return BlockStored(
            block_hashes=[event_block_hash(h) for h in entry.gpu_hashes],
            parent_block_hash=None if entry.parent is None else event_block_hash(entry.parent),
            token_ids=list(entry.tokens),
            block_size=self.block_size,
            lora_id=None,
            medium=MEDIUM_CPU,
            lora_name=None,
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        )

    on_stored = offer  # the pool's hook: every computed chain is offered as it enters the pool's cache

    def _record_offers(self, keys: Sequence[int]) -> None:
        """Count one offer of each key in a bounded LRU table (vLLM's `_record_accesses`): keys offered now are
        never dropped to make room for each other."""
        counts = self._counts
        protected = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                protected.add(key)
        unprotected = len(counts) - len(protected)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1

    def on_request_finished(self, keys: Sequence[int], reused: set[int]) -> None:
        """A request that offered or loaded host keys `keys` (head to tail) finished: refresh their recency
        (LRU: tail first, so the head is the most recent; ARC: the `reused` ones, loaded from the tier, move
        to T2)."""
        self._policy.on_request_finished(list(keys), reused)

    def take_events(self) -> list[KVEvent]:
        """Host tier events since the last call, oldest first; the queue is emptied."""
        events, self._events = self._events, []
        return events
