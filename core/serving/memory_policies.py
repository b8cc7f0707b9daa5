"""The KV memory of the serving engine under one policy: paged (the real `BlockManager`) or contiguous (Orca).

A policy is named like the charts: "paged", "orca-max", "orca-pow2", "orca-oracle". The scheduler drives a
`MemoryPolicy` with request *groups* (`core.sched.scheduler.SequenceGroup`: a request and its parallel samples,
which advance in lockstep) and the simulator reads `metrics()` after each step, all in token slots of the capacity:

    token_states            slots holding K/V of computed tokens (a shared block counts once);
    reservation             slots reserved for tokens not computed yet (contiguous: the rest of P + O;
                            paged: prompt slots allocated before their prefill chunk ran);
    internal_fragmentation  paged: empty slots of the last, partially filled block of each sequence;
                            contiguous: requested - (P + O), reserved but never used;
    allocator_slack         contiguous: buddy rounding (segment - requested); paged: capacity % block_size;
    free_slots              slots nobody holds (paged: free blocks x block_size, cached-free included).
They sum to the capacity. The paper's Figure 2 "external fragmentation & others" is allocator_slack + free_slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from core.common import cdiv, check_int
from core.errors import InvalidArgumentError
from core.paging.allocators import CONTIGUOUS_POLICIES, BuddyAllocator, next_pow2, reservation
from core.paging.block_manager import BlockManager
from core.sched.memory import Admission, MemoryMetrics, SchedulerMemory

POLICY_NAMES = ("paged", *CONTIGUOUS_POLICIES)


@dataclass(frozen=True)
class Policy:
    """How KV memory is handed out. block_size (tokens) and enable_prefix_caching apply to "paged" only.

    kv_groups (paged only): None for one full-attention pool, or the model's KV cache groups as
    ((kind, num_layers, window), ...) for the hybrid allocator (`core.serving.hybrid_memory`)."""

    name: str
    block_size: int = 16
    enable_prefix_caching: bool = False
    kv_groups: tuple | None = None

    def __post_init__(self):
        if self.name not in POLICY_NAMES:
            raise InvalidArgumentError(f"unknown policy {self.name!r}; choose one of {POLICY_NAMES}")
        check_int(self.block_size, "block_size", minimum=1)
        if self.kv_groups is not None:
            from core.serving.hybrid_memory import check_kv_groups

            if not self.is_paged:
                raise InvalidArgumentError("kv_groups apply to the paged policy only")
            object.__setattr__(self, "kv_groups", check_kv_groups(self.kv_groups))

    @property
    def is_paged(self) -> bool:
        return self.name == "paged"

    @property
    def label(self) -> str:
        if self.is_paged:
            cache = ", prefix caching" if self.enable_prefix_caching else ""
            hybrid = f", hybrid {len(self.kv_groups)} groups" if self.kv_groups else ""
            return f"paged (block {self.block_size}{cache}{hybrid})"
        return {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)"}[
            self.name
        ]


def paged(block_size: int = 16, enable_prefix_caching: bool = False) -> Policy:
    return Policy("paged", block_size, enable_prefix_caching)


def contiguous(kind: str) -> Policy:
    """An Orca baseline by its short name: "max", "pow2" or "oracle" (see core.paging.allocators)."""
    if kind not in ("max", "pow2", "oracle"):
        raise InvalidArgumentError(f"contiguous policy must be 'max', 'pow2' or 'oracle', got {kind!r}")
    return Policy(f"orca-{kind}")


def orca_max() -> Policy:
    return Policy("orca-max")


def orca_pow2() -> Policy:
    return Policy("orca-pow2")


def orca_oracle() -> Policy:
    return Policy("orca-oracle")


@dataclass(frozen=True, eq=False)
class PoolSnapshot:
    """The block pool after a step, indexed by physical block id: owner_request (request id of the first live
    sequence holding the block, -1 when free), ref_count, fill (tokens stored), is_cached (holds a prefix-cache
    block, owned or free); block_tables: int32 [sequences of the given groups, max blocks], padded with -1 (None
    for a hybrid pool: a sequence has one table per KV cache group); kv_group: int8, the KV cache group whose
    tables or cache hold each block (-1 free and uncached), None for one group."""

    owner_request: np.ndarray
    ref_count: np.ndarray
    fill: np.ndarray
    is_cached: np.ndarray
    block_tables: np.ndarray | None
    kv_group: np.ndarray | None = None


def pool_snapshot(held, seq_ids, snap, block_tables, kv_group=None) -> PoolSnapshot:
    """A `PoolSnapshot` from a pool snapshot `snap` (owner indexing `seq_ids`, ref_count, fill, is_cached) of the
    sequences of the `held` request groups."""
    request_of = {sid: g.request_id for g in held for sid in g.seq_ids}
    owners = np.array([request_of[sid] for sid in seq_ids] + [-1], dtype=np.int64)
    return PoolSnapshot(
        owners[snap.owner].astype(np.int32),  # owner -1 indexes the trailing -1
        snap.ref_count.astype(np.int16),
        snap.fill.astype(np.int16),
        snap.is_cached.copy(),
        block_tables,
        kv_group,
    )


class MemoryPolicy(SchedulerMemory, Protocol):
    """The scheduler's `SchedulerMemory` plus what only a simulated run needs; `PagedMemory`,
    `HybridPagedMemory` and `ContiguousMemory` implement it. `grow` is only called with the blocks
    `decode_blocks` (one step) or `decode_metrics` (more) promised."""

    capacity: int  # token slots of the whole cache (the metrics sum to it)

    def check_fits(self, group, max_output_len: int) -> None:
        """Raise InvalidArgumentError when the group could never run alone in the whole cache."""
        ...

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """The metrics after each of the next 1..steps decode steps of `groups` (int64 arrays [steps]), predicted
        without changing anything; free_blocks goes negative from the first step that would not fit."""
        ...

    def snapshot(self, groups: list) -> PoolSnapshot | None:
        """The pool and the block tables of `groups`' sequences (None where there are no blocks)."""
        ...


class _PagedGroupState:
    """Per held group: pending_total / pending_left (prompt slots allocated but not computed: total at
    admission, left now); shared_tail (forked sequences still share a partially filled last block)."""

    __slots__ = ("pending_left", "pending_total", "shared_tail")

    def __init__(self, pending: int, shared_tail: bool):
        self.pending_total = self.pending_left = pending
        self.shared_tail = shared_tail

    def compute(self, group, num_tokens: int) -> int:
        """Marks the pending slots that `num_tokens` prefill tokens of `group` compute (all that are left when the
        group has no prefill, e.g. a full prefix-cache hit; else in proportion to its prompt); returns how many."""
        if group.num_prefill_tokens == 0:
            done = self.pending_left
        else:
            done = min(self.pending_left, self.pending_total * num_tokens // group.num_prefill_total)
        self.pending_left -= done
        return done


class PagedMemory:
    """Paged KV: capacity // block_size blocks in a real `BlockManager`; parallel samples are forked so their
    prompt blocks are shared, and the partially filled last block is copied on the first write (copy-on-write).

    Groups provide, besides `SequenceGroup`, `token_ids(seq_index, start, stop)`: the token ids at positions
    [start, stop) of sequence `seq_index` (prompt, then outputs), which the block manager hashes for prefix
    caching. `token_states` is tracked exactly from the manager's free-block count: a block is either free, or
    holds computed tokens, pending prompt tokens or the empty tail of a sequence.
    """

    def __init__(self, policy: Policy, capacity: int, watermark: float):
        self.block_size = bs = policy.block_size
        self.num_blocks = capacity // bs
        if self.num_blocks < 1:
            raise InvalidArgumentError(f"KV capacity {capacity} tokens holds no block of {bs} tokens")
        self.capacity = capacity
        self.manager = BlockManager(self.num_blocks, bs, policy.enable_prefix_caching)
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.token_states = 0
        self.pending = 0
        self._held: dict = {}  # group -> _PagedGroupState

    # ---- sizing ---------------------------------------------------------------------------------------------

    def blocks_for(self, prompt: int, generated: int, n: int) -> int:
        """Blocks a group of n sequences with `prompt` shared tokens and `generated` own tokens each holds."""
        bs = self.block_size
        if generated == 0:
            return cdiv(prompt, bs)
        shared = prompt // bs
        return shared + n * (cdiv(prompt + generated, bs) - shared)

    def check_fits(self, group, max_output_len: int) -> None:
        n, prompt = group.num_seqs, group.prompt_len
        peak = self.blocks_for(prompt, max_output_len - 1, n)
        if peak > self.num_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id} ({prompt} + {max_output_len} tokens, n={n}) needs {peak:,} blocks "
                f"of {self.block_size} at its longest, more than the {self.num_blocks:,} blocks of the cache"
            )
        if self.blocks_for(prompt, 0, n) > self.num_blocks - self.watermark_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id}'s prompt of {prompt} tokens never fits in "
                f"{self.num_blocks:,} blocks less the {self.watermark_blocks} watermark blocks"
            )

    @property
    def free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def swap_blocks(self, group) -> int:
        return self.blocks_for(group.prompt_len, group.length - group.prompt_len, group.num_seqs)

    # ---- admission -----------------------------------------------------------------------------------------

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        need = self.blocks_for(group.prompt_len, num_tokens - group.prompt_len, group.num_seqs)
        return need <= self.manager.num_free_blocks - self.watermark_blocks - reserved_blocks

    def admit(self, group, num_tokens: int) -> Admission:
        """Allocate the prompt (looked up in the prefix cache) and the outputs to restore, forking the first
        sequence into the others so the prompt's full blocks are shared."""
        bs, mgr, n = self.block_size, self.manager, group.num_seqs
        gen = num_tokens - group.prompt_len
        free0 = mgr.num_free_blocks
        sid0 = group.seq_ids[0]
        hits = mgr.allocate(sid0, group.token_ids(0, 0, num_tokens if n == 1 else group.prompt_len))
        revived = 0
        if hits:
            table = mgr.block_table(sid0)
            revived = sum(1 for b in table[:hits] if mgr.ref_count(b) == 1)
        for sid in group.seq_ids[1:]:
            mgr.fork(sid0, sid)
        if n > 1 and gen:
            for index, sid in enumerate(group.seq_ids):
                mgr.extend(sid, group.token_ids(index, group.prompt_len, num_tokens))
        shared_tail = n > 1 and gen == 0 and num_tokens % bs != 0
        pending = (free0 - mgr.num_free_blocks - revived) * bs - self._tail_empty(num_tokens, n, shared_tail)
        self.token_states += revived * bs
        self.pending += pending
        self._held[group] = _PagedGroupState(pending, shared_tail)
        return Admission(num_tokens + (n - 1) * gen - hits * bs, hits * bs)

    def _tail_empty(self, length: int, n: int, shared_tail: bool) -> int:
        empty = -length % self.block_size
        return empty if shared_tail else empty * n

    def prefill(self, group, num_tokens: int) -> None:
        done = self._held[group].compute(group, num_tokens)
        self.pending -= done
        self.token_states += done

    # ---- decode ----------------------------------------------------------------------------------------------

    def decode_blocks(self, groups: list) -> int:
        bs, held = self.block_size, self._held
        need = 0
        for group in groups:
            if group.length % bs == 0:
                need += group.num_seqs
            elif held[group].shared_tail:
                need += group.num_seqs - 1
        return need

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """A sequence of length L takes a block when L % block_size == 0; a forked group whose last block is
        still shared copies it on its first write (n - 1 new blocks: the last sequence writes in place)."""
        bs = self.block_size
        lengths = np.fromiter((g.length for g in groups), np.int64, len(groups))
        ns = np.fromiter((g.num_seqs for g in groups), np.int64, len(groups))
        shared = np.fromiter((self._held[g].shared_tail for g in groups), np.int64, len(groups))
        offsets = lengths[:, None] + np.arange(steps)[None, :]
        per_step = ((offsets % bs == 0) * ns[:, None]).sum(axis=0)
        per_step[0] += int(((ns - 1) * shared).sum())
        free = self.manager.num_free_blocks - np.cumsum(per_step)
        copied = int(((ns - 1) * (lengths % bs) * shared).sum())  # copy-on-write duplicates the shared tail
        token_states = self.token_states + copied + int(ns.sum()) * np.arange(1, steps + 1)
        pending = np.full(steps, self.pending, dtype=np.int64)
        return MemoryMetrics(
            token_states,
            pending,
            (self.num_blocks - free) * bs - token_states - pending,
            np.full(steps, self.capacity - self.num_blocks * bs, dtype=np.int64),
            free * bs,
            free,
        )

    def grow(self, groups: list, steps: int) -> None:
        extend, held = self.manager.extend, self._held
        added = 0
        for group in groups:
            length = group.length
            state = held[group]
            if state.shared_tail:
                added += (group.num_seqs - 1) * (length % self.block_size)  # the copied tail's tokens
                state.shared_tail = False
            token_ids = group.token_ids
            for index, sid in enumerate(group.seq_ids):
                extend(sid, token_ids(index, length, length + steps))
            added += group.num_seqs * steps
        self.token_states += added

    # ---- release, metrics --------------------------------------------------------------------------------------

    def release(self, group) -> int:
        mgr = self.manager
        state = self._held.pop(group)
        free0 = mgr.num_free_blocks
        for sid in group.seq_ids:
            mgr.free(sid)
        released = mgr.num_free_blocks - free0
        tail = self._tail_empty(group.length, group.num_seqs, state.shared_tail)
        self.token_states -= released * self.block_size - tail - state.pending_left
        self.pending -= state.pending_left
        return released

    def metrics(self) -> MemoryMetrics:
        free = self.manager.num_free_blocks
        used = (self.num_blocks - free) * self.block_size
        return MemoryMetrics(
            self.token_states,
            self.pending,
            used - self.token_states - self.pending,
            self.capacity - self.num_blocks * self.block_size,
            free * self.block_size,
            free,
        )

    def snapshot(self, groups: list) -> PoolSnapshot:
        snap = self.manager.snapshot()
        rows = [sid for g in groups for sid in g.seq_ids]
        width = max((len(snap.block_tables[sid]) for sid in rows), default=0)
        tables = np.full((len(rows), width), -1, dtype=np.int32)
        for row, sid in enumerate(rows):
            table = snap.block_tables[sid]
            tables[row, : len(table)] = table
        return pool_snapshot(self._held, snap.seq_ids, snap, tables)


class ContiguousMemory:
    """Orca-style KV: each sequence gets one buddy-allocated segment sized by the policy's reservation rule.

    Groups provide `output_len` besides `SequenceGroup`: Orca (Oracle) reserves exactly prompt + output."""

    def __init__(self, policy: Policy, capacity: int, max_len: int):
        self.name = policy.name
        self.block_size = policy.block_size
        self.capacity = capacity
        self.max_len = max_len
        self.buddy = BuddyAllocator(capacity)
        self.token_states = 0
        self.sum_need = 0
        self.sum_requested = 0
        self.sum_segment = 0
        self._held: dict = {}  # group -> segment start addresses

    def _sizes(self, group) -> tuple[int, int, int]:
        need = group.prompt_len + group.output_len
        requested = reservation(self.name, group.prompt_len, group.output_len, self.max_len)
        return need, requested, next_pow2(requested)

    def check_fits(self, group, max_output_len: int) -> None:
        _, requested, segment = self._sizes(group)
        if not _buddy_fits(BuddyAllocator(self.capacity), segment, group.num_seqs):
            raise InvalidArgumentError(
                f"request {group.request_id} needs {group.num_seqs} segment(s) of {segment:,} slots ({self.name} "
                f"reserves {requested:,}, the buddy allocator rounds up to a power of two); the "
                f"{self.capacity:,}-slot cache never holds them"
            )

    @property
    def free_blocks(self) -> int:
        return 1 << 62  # decodes never need new memory: the reservation was made at admission

    def swap_blocks(self, group) -> int:
        return group.num_seqs * cdiv(group.length, self.block_size)

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        return _buddy_fits(self.buddy, self._sizes(group)[2], group.num_seqs)

    def admit(self, group, num_tokens: int) -> Admission:
        """One segment per sequence; the prompt is prefilled (Orca never preempts, so nothing is restored)."""
        need, requested, segment = self._sizes(group)
        n = group.num_seqs
        self._held[group] = [self.buddy.allocate(segment) for _ in range(n)]
        self.sum_need += n * need
        self.sum_requested += n * requested
        self.sum_segment += n * segment
        return Admission(group.prompt_len, 0)

    def prefill(self, group, num_tokens: int) -> None:
        self.token_states += group.num_seqs * num_tokens

    def decode_blocks(self, groups: list) -> int:
        return 0

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        token_states = self.token_states + sum(g.num_seqs for g in groups) * np.arange(1, steps + 1)
        now = self.metrics()

        def constant(value: int) -> np.ndarray:
            return np.full(steps, value, dtype=np.int64)

        return MemoryMetrics(
            token_states,
            self.sum_need - token_states,
            constant(now.internal_fragmentation),
            constant(now.allocator_slack),
            constant(now.free_slots),
            constant(now.free_blocks),
        )

    def grow(self, groups: list, steps: int) -> None:
        self.token_states += sum(g.num_seqs for g in groups) * steps

    def release(self, group) -> int:
        need, requested, segment = self._sizes(group)
        n = group.num_seqs
        for address in self._held.pop(group):
            self.buddy.free(address)
        self.token_states -= n * group.length
        self.sum_need -= n * need
        self.sum_requested -= n * requested
        self.sum_segment -= n * segment
        return 0

    def metrics(self) -> MemoryMetrics:
        return MemoryMetrics(
            self.token_states,
            self.sum_need - self.token_states,
            self.sum_requested - self.sum_need,
            self.sum_segment - self.sum_requested,
            self.capacity - self.sum_segment,
            self.buddy.free_list_size,
        )

    def snapshot(self, groups: list) -> None:
        return None


def _buddy_fits(buddy: BuddyAllocator, segment: int, count: int) -> bool:
    """Whether `count` segments of `segment` slots can be placed now. Several are placed on trial and freed
    again: freeing merges the split buddies back, so the allocator ends exactly as it was."""
    if count == 1:
        return buddy.can_allocate(segment)
    placed = []
    for _ in range(count):
        address = buddy.allocate(segment)
        if address is None:
            break
        placed.append(address)
    for address in placed:
        buddy.free(address)
    return len(placed) == count


def make_memory(policy: Policy, capacity: int, watermark: float, max_len: int) -> MemoryPolicy:
    """The memory object of `policy` over `capacity` token slots."""
    if policy.kv_groups is not None:
        from core.serving.hybrid_memory import HybridPagedMemory

        return HybridPagedMemory(policy, capacity, watermark)
    if policy.is_paged:
        return PagedMemory(policy, capacity, watermark)
    return ContiguousMemory(policy, capacity, max_len)
