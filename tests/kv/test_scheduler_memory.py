"""The one adapter between the scheduler and the KV core (`core.kv.scheduler_memory.KVSchedulerMemory`, issue 37):
the engine's and the simulator's memories are it (configured, nothing overridden); its k-step decode prediction
equals running the steps; a readmitted group of several sequences shares its prompt's full blocks (worked by
hand); the counted policy answers the same prediction and the same fits formula."""

import random

import numpy as np
import pytest

from core.engine.memory import EngineMemory
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.scheduler_memory import KVSchedulerMemory, PrefillPiece, fits_blocks, pending_done
from core.kv.single_type_manager import rule_of
from core.kv.specs import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec
from core.sched.memory import SchedulerMemory
from core.serving.counted_memory import CountedPagedMemory
from core.serving.paged_memory import PagedMemory

PROTOCOL = [name for name in dir(SchedulerMemory) if not name.startswith("_") and name != "block_size"] + [
    "check_fits",
    "decode_metrics",
    "snapshot",
]


def test_the_engine_and_the_simulator_drive_one_adapter():
    """Every method the scheduler (and a run) asks is `KVSchedulerMemory`'s own: neither memory overrides one."""
    assert {"admit", "prefill", "grow", "decoded", "release", "can_admit", "decode_blocks"} <= set(PROTOCOL)
    for memory in (PagedMemory, EngineMemory):
        assert issubclass(memory, KVSchedulerMemory)
        for name in PROTOCOL:
            assert getattr(memory, name) is getattr(KVSchedulerMemory, name), (memory.__name__, name)


class _Group:
    """A scheduler group of `n` sequences sharing `prompt` (its own outputs `outputs[i]`), as the simulator's."""

    def __init__(self, gid: int, prompt: list[int], n: int, rnd: random.Random):
        self.request_id = gid
        self.seq_ids = [gid * 100 + k for k in range(n)]
        self.num_seqs = n
        self.prompt_len = len(prompt)
        self._tokens = [list(prompt) + [rnd.randrange(50) for _ in range(200)] for _ in range(n)]
        self.length = self.num_prefill_tokens = self.num_prefill_total = self.num_output_tokens = 0
        self.num_preemptions = 0

    def token_ids(self, index: int, start: int, stop: int) -> list[int]:
        return self._tokens[index][start:stop]

    def is_finished(self) -> bool:
        return False


def _admit_and_prefill(memory: KVSchedulerMemory, group: _Group, num_tokens: int) -> None:
    admission = memory.admit(group, num_tokens)
    group.num_prefill_total = group.num_prefill_tokens = admission.num_prefill_tokens
    group.length = num_tokens
    group.num_prefill_tokens = 0
    memory.prefill(group, admission.num_prefill_tokens)


@pytest.mark.parametrize("seed", range(40))
def test_the_k_step_prediction_is_what_running_the_steps_frees(seed):
    """`num_free_blocks_after_decode` (through `decode_metrics`) against a copy of the pool that runs the steps
    one by one: windows, chunks, forks sharing a written last block, prefix caching."""
    rnd = random.Random(seed)
    bs = 4
    specs = [
        FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1),
        SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=1, sliding_window=rnd.choice([3, 6, 9])),
        ChunkedLocalAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, attention_chunk_size=8),
    ][: rnd.choice([1, 2, 3])]
    caching = seed % 2 == 0

    def build():
        kv = KVCacheManager(specs, 400, enable_prefix_caching=caching)
        memory = KVSchedulerMemory(kv, 0.0)
        groups = []
        local = random.Random(seed)
        shared = [local.randrange(50) for _ in range(12)]
        for gid in range(4):
            prompt = shared[: local.randrange(0, 12)] + [
                local.randrange(50) for _ in range(local.randrange(1, 15))
            ]
            group = _Group(gid, prompt, local.choice([1, 1, 2, 3]), local)
            _admit_and_prefill(memory, group, len(prompt))
            groups.append(group)
        return memory, groups

    memory, groups = build()
    steps = rnd.randrange(1, 30)
    predicted = memory.decode_metrics(groups, steps).free_blocks
    assert (
        predicted.tolist()
        == memory.kv.num_free_blocks_after_decode([g.seq_ids for g in groups], steps).tolist()
    )
    replay, replay_groups = build()
    for step in range(steps):
        replay.grow(replay_groups, 1)
        for group in replay_groups:
            group.length += 1
        assert replay.free_blocks == predicted[step], (seed, step)


def test_a_readmitted_group_shares_its_prompts_full_blocks():
    """Worked by hand: block size 4, a 6-token prompt, 2 sequences readmitted with 2 outputs each (8 tokens):
    the first 4 prompt tokens are one shared block, each sequence then holds its own block for tokens 4..7
    (prompt tail + outputs): 3 blocks, 4 + 4 + 4 tokens to prefill, nothing copied."""
    kv = KVCacheManager([FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)], 10)
    memory = KVSchedulerMemory(kv, 0.0)
    group = _Group(1, [5, 6, 7, 8, 9, 10], 2, random.Random(0))
    assert (
        memory.admission_blocks(group, 8) == 3
        and memory.can_admit(group, 8, 7)
        and not memory.can_admit(group, 8, 8)
    )
    admission = memory.admit(group, 8)
    assert admission.num_prefill_tokens == 12 and kv.num_free_blocks == 7
    assert memory._pieces[group] == [
        PrefillPiece(100, 0, 4, (100, 101)),
        PrefillPiece(100, 4, 4, (100,)),
        PrefillPiece(101, 4, 4, (101,)),
    ]
    t0, t1 = kv.block_ids(100)[0], kv.block_ids(101)[0]
    assert t0[0] == t1[0] and t0[1] != t1[1]
    group.num_prefill_total, group.num_prefill_tokens = 12, 6  # the first chunk (6 tokens) ran
    memory.prefill(group, 6)
    assert [kv.num_computed_tokens(s) for s in group.seq_ids] == [6, 4]
    assert memory.release(group) == 3 and kv.num_free_blocks == 10


def test_admission_counts_prefix_hits_as_vllm_v1_does():
    """Worked by hand: block size 4, 6 blocks, prefix caching. A (12 tokens, 3 blocks) is admitted and computed:
    its 3 full blocks are cached and held. B = A's 12 tokens + 4 of its own (16 tokens) hits A's 3 blocks (the
    last token is never a hit: 15 // 4 = 3) and needs 1 new block: `num_blocks_to_admit` 1 against
    `blocks_needed` 4. With 2 blocks taken by C, 1 is free: the no-hit count (4) would refuse B, vLLM's (1) admits
    it. Once A is freed its 3 blocks are evictable: reviving them takes them off the free queue, so B costs 1 + 3
    = 4 and is refused with 3 free. The count changes nothing (free blocks, cached blocks the same after)."""
    kv = KVCacheManager(
        [FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)], 6, enable_prefix_caching=True
    )
    memory = KVSchedulerMemory(kv, 0.0)
    rnd = random.Random(0)
    a = _Group(1, list(range(1, 13)), 1, rnd)
    _admit_and_prefill(memory, a, 12)
    c = _Group(3, [90, 91, 92, 93, 94, 95, 96, 97], 1, rnd)
    _admit_and_prefill(memory, c, 8)
    b = _Group(2, [*range(1, 13), 40, 41, 42, 43], 1, rnd)
    assert kv.num_free_blocks == 1
    assert kv.blocks_needed(16) == memory.admission_blocks(b, 16) == 4
    assert kv.num_blocks_to_admit(b.token_ids(0, 0, 16)) == 1
    assert kv.num_free_blocks == 1 and kv.pool.num_cached_blocks == 5
    assert memory.can_admit(b, 16, 0) and not memory.can_admit(b, 16, 1)
    memory.release(a)
    assert kv.num_free_blocks == 4 and kv.num_blocks_to_admit(b.token_ids(0, 0, 16)) == 4
    assert memory.can_admit(b, 16, 0) and not memory.can_admit(b, 16, 1)
    assert memory.admit(b, 16).num_prefill_tokens == 4 and kv.num_free_blocks == 0


def test_the_counted_policy_answers_the_same_prediction():
    """One full group, one sequence per request, no caching: the counted policy's k-step prediction and fits
    bound equal the block tables' (the same scheduler decisions follow, tests/serving/test_counted_memory.py)."""
    rnd = random.Random(3)
    kv = KVCacheManager([FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1)], 300)
    paged = KVSchedulerMemory(kv, 0.0)
    counted = CountedPagedMemory(16, 300 * 16, 0.0)
    groups = []
    for gid in range(6):
        prompt = [rnd.randrange(9) for _ in range(rnd.randrange(1, 90))]
        for memory in (paged, counted):
            group = _Group(gid, prompt, 1, random.Random(gid))
            _admit_and_prefill(memory, group, len(prompt))
        groups.append(group)
    assert (
        counted.num_free_blocks_after_decode(groups, 50).tolist()
        == paged.decode_metrics(groups, 50).free_blocks.tolist()
    )
    rule = rule_of(FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1))
    for prompt, out in [(1, 1), (16, 1), (17, 16), (100, 300)]:
        assert fits_blocks([rule], prompt, out, 1) == (-(-prompt // 16), -(-(prompt + out - 1) // 16))
        assert paged.peak_blocks(prompt, out) == fits_blocks([rule], prompt, out, 1)[1]


def test_the_pending_slots_formula():
    class G:
        num_prefill_tokens, num_prefill_total = 5, 20

    assert pending_done(40, 40, G, 5) == 10  # a quarter of the prefill: a quarter of the slots
    assert pending_done(40, 3, G, 5) == 3  # never more than are left
    G.num_prefill_tokens = 0
    assert pending_done(40, 17, G, 1) == 17  # the prefill ended: all that are left


def test_fits_is_brute_force_for_windows_and_forks():
    """`fits_blocks`' peak against the most blocks the pool actually holds while a lone group grows."""
    for window in (None, 3, 8):
        kind = (
            FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)
            if window is None
            else SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=1, sliding_window=window)
        )
        for prompt in (1, 4, 6, 13):
            for n in (1, 2, 3):
                for out in (1, 2, 9):
                    kv = KVCacheManager([kind], 200)
                    memory = KVSchedulerMemory(kv, 0.0)
                    group = _Group(0, list(range(prompt)), n, random.Random(1))
                    _admit_and_prefill(memory, group, prompt)
                    most = 200 - kv.num_free_blocks
                    for _ in range(out - 1):  # the last output token is sampled, never stored
                        memory.grow([group], 1)
                        group.length += 1
                        most = max(most, 200 - kv.num_free_blocks)
                    admit, peak = fits_blocks(kv.managers, prompt, out, n)
                    assert admit == -(-prompt // 4)
                    assert most <= peak, (window, prompt, n, out)
                    if window is None:
                        assert most == peak, (prompt, n, out)


def test_num_keys_read_is_the_mean_over_layers_of_each_groups_window_rule():
    """Worked by hand: two full-attention layers and one window-4 layer; a decode whose context is 9 tokens reads
    9, 9 and 3 earlier keys (a window of 4 includes the query itself): (9 + 9 + 3) // 3 = 7; a chunk starting at
    position 6 reads 6, 6 and 3 keys before itself: 5. One full layer alone reads every start."""
    specs = [
        FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1),
        SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=1, sliding_window=4),
    ]
    memory = KVSchedulerMemory(KVCacheManager(specs, 10), 0.0, layers_per_group=(2, 1))
    assert memory.windowed
    assert memory.num_keys_read(np.array([9])) == 7
    assert memory.num_keys_read(np.array([6])) == 5
    assert memory.num_keys_read(np.array([[9], [6]])).tolist() == [7, 5]
    full = KVSchedulerMemory(KVCacheManager(specs[:1], 10), 0.0)
    assert not full.windowed and full.num_keys_read(np.array([9, 6])) == 15
