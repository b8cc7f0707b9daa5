"""The benchmark's baseline, nano-vllm's block manager algorithm re-implemented in `bench/nano_vllm_reference.py`:
a hand-worked example of its allocate / may_append / deallocate, and the decode trace of `bench/nano_vllm_trace.py`
leaving both sides in the same state (so the benchmark times the same work)."""

import pytest

from bench import nano_vllm_trace
from bench.nano_vllm_reference import NanoBlockManager, NanoSequence
from core.kv.block_hash import hash_block_tokens


def test_hand_worked_allocate_may_append_deallocate():
    m = NanoBlockManager(6, 4)
    a = NanoSequence([1, 2, 3, 4, 5], 4)
    m.allocate(a)  # block 0 full (keyed), block 1 partial (no key)
    k0 = hash_block_tokens(None, (1, 2, 3, 4))
    assert a.block_table == [0, 1] and m.hash_to_block_id == {k0: 0}
    b = NanoSequence([1, 2, 3, 4, 9], 4)
    m.allocate(b)  # block 0 is a hit on a used block: one more reference
    assert b.block_table == [0, 2] and b.num_cached_tokens == 4 and m.blocks[0].ref_count == 2
    for token in (6, 7, 8):  # the 8th token fills block 1: it is keyed, chained to block 0
        a.append_token(token)
        assert m.can_append(a)
        m.may_append(a)
    k1 = hash_block_tokens(k0, (5, 6, 7, 8))
    assert m.blocks[1].hash == k1 and m.hash_to_block_id[k1] == 1 and a.block_table == [0, 1]
    a.append_token(10)  # the 9th token starts a block: the leftmost free one
    m.may_append(a)
    assert a.block_table == [0, 1, 3]
    m.deallocate(a)  # last to first; block 0 is still B's
    assert list(m.free_block_ids) == [4, 5, 3, 1] and m.blocks[0].ref_count == 1
    c = NanoSequence([1, 2, 3, 4, 5, 6, 7, 8, 11], 4)
    m.allocate(c)  # block 1 is revived out of the middle of the free deque
    assert c.block_table == [0, 1, 4] and c.num_cached_tokens == 8
    assert list(m.free_block_ids) == [5, 3] and m.used_block_ids == {0, 1, 2, 4}


def test_a_full_pool_cannot_append_a_new_block():
    m = NanoBlockManager(1, 2)
    s = NanoSequence([1, 2], 2)
    m.allocate(s)
    s.append_token(3)
    assert not m.can_append(s)


@pytest.mark.parametrize("block_size", [4, 16, 256])
def test_the_trace_leaves_both_sides_in_the_same_state(block_size):
    prompts = nano_vllm_trace.trace_prompts(8)
    tokens = nano_vllm_trace.trace_tokens(8, 300)
    ours = nano_vllm_trace.ours_trace(block_size, prompts, tokens, check=True)
    nano = nano_vllm_trace.nano_trace(block_size, prompts, tokens, check=True)
    assert ours["state"] == nano["state"]
    tables = [table for table, _ in ours["state"]]
    keys = [key for _, seq_keys in ours["state"] for key in seq_keys]
    shared = nano_vllm_trace.SYSTEM_TOKENS // block_size
    assert all(table[:shared] == tables[0][:shared] for table in tables)  # the system prompt's blocks
    lengths = [len(p) + 300 for p in prompts]
    assert sum(k is not None for k in keys) == sum(n // block_size for n in lengths)  # every full block keyed


def test_the_comparison_reports_every_side():
    result = nano_vllm_trace.compare(16, 4, 40, 3)
    for key in ("ratio_vs_nano_vllm", "ratio_vs_nano_vllm_block_manager_only", "decode_ratio_vs_nano_vllm"):
        assert result[key]["min"] <= result[key]["median"] <= result[key]["max"]
        assert result[key]["min"] > 0
    assert result["trace"] == {"block_size": 16, "num_seqs": 4, "decode_steps": 40, "repeats": 3}
