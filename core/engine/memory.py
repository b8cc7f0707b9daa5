"""The engine's paged KV memory: a `core.kv.KVCacheManager` (one block table per KV cache group, every group
drawing ids from one pool) and the `KVCache` tensors, driven by the engine's real sequences. Everything the
scheduler asks is the KV core's adapter (`core.kv.scheduler_memory.KVSchedulerMemory`: a step goes
sched -> kv); what stays here is the engine's hook (`EngineKVHook`: copy-on-write in the `KVCache` tensors, its
sequences' counters, sampling's forks and ends) and what the model runner reads (block tables, slots, clearing a
block), which bind the engine's own objects, its sequences and tensors, to the KV core.

Invariants:
- A live sequence `s` is a request of the manager (request id = `s.seq_id`) with room for `s.num_allocated`
  tokens: its prompt (and, after a recompute preemption, its earlier output) from admission, and one more token
  per decode step, appended just before the step computes it. The manager's request owns a copy of the tokens it
  has room for (`allocate` copies the sequence's list; `grow` appends the sequence's next token,
  `seq.token_ids[seq.num_allocated]`; a fork copies the parent's), so both lists hold the same first
  `num_allocated` tokens. The hook copies the manager's counts into `num_allocated` / `num_computed` after
  each change.
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
- Copy-on-write: when `decode_steps` reports `(src, dst)` for a group, the K/V of src are copied into dst
  (every layer's tensor: layers of other groups never read either id) before the new token is written.
"""

import numpy as np

from core.engine.sequence import Sequence, SequenceGroup
from core.errors import InvalidArgumentError
from core.kv import KVCacheManager
from core.kv.hf_config import layer_specs
from core.kv.layout import KVCacheGroup, kv_cache_groups
from core.kv.scheduler_memory import KVHook, KVSchedulerMemory
from core.kv.specs import KVCacheSpec
from core.paging.kv_cache import KVCache


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


class EngineKVHook(KVHook):
    """The engine's `KVHook`: copy-on-write copies into the `KVCache` tensors (and `cow_log`: (request_id,
    seq_id, src_block, dst_block) of each, drained by the engine), the sequences' `num_allocated` /
    `num_computed` kept equal to the manager's counts, each group's `prefill_plan` ((sequence, first token,
    tokens) pieces, for the model runner), and sampling's `kv_changes` handed to the adapter. held: the admitted
    groups, by id."""

    computes_decodes = True  # a real forward pass computes each step before the next grow
    has_kv_changes = True

    def __init__(self, manager: KVCacheManager, cache: KVCache):
        self.manager = manager
        self.cache = cache
        self.cow_log: list[tuple[int, int, int, int]] = []
        self.held: dict[int, SequenceGroup] = {}

    def _sync(self, seqs) -> None:
        kv = self.manager
        for seq in seqs:
            if seq.seq_id in kv:
                seq.num_allocated = kv.num_tokens(seq.seq_id)
                seq.num_computed = kv.num_computed_tokens(seq.seq_id)

    def admitted(self, group: SequenceGroup, num_tokens, pieces, admission) -> None:
        self._sync(group.seqs)
        by_id = {seq.seq_id: seq for seq in group.seqs}
        group.prefill_plan = [(by_id[piece.seq_id], piece.start, piece.count) for piece in pieces]
        group.num_cached_tokens += admission.hit_tokens
        self.held[id(group)] = group

    def prefilled(self, group: SequenceGroup, num_tokens: int) -> None:
        self._sync(group.seqs)

    def copied(self, groups: list, copies: list) -> None:
        self.cache.copy_blocks([copy for _, copy in copies])
        owner = {seq.seq_id: group.request_id for group in groups for seq in group.seqs}
        self.cow_log += [(owner[seq_id], seq_id, *copy) for seq_id, copy in copies]

    def grown(self, groups: list, steps: int) -> None:
        for group in groups:
            for seq in group.seqs:
                seq.num_allocated += steps

    def decoded(self, groups: list, steps: int) -> None:
        for group in groups:
            self._sync(group.seqs)

    def kv_changes(self, group: SequenceGroup) -> list:
        changes = []
        for seq, child in group.kv_changes:
            if child is None:
                changes.append((seq.seq_id, None))
                seq.num_allocated = seq.num_computed = 0
            else:
                changes.append((seq.seq_id, child.seq_id))
        group.kv_changes.clear()
        return changes

    def released(self, group: SequenceGroup) -> None:
        for seq in group.seqs:
            seq.num_allocated = seq.num_computed = 0
        self.held.pop(id(group), None)


class EngineMemory(KVSchedulerMemory):
    """The engine's `core.sched.memory.SchedulerMemory`: the KV core's adapter over `manager` with the engine's
    hook (it overrides none of the adapter's methods), plus what the model runner reads. watermark: fraction of
    the blocks kept free when admitting (vLLM's 0.01). layer_group: per model layer, the index of its KV cache
    group in `manager.groups`.

    A group not yet sampled holds its prompt once: the first sequence is allocated and the others (n parallel
    samples) are forked from it, so they share every prompt block. A group readmitted after a recompute
    preemption shares its prompt's full blocks, each sequence computing its own last prompt block and outputs.
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
        self.engine_hook = EngineKVHook(manager, cache)
        layers = tuple(layer_group.count(g) for g in range(len(manager.groups)))
        super().__init__(manager, watermark, self.engine_hook, layers_per_group=layers)
        self.manager = manager
        self.cache = cache
        self.layer_group = tuple(layer_group)
        self.num_groups = len(manager.groups)

    @property
    def cow_log(self) -> list[tuple[int, int, int, int]]:
        """(request_id, seq_id, src_block, dst_block) of each copy-on-write made by `grow`, drained by the
        engine."""
        return self.engine_hook.cow_log

    @property
    def held(self) -> dict[int, SequenceGroup]:
        """The admitted groups, by id (the hook's)."""
        return self.engine_hook.held

    def live_seqs(self) -> list[Sequence]:
        return [s for g in self.engine_hook.held.values() for s in g.seqs if s.num_allocated]

    def usage(self, seqs: list[Sequence] | None = None) -> dict:
        """Token states, reservation and sharing of the live sequences (every request of the manager: `seqs`,
        when given, are `live_seqs()`), in slots or blocks (see STEP_COLUMNS): the KV core's `slot_usage`."""
        return self.manager.slot_usage()

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
