"""The benchmark's baseline is nano-vllm's own block manager (`bench/nano_vllm_source.py`): the pinned copy is
upstream's bytes, it loads without touching `sys.modules`, the bench drives it as nano-vllm's scheduler does (a
hand-worked example), and the decode trace of `bench/nano_vllm_trace.py` leaves both sides in the same state (so
the benchmark times the same work)."""

import shutil
import sys

import pytest

from bench import nano_vllm_source, nano_vllm_trace


def test_git_blob_id_is_gits():
    # `git hash-object` of an empty file and of "hello\n", as git prints them
    assert nano_vllm_source.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert nano_vllm_source.git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_the_pinned_copy_is_upstreams_bytes_with_its_licence():
    for path, blob in nano_vllm_source.UPSTREAM_BLOBS.items():
        assert nano_vllm_source.git_blob_id((nano_vllm_source.VENDORED / path).read_bytes()) == blob, path
    licence = (nano_vllm_source.VENDORED / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "Copyright (c) 2025 Xingkai Yu" in licence


def test_loading_leaves_sys_modules_as_it_was():
    before = {name for name in sys.modules if name.split(".")[0] in ("nanovllm", "xxhash")}
    nano = nano_vllm_source.load()
    after = {name for name in sys.modules if name.split(".")[0] in ("nanovllm", "xxhash")}
    assert before == after
    assert nano.BlockManager.__module__ == "nanovllm.engine.block_manager"
    assert nano.source.startswith("vendored GeeeekExplorer/nano-vllm@bb823b3")


def test_a_checkout_named_by_the_environment_is_loaded(tmp_path, monkeypatch):
    shutil.copytree(nano_vllm_source.VENDORED, tmp_path / "nano-vllm")
    monkeypatch.setenv(nano_vllm_source.ENV_VAR, str(tmp_path / "nano-vllm"))
    nano = nano_vllm_source.load()
    assert nano.source == str(tmp_path / "nano-vllm")
    (tmp_path / "nano-vllm" / "nanovllm" / "engine" / "sequence.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"sequence\.py"):
        nano_vllm_source.load()


def test_the_stand_in_hash_has_xxh64s_calls():
    def digest(*parts):
        h = nano_vllm_source.XXH64StandIn()
        for part in parts:
            h.update(part)
        return h.intdigest()

    assert digest(b"ab", b"cd") == digest(b"abcd") != digest(b"abce")
    assert 0 <= digest(b"x" * 2048) < 2**64


def test_hand_worked_admit_decode_free_through_nano_vllms_own_code():
    nano = nano_vllm_source.load()
    nano.Sequence.block_size = 4
    m = nano.BlockManager(6, 4)
    a, hits = nano_vllm_trace.nano_admit(nano, m, [1, 2, 3, 4, 5])
    assert hits == 0 and a.block_table == [0, 1] and a.num_cached_tokens == 5
    assert m.blocks[0].hash != -1 and m.blocks[1].hash == -1  # the prefill keyed its one full block
    b, hits = nano_vllm_trace.nano_admit(nano, m, [1, 2, 3, 4, 9])
    assert hits == 1 and b.block_table == [0, 2] and m.blocks[0].ref_count == 2
    nano_vllm_trace._nano_steps(m, [a], [[6], [7], [8]])  # the 8th token fills block 1: keyed
    assert a.block_table == [0, 1] and m.blocks[1].hash != -1 and m.hash_to_block_id[m.blocks[1].hash] == 1
    nano_vllm_trace._nano_steps(m, [a], [[10]])  # the 9th starts a block: the leftmost free one
    assert a.block_table == [0, 1, 3] and a.num_cached_tokens == 9
    m.deallocate(a)  # last to first; block 0 is still b's
    assert list(m.free_block_ids) == [4, 5, 3, 1] and m.blocks[0].ref_count == 1
    c, hits = nano_vllm_trace.nano_admit(nano, m, [1, 2, 3, 4, 5, 6, 7, 8, 11])
    assert hits == 2 and c.block_table == [0, 1, 4]  # block 1 revived out of the middle of the free deque
    assert list(m.free_block_ids) == [5, 3]


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


def test_the_state_check_sees_a_difference():
    """Not vacuous: one key renamed apart, or one block moved, and the states differ."""
    same = nano_vllm_trace._state([[0, 1], [0, 2]], [[10, None], [10, None]])
    assert same == nano_vllm_trace._state([[0, 1], [0, 2]], [[77, None], [77, None]])
    assert same != nano_vllm_trace._state([[0, 1], [0, 2]], [[10, None], [11, None]])
    assert same != nano_vllm_trace._state([[0, 1], [0, 3]], [[10, None], [10, None]])


def test_the_comparison_reports_every_side():
    result = nano_vllm_trace.compare(16, 4, 40, 3)
    for key in ("ratio_vs_nano_vllm", "ratio_vs_nano_vllm_block_manager_only", "decode_ratio_vs_nano_vllm"):
        assert result[key]["min"] <= result[key]["median"] <= result[key]["max"]
        assert result[key]["min"] > 0
    assert result["trace"] == {"block_size": 16, "num_seqs": 4, "decode_steps": 40, "repeats": 3}
