"""The engine's paged KV memory: the real `BlockManager` and `KVCache`, driven by the engine's real sequences.

Invariants:
- A live sequence `s` is held by the manager with `s.num_allocated` tokens: its prompt (and, after a recompute
  preemption, its earlier output) from admission, and one more token per decode step, appended just before the
  step computes it.
- `ready[b]` is True when block b's K/V are computed for all of its block_size tokens. A block newly placed in a
  table is not ready; prefix-cache hits on blocks that are not ready yet (registered at allocation by a request
  whose prefill has not reached them, or freed before it did) are computed again, never read unwritten.
- Copy-on-write: when `append_token` reports `(src, dst)` the K/V of src are copied into dst (every layer)
  before the new token is written.
"""

import numpy as np

from core.common import cdiv
from core.engine.sequence import Sequence, SequenceGroup
from core.paging.block_manager import BlockManager
from core.paging.kv_cache import KVCache


class EngineMemory:
    """Allocation and accounting of the engine's sequences in the pool. watermark: fraction of the blocks kept
    free when admitting (vLLM's 0.01)."""

    def __init__(self, manager: BlockManager, cache: KVCache, watermark: float = 0.01):
        self.manager = manager
        self.cache = cache
        self.block_size = manager.block_size
        self.num_blocks = manager.num_blocks
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.ready = np.zeros(self.num_blocks, dtype=bool)
        self.cow_copies = 0  # copy-on-write copies since construction

    # ---- sizing -------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def admission_blocks(self, group: SequenceGroup) -> int:
        """Blocks admitting the group takes at most (prefix-cache hits not counted)."""
        return sum(cdiv(len(s.token_ids), self.block_size) for s in group.seqs)

    def decode_blocks(self, group: SequenceGroup) -> int:
        """New blocks one decode step of the group takes: a block for each sequence whose last block is full, and
        a copy for each sequence but the last holder of a shared, partially filled last block."""
        mgr, bs = self.manager, self.block_size
        need = 0
        holders: dict[int, int] = {}
        for seq in group.seqs:
            if seq.num_allocated % bs == 0:
                need += 1
            else:
                last = mgr.block_table(seq.seq_id)[-1]
                holders[last] = holders.get(last, 0) + 1
        for block, count in holders.items():  # the last holder in the pool writes in place
            need += count if mgr.ref_count(block) > count else count - 1
        return need

    def can_admit(self, group: SequenceGroup, reserved_blocks: int) -> bool:
        return self.admission_blocks(group) <= self.free_blocks - self.watermark_blocks - reserved_blocks

    # ---- operations ---------------------------------------------------------------------------------------

    def allocate(self, group: SequenceGroup) -> int:
        """Give each of the group's sequences blocks for all its tokens: the prompt (one sequence, before sampling
        starts) or each sequence's prompt and output (after a recompute preemption). Sets num_allocated / num_computed. Returns prefix-hit tokens that
        need no prefill."""
        mgr, bs = self.manager, self.block_size
        hit_tokens = 0
        for seq in group.seqs:
            hits = mgr.allocate(seq.seq_id, seq.token_ids)
            table = mgr.block_table(seq.seq_id)
            ready = 0
            while ready < hits and self.ready[table[ready]]:
                ready += 1
            self.ready[table[hits:]] = False
            seq.num_allocated = len(seq.token_ids)
            seq.num_computed = ready * bs
            hit_tokens += ready * bs
        return hit_tokens

    def slots(self, seq: Sequence, start: int, stop: int) -> np.ndarray:
        """[stop - start] int64 slot ids of the sequence's tokens start .. stop - 1."""
        table = np.asarray(self.manager.block_table(seq.seq_id), dtype=np.int64)
        pos = np.arange(start, stop, dtype=np.int64)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def append(self, seq: Sequence) -> tuple[int, tuple[int, int] | None]:
        """Make room for the sequence's last (sampled, not yet computed) token; returns its slot and the
        copy-on-write pair (src, dst) already copied, or None."""
        result = self.manager.append_token(seq.seq_id, seq.token_ids[-1])
        if result.cow is not None:
            self.cache.copy_blocks([result.cow])
            self.cow_copies += 1
        self.ready[result.slot // self.block_size] = False  # a block being written is not full yet
        seq.num_allocated += 1
        return result.slot, result.cow

    def mark_computed(self, seq: Sequence, stop: int) -> None:
        """The sequence's K/V are now computed for tokens [0, stop): mark its full blocks ready."""
        old = seq.num_computed
        seq.num_computed = stop
        first, last = old // self.block_size, stop // self.block_size
        if last > first:
            table = self.manager.block_table(seq.seq_id)
            self.ready[table[first:last]] = True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.manager.fork(parent.seq_id, child.seq_id)

    def free_seq(self, seq: Sequence) -> None:
        if seq.num_allocated:
            self.manager.free(seq.seq_id)
        seq.num_allocated = seq.num_computed = 0

    def release(self, group: SequenceGroup) -> None:
        for seq in group.seqs:
            self.free_seq(seq)

    # ---- metrics ------------------------------------------------------------------------------------------

    def usage(self, seqs: list[Sequence]) -> dict:
        """Token states, reservation and sharing of the live sequences, in slots or blocks (see COLUMNS)."""
        mgr, bs = self.manager, self.block_size
        computed = np.zeros(self.num_blocks, dtype=np.int64)
        shared = set()
        unshared = 0
        for seq in seqs:
            if not seq.num_allocated:
                continue
            table = np.asarray(mgr.block_table(seq.seq_id), dtype=np.int64)
            fill = np.clip(seq.num_computed - np.arange(len(table)) * bs, 0, bs)
            np.maximum.at(computed, table, fill)
            unshared += len(table)
            shared.update(b for b in table.tolist() if mgr.ref_count(b) > 1)
        used = self.num_blocks - mgr.num_free_blocks
        seen = np.zeros(self.num_blocks, dtype=np.int64)
        for seq in seqs:
            if seq.num_allocated:
                table = np.asarray(mgr.block_table(seq.seq_id), dtype=np.int64)
                fill = np.clip(seq.num_allocated - np.arange(len(table)) * bs, 0, bs)
                np.maximum.at(seen, table, fill)
        allocated_tokens = int(seen.sum())
        token_states = int(computed.sum())
        return {
            "token_states": token_states,
            "reservation": allocated_tokens - token_states,
            "internal_fragmentation": used * bs - allocated_tokens,
            "blocks_in_use": used,
            "blocks_without_sharing": unshared,
            "shared_blocks": len(shared),
        }
