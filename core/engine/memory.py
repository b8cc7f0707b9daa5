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
- Sliding window (the manager's `sliding_window` W, set by the engine when every layer has window W): appending
  the token at position n first releases the sequence's blocks wholly before position n - W + 1; their table
  entries become -1 (a prefix of the table). Nothing here reads or marks a -1 entry, and no query of a later step
  can see those positions, so the kernels never read them either.
"""

import numpy as np

from core.common import cdiv
from core.engine.sequence import Sequence, SequenceGroup
from core.errors import InvalidArgumentError
from core.paging.block_manager import BlockManager
from core.paging.kv_cache import KVCache
from core.serving.memory_policies import Admission, MemoryMetrics


class EngineMemory:
    """The engine's `core.serving.memory_policies.MemoryPolicy`: the serving scheduler admits, grows and releases
    the engine's real groups through it. watermark: fraction of the blocks kept free when admitting (vLLM's 0.01).

    A group not yet sampled (`started_sampling` False) holds its prompt once: the first sequence is allocated and
    the others (n parallel samples) are forked from it, so they share every prompt block. A group readmitted after
    a recompute preemption allocates each sequence's own tokens (prefix caching may share them again).
    cow_log: (request_id, seq_id, src_block, dst_block) of each copy-on-write made by `grow`, drained by the engine.
    """

    def __init__(self, manager: BlockManager, cache: KVCache, watermark: float = 0.01):
        self.manager = manager
        self.cache = cache
        self.block_size = manager.block_size
        self.num_blocks = manager.num_blocks
        self.capacity = self.num_blocks * self.block_size
        self.watermark = watermark
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.ready = np.zeros(self.num_blocks, dtype=bool)
        self.held: dict[int, SequenceGroup] = {}
        self.cow_log: list[tuple[int, int, int, int]] = []

    # ---- sizing -------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def _to_allocate(self, group: SequenceGroup) -> list[Sequence]:
        return group.seqs if group.started_sampling else group.seqs[:1]

    def admission_blocks(self, group: SequenceGroup) -> int:
        """Blocks admitting the group takes at most (prefix-cache hits not counted)."""
        return sum(cdiv(len(s.token_ids), self.block_size) for s in self._to_allocate(group))

    def peak_blocks_per_seq(self, prompt_len: int, max_output_len: int) -> int:
        """The most blocks one sequence holds at any time: ceil((prompt + outputs) / block_size) with full
        attention. With a sliding window W: the whole prompt until the first decode, then after appending the
        token at position n the blocks n // bs - (n - W + 1) // bs + 1 <= ceil((W + bs - 1) / bs); so
        min(full, max(ceil(prompt / bs), ceil((W + bs - 1) / bs)))."""
        bs, window = self.block_size, self.manager.sliding_window
        full = cdiv(prompt_len + max_output_len, bs)
        if window is None:
            return full
        return min(full, max(cdiv(prompt_len, bs), cdiv(window + bs - 1, bs)))

    def check_fits(self, group: SequenceGroup, max_output_len: int) -> None:
        """Raise InvalidArgumentError when the group's sequences at their largest (`peak_blocks_per_seq` each)
        exceed the pool. With a sliding window a request longer than the pool may run; if it is preempted, its
        recompute allocates all its tokens again (prompts are allocated whole) and may then never fit."""
        peak = group.params.num_sequences * self.peak_blocks_per_seq(group.prompt_len, max_output_len)
        if peak > self.num_blocks - self.watermark_blocks:
            raise InvalidArgumentError(
                f"prompt {group.request_id} ({group.prompt_len:,} tokens + {max_output_len:,} new, "
                f"{group.params.num_sequences} sequence(s)) may need {peak:,} blocks of {self.block_size}; the pool "
                f"has {self.num_blocks:,} (less {self.watermark_blocks} watermark blocks)"
            )

    def can_admit(self, group: SequenceGroup, num_tokens: int, reserved_blocks: int) -> bool:
        return self.admission_blocks(group) <= self.free_blocks - self.watermark_blocks - reserved_blocks

    def _group_decode_blocks(self, group: SequenceGroup) -> int:
        """Replays `grow` on the group's sequences in order, on a copy of the ref counts it touches."""
        mgr, bs, window = self.manager, self.block_size, self.manager.sliding_window
        refs: dict[int, int] = {}
        need = 0
        for seq in group.seqs:
            n = seq.num_allocated  # the position of the token this step appends
            table = mgr.block_table(seq.seq_id)
            first = len(table) - mgr.num_held_blocks(seq.seq_id)  # entries [0, first) are released (-1)
            freed = 0
            if window is not None:  # released before this sequence's new block is taken
                for block in table[first : max(first, (n - window + 1) // bs)]:
                    refs[block] = refs.get(block, mgr.ref_count(block)) - 1
                    freed += refs[block] == 0
            take = 1
            if n % bs:  # a partially filled last block: copied only while someone else still holds it
                last = table[-1]
                count = refs.get(last, mgr.ref_count(last))
                take = int(count > 1)
                refs[last] = count - take
            need += max(0, take - freed)
        return need

    def decode_blocks(self, groups: list) -> int:
        """New blocks one decode step of the groups takes from the pool, at most: a block for each sequence whose
        last block is full, and a copy for each sequence but the last holder (in `grow`'s order) of a shared,
        partially filled last block. With a sliding window, a sequence's append first releases the blocks behind
        its token's window; those that become free (their last holder in the group) offset its own new block.
        Each sequence counts max(0, taken - freed), so the sum bounds the pool's deficit at every point of `grow`
        and is additive over groups (the scheduler subtracts a preempted group's part); blocks also held by
        other groups are never counted as freed (conservative)."""
        return sum(self._group_decode_blocks(g) for g in groups)

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """One step ahead only (the engine never replays decode steps in bulk)."""
        if steps != 1:
            raise InvalidArgumentError("the engine predicts one decode step at a time")
        m = self.metrics()
        arr = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
        free = m.free_blocks - self.decode_blocks(groups)
        return MemoryMetrics(*(arr(v) for v in m[:4]), arr(free * self.block_size), arr(free))

    def swap_blocks(self, group: SequenceGroup) -> int:
        return sum(self.manager.num_held_blocks(s.seq_id) for s in group.seqs if s.num_allocated)

    # ---- operations ---------------------------------------------------------------------------------------

    def admit(self, group: SequenceGroup, num_tokens: int) -> Admission:
        """Allocate the group (see the class docstring); sets each sequence's num_allocated / num_computed and the
        group's prefill_plan. Prefix-cache hits on ready blocks need no prefill."""
        mgr, bs = self.manager, self.block_size
        hit_tokens = 0
        plan = []
        for seq in self._to_allocate(group):
            hits = mgr.allocate(seq.seq_id, seq.token_ids)
            table = mgr.block_table(seq.seq_id)
            ready = 0
            while ready < hits and self.ready[table[ready]]:
                ready += 1
            self.ready[table[hits:]] = False
            seq.num_allocated = len(seq.token_ids)
            seq.num_computed = ready * bs
            hit_tokens += ready * bs
            plan.append((seq, seq.num_allocated - seq.num_computed))
        if not group.started_sampling:
            for child in group.seqs[1:]:
                mgr.fork(group.seqs[0].seq_id, child.seq_id)
                child.num_allocated, child.num_computed = (
                    group.seqs[0].num_allocated,
                    group.seqs[0].num_computed,
                )
        group.prefill_plan = plan
        group.num_cached_tokens += hit_tokens
        self.held[id(group)] = group
        return Admission(sum(n for _, n in plan), hit_tokens)

    def prefill(self, group: SequenceGroup, num_tokens: int) -> None:
        """Nothing to account: the engine marks the computed tokens when it runs the chunk."""

    def grow(self, groups: list, steps: int) -> None:
        """Append each decoding sequence's last sampled token (its K/V slot), copying a shared last block first."""
        if steps != 1:
            raise InvalidArgumentError("the engine grows one decode step at a time")
        for group in groups:
            for seq in group.seqs:
                result = self.manager.append_token(seq.seq_id, seq.token_ids[-1])
                if result.cow is not None:
                    self.cache.copy_blocks([result.cow])
                    self.cow_log.append((group.request_id, seq.seq_id, *result.cow))
                self.ready[result.slot // self.block_size] = False  # a block being written is not full yet
                seq.num_allocated += 1
                seq.pending_slot = result.slot

    def block_tables(self, seqs: list[Sequence]) -> np.ndarray:
        """[len(seqs), max blocks] int32 block tables of the sequences, padded with 0 (at least one column).
        Released sliding-window entries stay -1."""
        tables = [self.manager.block_table(s.seq_id) for s in seqs]
        lengths = np.fromiter(map(len, tables), np.int64, len(tables))
        width = max(int(lengths.max()) if len(tables) else 0, 1)
        array = np.zeros((len(tables), width), dtype=np.int32)
        if len(tables):
            mask = np.arange(width) < lengths[:, None]  # [seqs, width]: the entries each table fills
            array[mask] = np.fromiter((b for t in tables for b in t), np.int32, int(lengths.sum()))
        return array

    def clear_block(self, block: int) -> None:
        """Zero block `block`'s K/V in every layer (after a throwaway write into a block nobody holds)."""
        for keys, values in zip(self.cache.key_cache, self.cache.value_cache, strict=True):
            keys[block].zero_()
            values[block].zero_()

    def slots(self, seq: Sequence, start: int, stop: int) -> np.ndarray:
        """[stop - start] int64 slot ids of the sequence's tokens start .. stop - 1."""
        table = np.asarray(self.manager.block_table(seq.seq_id), dtype=np.int64)
        pos = np.arange(start, stop, dtype=np.int64)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def mark_computed(self, seq: Sequence, stop: int) -> None:
        """The sequence's K/V are now computed for tokens [0, stop): mark its full blocks ready."""
        old = seq.num_computed
        seq.num_computed = stop
        first, last = old // self.block_size, stop // self.block_size
        if last > first:
            blocks = np.asarray(self.manager.block_table(seq.seq_id)[first:last], dtype=np.int64)
            self.ready[blocks[blocks >= 0]] = True  # never a released (-1) entry

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.manager.fork(parent.seq_id, child.seq_id)

    def free_seq(self, seq: Sequence) -> None:
        if seq.num_allocated:
            self.manager.free(seq.seq_id)
        seq.num_allocated = seq.num_computed = 0

    def release(self, group: SequenceGroup) -> int:
        free0 = self.manager.num_free_blocks
        for seq in group.seqs:
            self.free_seq(seq)
        self.held.pop(id(group), None)
        return self.manager.num_free_blocks - free0

    # ---- metrics ------------------------------------------------------------------------------------------

    def live_seqs(self) -> list[Sequence]:
        return [s for g in self.held.values() for s in g.seqs if s.num_allocated]

    def metrics(self) -> MemoryMetrics:
        u = self.usage(self.live_seqs())
        free = self.free_blocks
        return MemoryMetrics(
            u["token_states"], u["reservation"], u["internal_fragmentation"], 0, free * self.block_size, free
        )

    def snapshot(self, groups: list) -> None:
        """The engine snapshots the manager itself (`BlockManager.snapshot`)."""
        return None

    def usage(self, seqs: list[Sequence]) -> dict:
        """Token states, reservation and sharing of the live sequences, in slots or blocks (see STEP_COLUMNS).
        Only held blocks count: a sliding window's released (-1) entries hold nothing; blocks_without_sharing is
        the sum of the blocks each sequence holds."""
        mgr, bs = self.manager, self.block_size
        computed = np.zeros(self.num_blocks, dtype=np.int64)
        allocated = np.zeros(self.num_blocks, dtype=np.int64)
        shared = set()
        unshared = 0
        for seq in seqs:
            table = np.asarray(mgr.block_table(seq.seq_id), dtype=np.int64)
            offsets = np.arange(len(table)) * bs
            held = table >= 0
            table, offsets = table[held], offsets[held]
            np.maximum.at(computed, table, np.clip(seq.num_computed - offsets, 0, bs))
            np.maximum.at(allocated, table, np.clip(seq.num_allocated - offsets, 0, bs))
            unshared += len(table)
            shared.update(b for b in table.tolist() if mgr.ref_count(b) > 1)
        used = self.num_blocks - mgr.num_free_blocks
        token_states = int(computed.sum())
        return {
            "token_states": token_states,
            "reservation": int(allocated.sum()) - token_states,
            "internal_fragmentation": used * bs - int(allocated.sum()),
            "blocks_in_use": used,
            "blocks_without_sharing": unshared,
            "shared_blocks": len(shared),
        }
