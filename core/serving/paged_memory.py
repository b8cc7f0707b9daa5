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
padding pages, as vLLM allocates them. This policy stays in `core.serving` (not `core.kv`) because what it adds to
the pool is the simulator's accounting: the paper's slot categories and the bulk decode prediction.
"""

from dataclasses import dataclass

import numpy as np

from core.common import check_int
from core.errors import InvalidArgumentError
from core.kv.host_tier import HostTier
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.layout import KVCacheGroup
from core.kv.snapshot import KVCacheSnapshot
from core.kv.specs import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec
from core.sched.memory import Admission, MemoryMetrics

KV_GROUP_KINDS = ("full", "sliding_window")


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


class _PagedGroupState:
    """Per held group: pending_total / pending_left (group slots allocated but not computed: total at
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
    """`MemoryPolicy` over one pool shared by the model's KV cache groups (module docstring): `policy.kv_groups`,
    or one full-attention group when None."""

    def __init__(self, policy, capacity: int, watermark: float):
        self.groups = check_kv_groups(policy.kv_groups or ONE_FULL_GROUP)
        self.block_size = bs = policy.block_size
        self.group_size = max(g.num_layers for g in self.groups)
        real_layers = sum(g.num_layers for g in self.groups)
        self.capacity = capacity * real_layers // self.group_size  # group slots
        self.num_blocks = self.capacity // bs
        if self.num_blocks < 1:
            raise InvalidArgumentError(f"KV capacity {capacity} tokens holds no block of {bs} tokens")
        self.windows = [g.window for g in self.groups]
        self.kv = KVCacheManager(
            [g.spec(bs) for g in self.groups],
            self.num_blocks,
            enable_prefix_caching=policy.enable_prefix_caching,
        )
        self.host_bandwidth = 0.0  # bytes/s of host-tier loads (attach_host_tier)
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.pending = 0  # group slots of tokens allocated but not computed
        self.tail_empty = 0  # empty slots of last blocks, over groups and sequences (a shared one once)
        self._held: dict = {}  # group -> _PagedGroupState (shared_tail: forks still share the last block)

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

    # ---- sizing --------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.kv.num_free_blocks

    def _blocks_for(self, prompt: int, generated: int, n: int) -> int:
        """Blocks all groups hold for n sequences sharing `prompt` tokens with `generated` own tokens each, with
        nothing released yet (as at admission): the KV core's `blocks_needed`."""
        return self.kv.blocks_needed(prompt + generated, n, prompt)

    def check_fits(self, group, max_output_len: int) -> None:
        n, prompt = group.num_seqs, group.prompt_len
        longest = prompt + max_output_len - 1
        kv, count = self.kv, len(self.windows)
        # per group (every group holds a prompt alike): a full group keeps everything, the prompt shared; a
        # window group holds at most what its window reads at the longest length (each sequence its own
        # blocks), never less than the prompt
        admit = kv.blocks_needed(prompt, n) // count
        full = kv.blocks_needed(longest, n, prompt) // count
        peak = sum(
            full if w is None else max(admit, n * held)
            for w, held in zip(self.windows, kv.num_blocks_held(longest), strict=True)
        )
        groups = "" if len(self.windows) == 1 else f" over its {len(self.windows)} KV cache groups"
        if peak > self.num_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id} ({prompt} + {max_output_len} tokens, n={n}) needs {peak:,} blocks "
                f"of {self.block_size} at its longest{groups}, more than the {self.num_blocks:,} blocks of the cache"
            )
        if len(self.windows) * admit > self.num_blocks - self.watermark_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id}'s prompt of {prompt} tokens{groups} never fits in "
                f"{self.num_blocks:,} blocks less the {self.watermark_blocks} watermark blocks"
            )

    def swap_blocks(self, group) -> int:
        """Blocks the group's KV takes in swap space: what swapping it back in allocates (every group holds the
        whole sequences again, the prompt shared), the same whether it is asked while held or swapped out."""
        return self._blocks_for(group.prompt_len, group.length - group.prompt_len, group.num_seqs)

    # ---- admission --------------------------------------------------------------------------------------------

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        need = self._blocks_for(group.prompt_len, num_tokens - group.prompt_len, group.num_seqs)
        # the step's decodes may release more than they take (windows), but only after the admission
        return need <= self.kv.num_free_blocks - self.watermark_blocks - max(0, reserved_blocks)

    def admit(self, group, num_tokens: int) -> Admission:
        """Allocate the prompt in every group (looked up in the prefix cache) and fork it into the other
        sequences; outputs to restore are appended to each (pending until prefilled)."""
        kv, n, count = self.kv, group.num_seqs, len(self.windows)
        gen = num_tokens - group.prompt_len
        sid0 = group.seq_ids[0]
        host_before = kv.host_cache_hits
        hits = kv.allocate(sid0, group.token_ids(0, 0, num_tokens if n == 1 else group.prompt_len))
        loads = kv.host_cache_hits - host_before
        if loads:
            kv.take_host_loads()  # the simulator prices the copies (host tokens over the link), it copies nothing
        for sid in group.seq_ids[1:]:
            kv.fork(sid0, sid)
        if n > 1 and gen:
            for index, sid in enumerate(group.seq_ids):
                for token in group.token_ids(index, group.prompt_len, num_tokens):
                    kv.append_token(sid, token)
        shared_tail = n > 1 and gen == 0 and num_tokens % self.block_size != 0
        prefill = num_tokens + (n - 1) * gen - hits
        self.pending += count * prefill
        self.tail_empty += count * (-num_tokens % self.block_size) * (1 if shared_tail else n)
        self._held[group] = _PagedGroupState(count * prefill, shared_tail)
        return Admission(prefill, hits, loads)

    def prefill(self, group, num_tokens: int) -> None:
        """Account the computed slots; the prompt's computed tokens enter the prefix cache (a sequence group
        once its whole admission is computed, a single sequence chunk by chunk)."""
        self.pending -= self._held[group].compute(group, num_tokens)
        kv = self.kv
        if group.num_prefill_tokens == 0:
            for sid in group.seq_ids:
                kv.mark_computed(sid, kv.num_tokens(sid))
        elif group.num_seqs == 1:
            sid = group.seq_ids[0]
            kv.mark_computed(
                sid, max(kv.num_computed_tokens(sid), kv.num_tokens(sid) - group.num_prefill_tokens)
            )

    # ---- decode ----------------------------------------------------------------------------------------------

    def decode_blocks(self, groups: list) -> int:
        """Net blocks the groups' next decode step takes (new and copied blocks less the blocks it releases):
        the KV core's `num_blocks_for_decode`, the question the engine asks too."""
        return self.kv.num_blocks_for_decode(sid for group in groups for sid in group.seq_ids)

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """The free blocks after steps 1..t are the KV core's k-step prediction
        (`KVCacheManager.num_free_blocks_after_decode`: tables grow by `num_required_blocks`, a shared written tail
        is copied, window groups release by the window rule); the empty tail slots grow with the lengths, each
        sequence its own after the first step (a shared tail is empty once before it)."""
        bs, count, n = self.block_size, len(self.windows), len(groups)
        held = self._held
        lengths = np.fromiter([g.length for g in groups], np.int64, n)
        ns = np.fromiter([g.num_seqs for g in groups], np.int64, n)
        shared = np.fromiter([held[g].shared_tail for g in groups], bool, n)
        after = lengths[:, None] + np.arange(steps + 1)  # [groups, steps + 1]: lengths after 0..steps steps
        empty = ns @ (-after % bs)  # [steps + 1]: one group's empty tail slots, each sequence its own
        tails_now = int(empty[0])
        if shared.any():
            tails_now -= int((((ns - 1) * shared) * (-lengths % bs)).sum())  # a shared tail is empty once
        tail = self.tail_empty + count * (empty[1:] - tails_now)
        free = self.kv.num_free_blocks_after_decode([g.seq_ids for g in groups], steps)
        return MemoryMetrics.paged(self.num_blocks, bs, self.capacity, free, tail, self.pending)

    def decoded(self, groups: list, steps: int) -> None:
        """Nothing: `decode_steps` marks the tokens computed before the next ones are appended."""

    def grow(self, groups: list, steps: int) -> None:
        count, bs = len(self.windows), self.block_size
        new_tokens = {}
        for group in groups:
            length, n = group.length, group.num_seqs
            for index, sid in enumerate(group.seq_ids):
                new_tokens[sid] = group.token_ids(index, length, length + steps)
            state = self._held[group]
            before = (1 if state.shared_tail else n) * (-length % bs)
            self.tail_empty += count * (n * (-(length + steps) % bs) - before)
            state.shared_tail = False
        self.kv.decode_steps(new_tokens, trusted=True)  # our groups made the ids

    # ---- release, metrics ------------------------------------------------------------------------------------

    def release(self, group) -> int:
        state = self._held.pop(group)
        free0 = self.kv.num_free_blocks
        for sid in group.seq_ids:
            self.kv.free(sid)
        shared = 1 if state.shared_tail else group.num_seqs
        self.tail_empty -= len(self.windows) * shared * (-group.length % self.block_size)
        self.pending -= state.pending_left
        return self.kv.num_free_blocks - free0

    def metrics(self) -> MemoryMetrics:
        return MemoryMetrics.paged(
            self.num_blocks,
            self.block_size,
            self.capacity,
            self.kv.num_free_blocks,
            self.tail_empty,
            self.pending,
        )

    def snapshot(self, groups: list) -> KVCacheSnapshot:
        """The one pool: every group's blocks in one id space (`group` says whose), every live sequence's tables.
        O(blocks + table entries)."""
        return self.kv.snapshot()
