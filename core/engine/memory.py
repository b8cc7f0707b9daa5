"""The engine's paged KV memory: a `core.kv.KVCacheManager` (one block table per KV cache group, every group
drawing ids from one pool) and the `KVCache` tensors, driven by the engine's real sequences. It stays in the
engine (not `core.kv`) because it binds the engine's own objects, its sequences and tensors, to the KV core: the
pool, the tables and the snapshot are `core.kv`'s.

Invariants:
- A live sequence `s` is a request of the manager (request id = `s.seq_id`) with room for `s.num_allocated`
  tokens: its prompt (and, after a recompute preemption, its earlier output) from admission, and one more token
  per decode step, appended just before the step computes it. The manager's request owns a copy of the tokens it
  has room for (`allocate` copies the sequence's list; `grow` appends the sequence's next token,
  `seq.token_ids[seq.num_allocated]`; a fork copies the parent's), so both lists hold the same first
  `num_allocated` tokens.
- Caching on compute: `mark_computed(s, stop)` tells the manager the K/V of tokens [0, stop) are written; only
  then do their full blocks enter the prefix cache, so a prefix-cache hit is always computed K/V (what a
  `ready[]` bitmap once guarded). The manager's computed count equals `s.num_computed`.
- Layers and groups: layer l belongs to KV cache group `layer_group[l]` (`core.kv.layout.kv_cache_groups`
  over the model's layer specs: one group when every layer is alike, e.g. one full-attention group, or one
  sliding-window group for Mistral-7B-v0.1; a full group and window groups for Gemma-2 style `layer_types` or
  Qwen2's `max_window_layers`). Every layer's K/V tensor spans the whole pool ([num_blocks, block_size,
  kv_heads, head_dim]); block ids are unique across groups, so layer l only ever touches the ids of its group's
  tables. Tables and slots are built per group: `block_tables` -> [G, seqs, width], `slots` -> [G, tokens].
  (vLLM lays the groups' layers over shared tensors, so a block costs one group's layers; here a block costs
  every layer: simpler, and G times the bytes per block for G equal groups.)
- Sliding window W (a window group): once c tokens are computed the manager releases the blocks wholly before
  position c - W + 1 (the first one the next token reads); their table entries become -1 (a prefix of the
  table). No query of a later step can see those positions, so the windowed kernels never read them.
- Copy-on-write: when `append_token` reports `(src, dst)` for a group, the K/V of src are copied into dst
  (every layer's tensor: layers of other groups never read either id) before the new token is written.
"""

import numpy as np

from core.engine.sequence import Sequence, SequenceGroup
from core.errors import InvalidArgumentError
from core.kv import KVCacheManager, KVCacheSnapshot
from core.kv.hf_config import layer_specs
from core.kv.layout import KVCacheGroup, kv_cache_groups
from core.kv.specs import KVCacheSpec
from core.paging.kv_cache import KVCache
from core.sched.memory import Admission, MemoryMetrics


def kv_groups_of(
    config, block_size: int, kv_dtype
) -> tuple[list[KVCacheSpec], tuple[KVCacheGroup, ...], tuple[int, ...]]:
    """(one KV cache spec per layer, the KV cache groups, per layer the index of its group) of the model of
    `config` (a `ModelConfig`, read by `core.kv.hf_config.layer_specs`): one group when every layer is alike."""
    specs = layer_specs(config, block_size=block_size, kv_dtype=kv_dtype)
    groups, _ = kv_cache_groups(specs)
    layer_group = [0] * len(specs)
    for index, group in enumerate(groups):
        for layer in group.layers:
            layer_group[layer] = index
    return specs, groups, tuple(layer_group)


class EngineMemory:
    """The engine's `core.sched.memory.SchedulerMemory`: the serving scheduler admits, grows and releases
    the engine's real groups through it. watermark: fraction of the blocks kept free when admitting (vLLM's 0.01).
    layer_group: per model layer, the index of its KV cache group in `manager.groups`.

    A group not yet sampled (`started_sampling` False) holds its prompt once: the first sequence is allocated and
    the others (n parallel samples) are forked from it, so they share every prompt block. A group readmitted after
    a recompute preemption allocates each sequence's own tokens (prefix caching may share them again).
    cow_log: (request_id, seq_id, src_block, dst_block) of each copy-on-write made by `grow`, drained by the engine.
    """

    def __init__(
        self, manager: KVCacheManager, cache: KVCache, layer_group: tuple[int, ...], watermark: float = 0.01
    ):
        sizes = {spec.block_size for spec in manager.groups}
        if sizes != {cache.block_size} or manager.num_blocks != cache.num_blocks:
            raise InvalidArgumentError(
                f"the manager's groups (block sizes {sorted(sizes)}, {manager.num_blocks} blocks) and the cache "
                f"({cache.block_size} tokens x {cache.num_blocks} blocks) must have one geometry"
            )
        if len(layer_group) != cache.num_layers or not set(layer_group) <= set(range(len(manager.groups))):
            raise InvalidArgumentError(
                f"layer_group must name one of the {len(manager.groups)} groups for each of the "
                f"{cache.num_layers} layers, got {list(layer_group)}"
            )
        self.manager = manager
        self.cache = cache
        self.layer_group = tuple(layer_group)
        self.num_groups = len(manager.groups)
        self.block_size = cache.block_size
        self.num_blocks = manager.num_blocks
        self.capacity = self.num_blocks * self.block_size
        self.watermark = watermark
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.held: dict[int, SequenceGroup] = {}
        self.cow_log: list[tuple[int, int, int, int]] = []
        self._grown: list[Sequence] = []  # the sequences `grow` gave this step's token, marked by `decoded`

    # ---- sizing -------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def _to_allocate(self, group: SequenceGroup) -> list[Sequence]:
        return group.seqs if group.started_sampling else group.seqs[:1]

    def admission_blocks(self, group: SequenceGroup) -> int:
        """Blocks admitting the group takes at most, over all KV cache groups (prefix-cache hits not counted)."""
        return sum(self.manager.blocks_needed(len(s.token_ids)) for s in self._to_allocate(group))

    def peak_blocks_per_seq(self, prompt_len: int, max_output_len: int) -> int:
        """The most blocks one sequence holds at any time, summed over the KV cache groups: the KV core's
        `max_blocks_held` (a full group: ceil((prompt + outputs) / block_size); a window group W holds the whole
        prompt until it is computed, then at most ceil((W + block_size - 1) / block_size))."""
        return self.manager.max_blocks_held(prompt_len, prompt_len + max_output_len)

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

    def decode_blocks(self, groups: list) -> int:
        """New blocks one decode step of the groups takes from the pool, at most: in every KV cache group, a block
        for each sequence whose last block is full, and a copy for each sequence but the last holder (in `grow`'s
        order) of a shared, partially filled last block. Additive over groups (the scheduler subtracts a
        preempted group's part)."""
        return self.manager.num_blocks_for_decode(s.seq_id for g in groups for s in g.seqs)

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """One step ahead only (the engine never replays decode steps in bulk)."""
        if steps != 1:
            raise InvalidArgumentError("the engine predicts one decode step at a time")
        m = self.metrics()
        arr = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
        free = m.free_blocks - self.decode_blocks(groups)
        return MemoryMetrics(*(arr(v) for v in m[:4]), arr(free * self.block_size), arr(free))

    def swap_blocks(self, group: SequenceGroup) -> int:
        return sum(sum(self.manager.num_held_blocks(s.seq_id)) for s in group.seqs if s.num_allocated)

    # ---- operations ---------------------------------------------------------------------------------------

    def admit(self, group: SequenceGroup, num_tokens: int) -> Admission:
        """Allocate the group (see the class docstring); sets each sequence's num_allocated / num_computed and the
        group's prefill_plan. Prefix-cache hits are computed K/V (cached only once computed): no prefill."""
        mgr = self.manager
        hit_tokens = 0
        plan = []
        for seq in self._to_allocate(group):
            hits = mgr.allocate(seq.seq_id, seq.token_ids, trusted=True)  # checked at the engine's edge
            seq.num_allocated = len(seq.token_ids)
            seq.num_computed = hits
            hit_tokens += hits
            plan.append((seq, seq.num_allocated - seq.num_computed))
        if not group.started_sampling:
            first = group.seqs[0]
            for child in group.seqs[1:]:
                mgr.fork(first.seq_id, child.seq_id)
                child.num_allocated, child.num_computed = first.num_allocated, first.num_computed
        group.prefill_plan = plan
        group.prefill_owners = [] if group.started_sampling else list(group.seqs)
        group.num_cached_tokens += hit_tokens
        self.held[id(group)] = group
        return Admission(sum(n for _, n in plan), hit_tokens)

    def prefill(self, group: SequenceGroup, num_tokens: int) -> None:
        """The chunk ending `num_tokens` before the group's prefill point (the scheduler already lowered
        `num_prefill_tokens`) ran: mark each planned sequence's part of it computed (every fork sharing the
        prompt, before sampling started), then, when the prefill ended, apply the sampler's `kv_changes`."""
        done = group.num_prefill_total - group.num_prefill_tokens
        offset = 0
        for seq, todo in group.prefill_plan:
            upto = min(max(done - offset, 0), todo)
            stop = seq.num_allocated - todo + upto
            for owner in group.prefill_owners or [seq]:
                if owner.num_allocated and stop > owner.num_computed:
                    self.mark_computed(owner, stop)
            offset += todo
        if group.num_prefill_tokens == 0:
            self._apply_changes(group)

    def decoded(self, groups: list, steps: int) -> None:
        """The step ran: every sequence `grow` gave a token has its K/V computed (the manager caches newly full
        blocks, windows release what no later token reads); then the sampler's `kv_changes` of the groups
        apply (forks share the computed blocks, ended sequences free theirs)."""
        for seq in self._grown:
            self.mark_computed(seq, seq.num_allocated)
        self._grown = []
        for group in groups:
            self._apply_changes(group)

    def _apply_changes(self, group: SequenceGroup) -> None:
        for seq, child in group.kv_changes:
            if child is None:
                self.free_seq(seq)
            else:
                self.manager.fork(seq.seq_id, child.seq_id)
        group.kv_changes.clear()

    def grow(self, groups: list, steps: int) -> None:
        """Append each decoding sequence's last sampled token (its K/V slot in every KV cache group), copying a
        shared last block first."""
        if steps != 1:
            raise InvalidArgumentError("the engine grows one decode step at a time")
        for group in groups:
            for seq in group.seqs:
                token = seq.token_ids[seq.num_allocated]  # its last sampled token
                cows = [
                    c for c in self.manager.append_token(seq.seq_id, token, trusted=True) if c is not None
                ]
                if cows:
                    self.cache.copy_blocks(cows)
                    self.cow_log += [(group.request_id, seq.seq_id, *cow) for cow in cows]
                seq.num_allocated += 1
                self._grown.append(seq)

    def block_tables(self, seqs: list[Sequence]) -> np.ndarray:
        """[num_groups, len(seqs), max blocks] int32 block tables of the sequences, one per KV cache group,
        padded with 0 (at least one column). Entries a window group released stay -1."""
        tables = [self.manager.block_ids(s.seq_id) for s in seqs]  # per seq: one list per group
        width = max([1, *(len(t) for per_seq in tables for t in per_seq)])
        array = np.zeros((self.num_groups, len(seqs), width), dtype=np.int32)
        for row, per_seq in enumerate(tables):
            for g, table in enumerate(per_seq):
                array[g, row, : len(table)] = table
        return array

    def clear_block(self, block: int) -> None:
        """Zero block `block`'s K/V in every layer (after a throwaway write into a block nobody holds)."""
        for keys, values in zip(self.cache.key_cache, self.cache.value_cache, strict=True):
            keys[block].zero_()
            values[block].zero_()

    def slots(self, seq: Sequence, start: int, stop: int) -> np.ndarray:
        """[num_groups, stop - start] int64 slot ids of the sequence's tokens start .. stop - 1, per group (the
        tokens' blocks are held: never a released entry)."""
        pos = np.arange(start, stop, dtype=np.int64)
        out = np.empty((self.num_groups, stop - start), dtype=np.int64)
        for g, table in enumerate(self.manager.block_ids(seq.seq_id)):
            out[g] = np.asarray(table, dtype=np.int64)[pos // self.block_size] * self.block_size
        return out + pos % self.block_size

    def mark_computed(self, seq: Sequence, stop: int) -> None:
        """The sequence's K/V are now computed for tokens [0, stop): the manager caches its newly full blocks
        (with prefix caching) and window groups release what no later token reads."""
        self.manager.mark_computed(seq.seq_id, stop)
        seq.num_computed = stop

    def free_seq(self, seq: Sequence) -> None:
        if seq.num_allocated:
            self.manager.free(seq.seq_id)
        seq.num_allocated = seq.num_computed = 0

    def release(self, group: SequenceGroup) -> int:
        free0 = self.manager.num_free_blocks
        for seq, child in group.kv_changes:  # changes sampling decided but no step applied (an abort)
            if child is None:
                self.free_seq(seq)
            else:
                child.num_allocated = child.num_computed = 0  # never forked in the manager
        group.kv_changes.clear()
        for seq in group.seqs:
            self.free_seq(seq)
        self._grown = [s for s in self._grown if s.num_allocated]
        self.held.pop(id(group), None)
        return self.manager.num_free_blocks - free0

    # ---- metrics and snapshots ----------------------------------------------------------------------------

    def live_seqs(self) -> list[Sequence]:
        return [s for g in self.held.values() for s in g.seqs if s.num_allocated]

    def metrics(self) -> MemoryMetrics:
        u = self.usage(self.live_seqs())
        free = self.free_blocks
        return MemoryMetrics(
            u["token_states"], u["reservation"], u["internal_fragmentation"], 0, free * self.block_size, free
        )

    def snapshot(self, groups: list) -> KVCacheSnapshot:
        """The whole pool (every live sequence, whichever group it belongs to): the manager's snapshot."""
        return self.manager.snapshot()

    def usage(self, seqs: list[Sequence] | None = None) -> dict:
        """Token states, reservation and sharing of the live sequences (every request of the manager: `seqs`,
        when given, are `live_seqs()`), in slots or blocks (see STEP_COLUMNS): the KV core's `slot_usage`."""
        return self.manager.slot_usage()
