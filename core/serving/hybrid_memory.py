"""Paged KV for a hybrid model, as vLLM V1's hybrid allocator: full-attention groups grow with the sequence,
sliding-window groups keep only the blocks their window still reads.

The model's layers form KV cache groups, given as (kind, num_layers, window) with kind "full" (window None) or
"sliding_window" (window >= 1 tokens). As in vLLM every group's page is the same size: a block of any group holds
`block_size` tokens of K/V for `group_size` = the largest group's layers, so a smaller group is padded (its
padding layers' pages are allocated and unused, vLLM's "Add N padding layers"). Every group draws its blocks from
one shared pool of the bytes of `capacity` token slots of every real layer: `capacity x real_layers //
group_size` *group slots* (one token of one group's block), so num_blocks = that // block_size, vLLM's
available_bytes // page // group_size (equal groups: G x capacity // block_size for G groups). Each group keeps
its own block table per sequence in a real `BlockManager` (with `sliding_window` for a window group: a block is
released once it lies wholly before position n - window + 1 of the token being appended, and a prompt is
allocated whole); the policy bounds their sum by the pool.

The metrics are in group slots and sum to `capacity` (group slots); token states include a padded group's
padding pages, as vLLM allocates them. Limits: one sequence per request (no parallel sampling) and no prefix
caching; each group's manager numbers its own blocks, so a block id names a block within its group only
(`HybridPoolSnapshot`).
"""

from dataclasses import dataclass

import numpy as np

from core.common import cdiv, check_int
from core.errors import InvalidArgumentError
from core.paging.block_manager import BlockManager
from core.serving.memory_policies import Admission, MemoryMetrics, _PagedGroupState

KV_GROUP_KINDS = ("full", "sliding_window")


def check_kv_groups(kv_groups) -> tuple:
    """The groups as a tuple of (kind, num_layers, window) tuples; raises InvalidArgumentError when a kind is
    unknown, a window is missing or set on a full group, or a group has no layer. Groups may differ in size
    (smaller ones are padded to the largest, as vLLM does)."""
    groups = tuple(tuple(g) for g in kv_groups)
    if not groups:
        raise InvalidArgumentError("a hybrid policy needs at least one KV cache group")
    for kind, layers, window in groups:
        if kind not in KV_GROUP_KINDS:
            raise InvalidArgumentError(f"KV cache group kind must be one of {KV_GROUP_KINDS}, got {kind!r}")
        check_int(layers, "num_layers of a KV cache group", minimum=1)
        if kind == "full" and window is not None:
            raise InvalidArgumentError(f"a full-attention group has no window, got {window!r}")
        if kind == "sliding_window":
            check_int(window, "sliding window (tokens)", minimum=1)
    return groups


@dataclass(frozen=True, eq=False)
class GroupBlocks:
    """The blocks one KV cache group holds after a step. kind, num_layers, window: the group's spec.
    block_ids: int32 [held], the group's own block ids (its manager's numbering), increasing; owner_request:
    int32 [held], the request whose sequence holds each block; fill: int16 [held], tokens stored (block_size
    except a sequence's last block). Blocks a sliding window released are not held, so they do not appear. The
    arrays are read-only and may be the very objects of another group with the same blocks."""

    kind: str
    num_layers: int
    window: int | None
    block_ids: np.ndarray
    owner_request: np.ndarray
    fill: np.ndarray


@dataclass(frozen=True, eq=False)
class HybridPoolSnapshot:
    """The shared pool after a step: num_blocks (the pool), group_size (layers per block, padding included),
    groups (one `GroupBlocks` per KV cache group, in group order). free_blocks = num_blocks - blocks held."""

    num_blocks: int
    group_size: int
    groups: tuple[GroupBlocks, ...]

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - sum(len(g.block_ids) for g in self.groups)


def _same_blocks(group: GroupBlocks, arrays: tuple) -> bool:
    return all(
        np.array_equal(a, b)
        for a, b in zip((group.block_ids, group.owner_request, group.fill), arrays, strict=True)
    )


class HybridPagedMemory:
    """`MemoryPolicy` over one pool shared by full and sliding-window KV cache groups (module docstring)."""

    def __init__(self, policy, capacity: int, watermark: float):
        self.groups = check_kv_groups(policy.kv_groups)
        self.block_size = bs = policy.block_size
        if policy.enable_prefix_caching:
            raise InvalidArgumentError("the hybrid policy simulates no prefix caching")
        self.group_size = max(layers for _, layers, _ in self.groups)
        real_layers = sum(layers for _, layers, _ in self.groups)
        self.capacity = capacity * real_layers // self.group_size  # group slots
        self.num_blocks = self.capacity // bs
        if self.num_blocks < 1:
            raise InvalidArgumentError(f"KV capacity {capacity} tokens holds no block of {bs} tokens")
        self.managers = [BlockManager(self.num_blocks, bs, sliding_window=w) for _, _, w in self.groups]
        self.windows = [w for _, _, w in self.groups]
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.pending = 0
        self.tail_empty = 0  # empty slots of the last block, summed over groups and sequences
        self._held: dict = {}  # group -> _PagedGroupState; shared_tail marks "appended since admission"

    # ---- sizing --------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return sum(m.num_free_blocks for m in self.managers) - (len(self.managers) - 1) * self.num_blocks

    def _held_blocks(self, length: int, window: int | None, appended: bool) -> int:
        """Blocks one sequence of `length` tokens holds in a group (a prompt is held whole until an append)."""
        if window is None or not appended:
            return cdiv(length, self.block_size)
        last = length - 1  # the newest appended position
        return last // self.block_size - max(0, last - window + 1) // self.block_size + 1

    def check_fits(self, group, max_output_len: int) -> None:
        if group.num_seqs != 1:
            raise InvalidArgumentError(
                f"request {group.request_id}: the hybrid policy simulates one sequence per request, got "
                f"n={group.num_seqs}"
            )
        prompt, longest = group.prompt_len, group.prompt_len + max_output_len - 1
        peak = sum(
            max(cdiv(prompt, self.block_size), self._held_blocks(longest, w, True)) for w in self.windows
        )
        if peak > self.num_blocks or len(self.windows) * cdiv(prompt, self.block_size) > (
            self.num_blocks - self.watermark_blocks
        ):
            raise InvalidArgumentError(
                f"request {group.request_id} ({prompt} + {max_output_len} tokens) needs up to {peak:,} blocks of "
                f"{self.block_size} over its KV cache groups, more than the {self.num_blocks:,}-block pool holds"
            )

    def swap_blocks(self, group) -> int:
        sid = group.seq_ids[0]
        return sum(sum(1 for b in m.block_table(sid) if b >= 0) for m in self.managers)

    # ---- admission --------------------------------------------------------------------------------------------

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        need = len(self.managers) * cdiv(num_tokens, self.block_size)
        return need <= self.free_blocks - self.watermark_blocks - reserved_blocks

    def admit(self, group, num_tokens: int) -> Admission:
        tokens = group.token_ids(0, 0, num_tokens)
        for manager in self.managers:
            manager.allocate(group.seq_ids[0], tokens)
        pending = len(self.managers) * num_tokens
        self.pending += pending
        self.tail_empty += len(self.managers) * (-num_tokens % self.block_size)
        self._held[group] = _PagedGroupState(pending, False)
        return Admission(num_tokens, 0)

    def prefill(self, group, num_tokens: int) -> None:
        done = self._held[group].compute(group, num_tokens)
        self.pending -= done

    # ---- decode ----------------------------------------------------------------------------------------------

    def decode_blocks(self, groups: list) -> int:
        need = 0
        for group in groups:
            appended = self._held[group].shared_tail
            length = group.length
            for window in self.windows:
                need += self._held_blocks(length + 1, window, True) - self._held_blocks(
                    length, window, appended
                )
        return need

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        bs = self.block_size
        lengths = np.fromiter((g.length for g in groups), np.int64, len(groups))
        after = (
            lengths[:, None] + np.arange(1, steps + 1)[None, :]
        )  # [groups, steps]: lengths after each step
        grown = np.zeros(steps, dtype=np.int64)
        for window in self.windows:
            now = np.array(
                [self._held_blocks(g.length, window, self._held[g].shared_tail) for g in groups],
                dtype=np.int64,
            )
            if window is None:
                held = -(-after // bs)
            else:
                held = (after - 1) // bs - np.maximum(0, after - window) // bs + 1
            grown += (held - now[:, None]).sum(axis=0)
        free = self.free_blocks - grown
        count = len(self.managers)
        others = self.tail_empty - count * int((-lengths % bs).sum())
        tail = others + count * (-after % bs).sum(axis=0)
        token_states = (self.num_blocks - free) * bs - tail - self.pending
        return MemoryMetrics(
            token_states,
            np.full(steps, self.pending, dtype=np.int64),
            tail,
            np.full(steps, self.capacity - self.num_blocks * bs, dtype=np.int64),
            free * bs,
            free,
        )

    def grow(self, groups: list, steps: int) -> None:
        count = len(self.managers)
        for group in groups:
            length = group.length
            tokens = group.token_ids(0, length, length + steps)
            for manager in self.managers:
                manager.extend(group.seq_ids[0], tokens)
            self.tail_empty += count * (-(length + steps) % self.block_size - (-length % self.block_size))
            self._held[group].shared_tail = True

    # ---- release, metrics ------------------------------------------------------------------------------------

    def release(self, group) -> int:
        state = self._held.pop(group)
        free0 = self.free_blocks
        for manager in self.managers:
            manager.free(group.seq_ids[0])
        self.tail_empty -= len(self.managers) * (-group.length % self.block_size)
        self.pending -= state.pending_left
        return self.free_blocks - free0

    def metrics(self) -> MemoryMetrics:
        free = self.free_blocks
        used = (self.num_blocks - free) * self.block_size
        return MemoryMetrics(
            used - self.tail_empty - self.pending,
            self.pending,
            self.tail_empty,
            self.capacity - self.num_blocks * self.block_size,
            free * self.block_size,
            free,
        )

    def held_blocks_by_group(self) -> tuple[int, ...]:
        """Blocks each KV cache group holds now, in group order."""
        return tuple(self.num_blocks - m.num_free_blocks for m in self.managers)

    def snapshot(self, groups: list) -> HybridPoolSnapshot:
        """Every group's held blocks (see `HybridPoolSnapshot`); `groups` is unused (no block tables: the
        kernels' per-step measurement needs one pool). O(blocks held)."""
        bs = self.block_size
        request_of = {g.seq_ids[0]: g.request_id for g in self._held}
        out = []
        for (kind, layers, window), manager in zip(self.groups, self.managers, strict=True):
            ids, owners, fills = [], [], []
            for sid in manager.seq_ids():
                table = manager.block_table(sid)
                held = [b for b in table if b >= 0]
                if not held:
                    continue
                ids += held
                owners += [request_of[sid]] * len(held)
                fills += [bs] * (len(held) - 1) + [manager.num_tokens(sid) - (len(table) - 1) * bs]
            order = np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")
            arrays = (
                np.asarray(ids, dtype=np.int32)[order],
                np.asarray(owners, dtype=np.int32)[order],
                np.asarray(fills, dtype=np.int16)[order],
            )
            twin = next((g for g in out if g.window == window and _same_blocks(g, arrays)), None)
            if twin is not None:  # groups with one window make the same moves: share arrays (pickled once)
                arrays = (twin.block_ids, twin.owner_request, twin.fill)
            for array in arrays:
                array.setflags(write=False)
            out.append(GroupBlocks(kind, layers, window, *arrays))
        return HybridPoolSnapshot(self.num_blocks, self.group_size, tuple(out))
