"""Paged KV memory, as vLLM V1 hands it out: every KV cache group of the model draws its block ids from ONE pool
(`core.kv.KVCacheManager`); full-attention groups grow with the sequence, sliding-window groups keep only the
blocks their window still reads. A model with one kind of layer is one full-attention group (the paper's vLLM).

The model's layers form KV cache groups, given as `PagedKVGroup`s (kind, num_layers, window) with kind "full"
(window None) or "sliding_window" (window >= 1 tokens); the default is one full group. As in vLLM every
group's page is the same size: a block of any group holds `block_size` tokens of K/V for `group_size` = the
largest group's layers, so a smaller group is padded (its padding layers' pages are allocated and unused,
vLLM's "Add N padding layers"). The pool has the bytes of `capacity` token slots of every real layer:
`capacity x real_layers // group_size` *group slots* (one token of one group's block), so num_blocks = that //
block_size, vLLM's available_bytes // page // group_size (one group: capacity // block_size).

A request is allocated in every group at admission (the prompt held whole until computed), its prompt enters the
prefix cache as it is computed (a hit needs the prefix cached in every group, as in vLLM), parallel samples are
forks sharing the prompt's blocks (the partly filled last block copied on the first write), and a window group
releases a block once the token about to be appended no longer reads it. The simulator's batched decode steps
run through `KVCacheManager.decode_steps`, and `decode_metrics` predicts them block by block.

The metrics are in group slots and sum to `capacity` (group slots); token states include a padded group's
padding pages, as vLLM allocates them. Everything the scheduler asks is the KV core's adapter,
`core.kv.scheduler_memory.KVSchedulerMemory` (admission, prefill marking, fits, decode prediction, grow, release);
`PagedMemory` only configures it: the pool from the groups, a host tier, and `SlotCategories`, the hook that
records the paper's slot categories as an observer (what the simulator adds to the pool).
"""

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from core.common import check_int
from core.errors import InvalidArgumentError
from core.kv.host_tier import HostTier
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.layout import KVCacheGroup
from core.kv.scheduler_memory import KVHook, KVSchedulerMemory, MemoryMetrics, pending_done
from core.kv.specs import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

KV_GROUP_KINDS = ("full", "sliding_window")
_NUM_SEQS = attrgetter("num_seqs")


@dataclass(frozen=True)
class PagedKVGroup:
    """One KV cache group as the paged policy simulates it: `num_layers` (>= 1) layers of one `kind` sharing a
    block table; kind "full" (window None) or "sliding_window" (window >= 1 tokens). A real model's groups
    come from vLLM's layout (`core.kv.layout.KVCacheGroup`, see `from_layout`). Raises InvalidArgumentError on
    construction for an unknown kind, a window missing or set on a full group, or a group with no layer."""

    kind: str
    num_layers: int
    window: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KV_GROUP_KINDS:
            raise InvalidArgumentError(
                f"KV cache group kind must be one of {KV_GROUP_KINDS}, got {self.kind!r}"
            )
        check_int(self.num_layers, "num_layers of a KV cache group", minimum=1)
        if self.kind == "full" and self.window is not None:
            raise InvalidArgumentError(f"a full-attention group has no window, got {self.window!r}")
        if self.kind == "sliding_window":
            check_int(self.window, "sliding window (tokens)", minimum=1)

    @classmethod
    def from_layout(cls, group: KVCacheGroup) -> "PagedKVGroup":
        """The paged policy's view of one of vLLM's groups: its kind, layer count and window."""
        return cls(group.kind, len(group.layers), group.window)

    def spec(self, block_size: int) -> KVCacheSpec:
        """The `core.kv` spec of this group's block table (no heads: the simulator counts blocks)."""
        if self.window is None:
            return FullAttentionSpec(block_size=block_size, num_kv_heads=0, head_size=0)
        return SlidingWindowSpec(
            block_size=block_size, num_kv_heads=0, head_size=0, sliding_window=self.window
        )


ONE_FULL_GROUP = (PagedKVGroup("full", 1),)  # a model whose layers are all alike: one full-attention group


def check_kv_groups(kv_groups) -> tuple[PagedKVGroup, ...]:
    """The groups as a tuple of `PagedKVGroup`, the one place a (kind, num_layers, window) triple given by a
    caller becomes one; raises InvalidArgumentError for no group or a bad one (see `PagedKVGroup`). Groups may
    differ in size (smaller ones are padded to the largest, as vLLM does)."""
    groups = tuple(g if isinstance(g, PagedKVGroup) else _from_triple(g) for g in kv_groups)
    if not groups:
        raise InvalidArgumentError("a hybrid policy needs at least one KV cache group")
    return groups


def _from_triple(group) -> PagedKVGroup:
    if not isinstance(group, (tuple, list)) or len(group) != 3:
        raise InvalidArgumentError(f"a KV cache group is (kind, num_layers, window), got {group!r}")
    return PagedKVGroup(*group)


class _GroupSlots:
    """Per held group: pending_total / pending_left (group slots allocated but not computed: total at
    admission, left now); shared_tail (forked sequences still share a partially filled last block)."""

    __slots__ = ("pending_left", "pending_total", "shared_tail")

    def __init__(self, pending: int, shared_tail: bool):
        self.pending_total = self.pending_left = pending
        self.shared_tail = shared_tail


class SlotCategories(KVHook):
    """The simulator's hook: the paper's slot categories as counters, told of each change (an observer; it
    changes no block). pending: group slots of tokens allocated but not computed (`pending_done`); tail_empty:
    empty slots of last blocks over groups and sequences (a shared one once). `num_groups` KV cache groups of
    blocks of `block_size` tokens."""

    def __init__(self, block_size: int, num_groups: int):
        self.block_size = block_size
        self.num_groups = num_groups
        self.pending = 0
        self.tail_empty = 0
        self._held: dict = {}  # group -> _GroupSlots
        self._shared_tails: set = set()  # held groups whose forks still share their last block

    def admitted(self, group, num_tokens, pieces, admission) -> None:
        n, count = group.num_seqs, self.num_groups
        shared_tail = n > 1 and num_tokens <= group.prompt_len and num_tokens % self.block_size != 0
        pending = count * admission.num_prefill_tokens
        self.pending += pending
        self.tail_empty += count * (-num_tokens % self.block_size) * (1 if shared_tail else n)
        self._held[group] = _GroupSlots(pending, shared_tail)
        if shared_tail:
            self._shared_tails.add(group)

    def prefilled(self, group, num_tokens: int) -> None:
        state = self._held[group]
        done = pending_done(state.pending_total, state.pending_left, group, num_tokens)
        state.pending_left -= done
        self.pending -= done

    def grown(self, groups: list, steps: int) -> None:
        bs = self.block_size
        tail = 0
        for group in groups:  # each sequence's own tail, before and after
            length = group.length
            tail += group.num_seqs * (-(length + steps) % bs - -length % bs)
        if self._shared_tails:  # a tail the forks shared was empty once before, and is each one's own now
            for group in groups:
                if group in self._shared_tails:
                    self._shared_tails.discard(group)
                    self._held[group].shared_tail = False
                    tail += (group.num_seqs - 1) * (-group.length % bs)
        self.tail_empty += self.num_groups * tail

    def released(self, group) -> None:
        state = self._held.pop(group)
        self._shared_tails.discard(group)
        shared = 1 if state.shared_tail else group.num_seqs
        self.tail_empty -= self.num_groups * shared * (-group.length % self.block_size)
        self.pending -= state.pending_left

    def metrics(self, memory) -> MemoryMetrics:
        return MemoryMetrics.paged(
            memory.num_blocks,
            self.block_size,
            memory.capacity,
            memory.kv.num_free_blocks,
            self.tail_empty,
            self.pending,
        )

    def decode_metrics(self, memory, groups: list, steps: int, free, lengths) -> MemoryMetrics:
        """The empty tail slots grow with the lengths, each sequence its own after the first step (a shared
        tail is empty once before it); `free` is the KV core's k-step prediction."""
        bs, n, held = self.block_size, len(groups), self._held
        ns = np.fromiter(map(_NUM_SEQS, groups), np.int64, n)
        after = lengths[:, None] + np.arange(steps + 1)  # [groups, steps + 1]: lengths after 0..steps steps
        empty = ns @ (-after % bs)  # [steps + 1]: one group's empty tail slots, each sequence its own
        tails_now = int(empty[0])
        if self._shared_tails:
            shared = np.fromiter([held[g].shared_tail for g in groups], bool, n)
            tails_now -= int((((ns - 1) * shared) * (-lengths % bs)).sum())  # a shared tail is empty once
        tail = self.tail_empty + self.num_groups * (empty[1:] - tails_now)
        return MemoryMetrics.paged(memory.num_blocks, bs, memory.capacity, free, tail, self.pending)


class PagedMemory(KVSchedulerMemory):
    """`MemoryPolicy` over one pool shared by the model's KV cache groups (module docstring): `policy.kv_groups`,
    or one full-attention group when None. The KV core's adapter, configured: it overrides none of its
    methods."""

    def __init__(self, policy, capacity: int, watermark: float):
        self.groups = check_kv_groups(policy.kv_groups or ONE_FULL_GROUP)
        bs = policy.block_size
        self.group_size = max(g.num_layers for g in self.groups)
        real_layers = sum(g.num_layers for g in self.groups)
        group_slots = capacity * real_layers // self.group_size
        num_blocks = group_slots // bs
        if num_blocks < 1:
            raise InvalidArgumentError(f"KV capacity {capacity} tokens holds no block of {bs} tokens")
        self.windows = [g.window for g in self.groups]
        kv = KVCacheManager(
            [g.spec(bs) for g in self.groups], num_blocks, enable_prefix_caching=policy.enable_prefix_caching
        )
        self.slots = SlotCategories(bs, len(self.groups))
        layers = [g.num_layers for g in self.groups]
        super().__init__(kv, watermark, self.slots, capacity=group_slots, layers_per_group=layers)
        self.host_bandwidth = 0.0  # bytes/s of host-tier loads (attach_host_tier)

    @property
    def pending(self) -> int:
        """Group slots of tokens allocated but not computed (the slot hook's counter)."""
        return self.slots.pending

    @property
    def tail_empty(self) -> int:
        """Empty slots of last blocks over groups and sequences (the slot hook's counter)."""
        return self.slots.tail_empty

    def attach_host_tier(self, offload) -> None:
        """Put a host-memory tier (`core.serving.host_offload.HostOffload`) behind the pool: admissions then hit
        HBM, then the tier, and report the tier's tokens as `Admission.load_tokens`. Call before any admission;
        raises InvalidArgumentError unless the pool is one full-attention group with prefix caching."""
        if self.kv.request_ids() or len(self.groups) != 1 or self.windows[0] is not None:
            raise InvalidArgumentError(
                "a host tier needs one full-attention KV cache group and no request yet"
            )
        tier = HostTier(
            offload.host_capacity_tokens // self.block_size,
            self.block_size,
            policy=offload.policy,
            store_threshold=offload.store_threshold,
        )
        self.kv = KVCacheManager(
            [g.spec(self.block_size) for g in self.groups],
            self.num_blocks,
            enable_prefix_caching=self.kv.enable_prefix_caching,
            host_tier=tier,
        )
        self.host_bandwidth = offload.bandwidth_bytes_per_s
