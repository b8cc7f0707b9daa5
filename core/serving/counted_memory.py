"""Paged KV memory by block counts alone (`Policy.counted`): the arithmetic of `core.serving.paged_memory` for
one full-attention pool, no prefix caching and one sequence per request, without block tables or token ids.

A sequence of L tokens holds cdiv(L, block_size) blocks: admission takes cdiv(prompt + recomputed outputs,
block_size), a decode step takes one block when the sequence's length is a multiple of block_size, release gives
them all back. Those counts are not written here: they are the answers of the KV core's full-attention manager
(`num_required_blocks`, `num_new_blocks`), asked without a block table; the fits formula (`fits_blocks`), the
pending-slots formula (`pending_done`) and the k-step prediction's name (`num_free_blocks_after_decode`) are the
KV core's adapter's (`core.kv.scheduler_memory`); the watermark, the reserved decode blocks and the slot
categories are `PagedMemory`'s. So the
scheduler makes exactly the same decisions as under the full paged policy (tests/serving/test_counted_memory.py
runs both), at a fraction of the cost: what the SLO planner's many simulations need. There are no block tables
to snapshot (`snapshot` returns None) and no prefix cache.
"""

import numpy as np

from core.errors import InvalidArgumentError
from core.kv.scheduler_memory import Admission, MemoryMetrics, fits_blocks, pending_done
from core.kv.single_type_manager import rule_of
from core.kv.specs import FullAttentionSpec


class _Held:
    """A held group's blocks, and its pending slots (allocated, not computed): at admission and left now."""

    __slots__ = ("blocks", "pending_left", "pending_total")

    def __init__(self, blocks: int, pending: int):
        self.blocks = blocks
        self.pending_total = self.pending_left = pending


class CountedPagedMemory:
    """`MemoryPolicy` of `capacity` token slots in blocks of `block_size` (module docstring)."""

    def __init__(self, block_size: int, capacity: int, watermark: float):
        self.block_size = block_size
        self.capacity = capacity
        self.num_blocks = capacity // block_size
        if self.num_blocks < 1:
            raise InvalidArgumentError(f"KV capacity {capacity} tokens holds no block of {block_size} tokens")
        self.watermark_blocks = int(watermark * self.num_blocks)
        # the KV core's arithmetic for one full-attention group (no pool, no tables)
        self._group_rule = rule_of(FullAttentionSpec(block_size=block_size, num_kv_heads=0, head_size=0))
        self._free = self.num_blocks
        self.pending = 0
        self.tail_empty = 0  # empty slots of the sequences' last blocks
        self._held: dict = {}

    @property
    def free_blocks(self) -> int:
        return self._free

    def check_fits(self, group, max_output_len: int) -> None:
        if group.num_seqs != 1:
            raise InvalidArgumentError(
                f"request {group.request_id}: the counted paged policy serves one sequence per request, "
                f"got n={group.num_seqs} (use the full paged policy)"
            )
        prompt, bs = group.prompt_len, self.block_size
        admit, peak = fits_blocks([self._group_rule], prompt, max_output_len, 1)  # the one fits formula
        if peak > self.num_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id} ({prompt} + {max_output_len} tokens, n=1) needs {peak:,} blocks "
                f"of {bs} at its longest, more than the {self.num_blocks:,} blocks of the cache"
            )
        if admit > self.num_blocks - self.watermark_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id}'s prompt of {prompt} tokens never fits in {self.num_blocks:,} "
                f"blocks less the {self.watermark_blocks} watermark blocks"
            )

    def swap_blocks(self, group) -> int:
        return self._group_rule.num_required_blocks(max(group.length, group.prompt_len))

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        need = self._group_rule.num_required_blocks(num_tokens)
        return need <= self._free - self.watermark_blocks - max(0, reserved_blocks)

    def admit(self, group, num_tokens: int) -> Admission:
        blocks = self._group_rule.num_required_blocks(num_tokens)
        self._free -= blocks
        self.pending += num_tokens
        self.tail_empty += -num_tokens % self.block_size
        self._held[group] = _Held(blocks, num_tokens)
        return Admission(num_tokens, 0)

    def prefill(self, group, num_tokens: int) -> None:
        state = self._held[group]
        done = pending_done(state.pending_total, state.pending_left, group, num_tokens)
        state.pending_left -= done
        self.pending -= done

    def decode_blocks(self, groups: list) -> int:
        """Each sequence's table growth by its next token: the KV core's table length (`num_required_blocks`)
        for one more token less the blocks it holds (a full-attention group skips nothing, so that is what
        `num_new_blocks` answers). `groups`: distinct held groups; when they are all of them (a decode-only
        batch, the usual case), the blocks they hold are every taken block, so none is looked up."""
        need = sum(map(self._group_rule.num_required_blocks, [g.length + 1 for g in groups]))
        if len(groups) == len(self._held):
            return need - (self.num_blocks - self._free)
        held = self._held
        return need - sum([held[g].blocks for g in groups])

    def num_free_blocks_after_decode(self, groups: list, steps: int) -> np.ndarray:
        """The k-step decode prediction `KVCacheManager.num_free_blocks_after_decode` answers for block tables,
        answered by the full-attention rule alone (keyed by held group, one sequence each): after step t the
        groups' tables need `num_required_blocks` of their lengths then (elementwise), so the blocks taken by
        steps 1..t are that sum less the sum now (nothing is released, nothing shared)."""
        lengths = np.fromiter([g.length for g in groups], np.int64, len(groups))
        after = lengths[:, None] + np.arange(steps + 1)  # [groups, steps + 1]: lengths after 0..steps steps
        needed = self._group_rule.num_required_blocks(after).sum(axis=0)  # elementwise over int64 arrays
        return self._free - (needed[1:] - needed[0])

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """Free blocks by `num_free_blocks_after_decode`; the empty tail slots follow the lengths."""
        bs = self.block_size
        lengths = np.fromiter([g.length for g in groups], np.int64, len(groups))
        after = lengths[:, None] + np.arange(steps + 1)
        empty = (-after % bs).sum(axis=0)  # empty tail slots after 0..steps steps
        free = self.num_free_blocks_after_decode(groups, steps)
        tail = self.tail_empty + (empty[1:] - empty[0])
        return MemoryMetrics.paged(self.num_blocks, bs, self.capacity, free, tail, self.pending)

    def decoded(self, groups: list, steps: int) -> None:
        """Nothing: blocks are counted when `grow` takes them."""

    def grow(self, groups: list, steps: int) -> None:
        bs, required = self.block_size, self._group_rule.num_required_blocks
        held = self._held
        taken = tail = 0  # summed here, added once: this runs for every decoding group of every step
        for group in groups:
            length = group.length
            state = held[group]
            blocks = required(length + steps)
            taken += blocks - state.blocks
            state.blocks = blocks
            tail += -(length + steps) % bs - (-length % bs)
        self._free -= taken
        self.tail_empty += tail

    def release(self, group) -> int:
        state = self._held.pop(group)
        self._free += state.blocks
        self.tail_empty -= -group.length % self.block_size
        self.pending -= state.pending_left
        return state.blocks

    def metrics(self) -> MemoryMetrics:
        return MemoryMetrics.paged(
            self.num_blocks, self.block_size, self.capacity, self._free, self.tail_empty, self.pending
        )

    def snapshot(self, groups: list) -> None:
        return None
