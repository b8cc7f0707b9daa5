"""Hand-worked examples for BlockManager: every expected number below is worked out in the comment beside it."""

import pytest

from core.errors import (
    DuplicateSequenceError,
    InvalidArgumentError,
    LabError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from core.paging.block_manager import AppendResult, BlockManager


def state(m: BlockManager):
    snap = m.snapshot()
    return (
        m.num_free_blocks,
        snap.ref_count.tolist(),
        snap.free_order.tolist(),
        {s: m.block_table(s) for s in m.seq_ids()},
        {s: m.num_tokens(s) for s in m.seq_ids()},
        m.prefix_cache_stats,
    )


def test_allocate_takes_ceil_blocks():
    m = BlockManager(num_blocks=10, block_size=4)
    assert m.allocate("a", range(9)) == 0  # no caching: no hits
    assert m.block_table("a") == [0, 1, 2]  # ceil(9 / 4) = 3 blocks, free list order 0, 1, 2
    assert m.num_tokens("a") == 9
    assert m.num_free_blocks == 7


def test_append_takes_a_block_only_on_a_boundary():
    m = BlockManager(num_blocks=4, block_size=4)
    m.allocate("a", [1, 2, 3])  # block 0 holds 3 tokens
    assert m.append_token("a", 4) == AppendResult(slot=3, cow=None)  # block 0, offset 3
    assert m.num_free_blocks == 3
    assert m.append_token("a", 5) == AppendResult(slot=4, cow=None)  # new block 1, offset 0
    assert m.block_table("a") == [0, 1]
    assert m.num_free_blocks == 2


def test_fork_shares_blocks_and_copy_on_write_splits_the_last_one():
    m = BlockManager(num_blocks=8, block_size=4)
    m.allocate("p", range(6))  # blocks [0, 1]; block 1 holds 2 tokens
    m.fork("p", "c")
    assert m.block_table("c") == [0, 1]
    assert (m.ref_count(0), m.ref_count(1)) == (2, 2)
    assert m.num_free_blocks == 6  # sharing takes no block

    result = m.append_token("c", 99)  # the shared, half-full block 1 must be copied first
    assert result == AppendResult(slot=2 * 4 + 2, cow=(1, 2))  # block 2 is the next free one
    assert m.block_table("c") == [0, 2]
    assert m.block_table("p") == [0, 1]
    assert (m.ref_count(1), m.ref_count(2)) == (1, 1)
    # the parent now owns block 1 alone: no second copy
    assert m.append_token("p", 7) == AppendResult(slot=1 * 4 + 2, cow=None)


def test_fork_of_a_full_last_block_needs_no_copy():
    m = BlockManager(num_blocks=8, block_size=4)
    m.allocate("p", range(8))  # two full blocks
    m.fork("p", "c")
    assert m.append_token("c", 1) == AppendResult(slot=2 * 4, cow=None)  # new block 2, offset 0


def test_free_returns_blocks_when_the_last_reference_goes():
    m = BlockManager(num_blocks=8, block_size=4)
    m.allocate("p", range(6))
    m.fork("p", "c")
    m.free("p")
    assert m.num_free_blocks == 6  # still held by c
    m.free("c")
    assert m.num_free_blocks == 8
    assert m.snapshot().ref_count.sum() == 0


def test_out_of_blocks_leaves_everything_as_it_was():
    m = BlockManager(num_blocks=3, block_size=4)
    m.allocate("a", range(8))  # 2 blocks, 1 free
    before = state(m)
    with pytest.raises(OutOfBlocksError) as info:
        m.allocate("b", range(5))  # needs 2
    assert (info.value.needed, info.value.free) == (2, 1)
    assert "needs 2 new blocks" in str(info.value)
    assert state(m) == before
    assert "b" not in m.seq_ids()

    m.allocate("b", range(4))  # the last block
    m.fork("b", "b2")
    before = state(m)
    with pytest.raises(OutOfBlocksError):
        m.append_token("b", 9)  # b's block is full: needs a new one
    with pytest.raises(OutOfBlocksError):
        m.append_tokens("a", range(3))
    assert state(m) == before


def test_copy_on_write_with_an_empty_free_list_raises_instead_of_popping():
    m = BlockManager(num_blocks=1, block_size=4)
    m.allocate("p", [1, 2])
    m.fork("p", "c")
    before = state(m)
    with pytest.raises(OutOfBlocksError):
        m.append_token("c", 3)
    assert state(m) == before


def test_unknown_and_duplicate_sequences_raise():
    m = BlockManager(num_blocks=4, block_size=4)
    m.allocate("a", [1])
    for call in (
        lambda: m.append_token("zz", 1),
        lambda: m.free("zz"),
        lambda: m.fork("zz", "y"),
        lambda: m.block_table("zz"),
        lambda: m.num_tokens("zz"),
    ):
        with pytest.raises(UnknownSequenceError, match="unknown sequence 'zz'"):
            call()
    assert m.seq_ids() == ["a"]  # no page table was created on the way
    with pytest.raises(DuplicateSequenceError):
        m.allocate("a", [1])
    with pytest.raises(DuplicateSequenceError):
        m.fork("a", "a")
    assert issubclass(UnknownSequenceError, LabError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_blocks": 0, "block_size": 16}, "num_blocks must be at least 1, got 0"),
        ({"num_blocks": 4, "block_size": 0}, "block_size must be at least 1, got 0"),
        ({"num_blocks": 4.5, "block_size": 16}, "num_blocks"),
        ({"num_blocks": True, "block_size": 16}, "num_blocks"),
    ],
)
def test_invalid_construction(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        BlockManager(**kwargs)


def test_invalid_arguments():
    m = BlockManager(num_blocks=4, block_size=4)
    with pytest.raises(InvalidArgumentError, match="at least 1 token"):
        m.allocate("a", [])
    with pytest.raises(InvalidArgumentError, match="integers"):
        m.allocate("a", ["x"])
    with pytest.raises(InvalidArgumentError):
        m.ref_count(4)
    with pytest.raises(InvalidArgumentError):
        m.can_allocate(0)
    assert m.seq_ids() == []


def test_can_allocate():
    m = BlockManager(num_blocks=4, block_size=16)
    assert m.can_allocate(64)  # 4 blocks
    assert not m.can_allocate(65)  # 5 blocks


# ---- prefix caching ---------------------------------------------------------------------------------------


def test_prefix_cache_reuses_full_blocks_of_the_longest_cached_prefix():
    m = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    system = list(range(100, 108))  # two full blocks of shared prompt
    assert m.allocate("a", [*system, 1, 2]) == 0  # blocks [0, 1, 2]; 0 and 1 get cached
    assert m.allocate("b", [*system, 3]) == 2  # reuses blocks 0 and 1
    assert m.block_table("b") == [0, 1, 3]
    assert (m.ref_count(0), m.ref_count(1)) == (2, 2)
    # a different first block breaks the chain even if the second block's tokens match
    assert m.allocate("c", [9, 9, 9, 9, *system[4:], 5]) == 0
    stats = m.prefix_cache_stats
    assert (stats.queries_tokens, stats.hits_tokens) == (10 + 9 + 9, 8)
    assert (stats.queries_blocks, stats.hits_blocks, stats.misses_blocks) == (3 + 3 + 3, 2, 7)


def test_a_prompt_is_never_served_entirely_from_cache():
    m = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    m.allocate("a", range(8))  # two full, cached blocks 0 and 1
    assert m.allocate("b", range(8)) == 1  # only block 0 is a hit; the last token is recomputed
    assert m.block_table("b") == [0, 2]


def test_freed_cached_blocks_are_revived_and_evicted_lru():
    m = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])  # blocks 0 [1,2], 1 [3,4] cached; 2 partial
    m.allocate("b", [7, 8, 9])  # blocks 3 [7,8] cached; 4 partial
    m.free("a")  # released last to first: 2 -> uncached free; 1, then 0 -> cached free (LRU order 1, 0)
    m.free("b")  # 4 -> uncached; 3 -> cached (LRU order 1, 0, 3)
    assert m.num_free_blocks == 6
    assert m.num_cached_free_blocks == 3
    assert m.snapshot().free_order.tolist() == [5, 2, 4, 1, 0, 3]

    # revival: "c" shares a's first block; block 0 leaves the cached free list without a scan
    assert m.allocate("c", [1, 2, 0]) == 1
    assert m.block_table("c") == [0, 5]  # the uncached block 5 is taken first
    assert m.num_free_blocks == 4

    # 3 new blocks: uncached 2 and 4 first, then evict the least recently freed cached block, 1
    m.allocate("d", [10, 11, 12, 13, 14])
    assert m.block_table("d") == [2, 4, 1]
    assert m.prefix_cache_stats.evictions_blocks == 1
    assert m.prefix_cache_stats.evictions_tokens == 2
    # block 1 no longer serves [3, 4]: a prompt starting [1,2,3,4,...] now hits only block 0
    m.free("d")
    assert m.allocate("e", [1, 2, 3, 4, 5]) == 1


def test_revived_blocks_are_not_counted_as_free_twice():
    m = BlockManager(num_blocks=3, block_size=2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])  # all 3 blocks; 0 and 1 cached
    m.free("a")
    # 3 blocks needed: 2 revived cached + 1 new; the new one must not evict a revived one
    assert m.allocate("b", [1, 2, 3, 4, 6]) == 2
    assert m.block_table("b") == [0, 1, 2]
    with pytest.raises(OutOfBlocksError):
        m.allocate("c", [1, 2, 0])  # 1 hit on block 0 (owned) + 1 new: none free


def test_blocks_filled_by_decode_are_cached_too():
    m = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    m.allocate("a", [1])
    m.append_token("a", 2)  # block 0 becomes full -> cached
    m.append_token("a", 3)
    m.free("a")
    assert m.allocate("b", [1, 2, 3]) == 1


def test_reset_prefix_cache():
    m = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3])
    m.free("a")
    assert m.reset_prefix_cache() == 1
    assert m.num_cached_free_blocks == 0
    assert m.num_free_blocks == 4
    assert m.allocate("b", [1, 2, 3]) == 0


def test_snapshot_describes_every_block():
    m = BlockManager(num_blocks=6, block_size=4)
    m.allocate("a", range(6))  # blocks 0 (4 tokens), 1 (2 tokens)
    m.fork("a", "b")
    m.append_token("b", 1)  # copy-on-write into block 2 (3 tokens)
    snap = m.snapshot()
    assert snap.seq_ids == ("a", "b")
    assert snap.owner.tolist() == [0, 0, 1, -1, -1, -1]
    assert snap.ref_count.tolist() == [2, 1, 1, 0, 0, 0]
    assert snap.fill.tolist() == [4, 2, 3, 0, 0, 0]
    assert snap.is_shared.tolist() == [True, False, False, False, False, False]
    assert snap.is_free.tolist() == [False, False, False, True, True, True]
    assert snap.owners(0) == ["a", "b"]
    assert {s: snap.table(s) for s in snap.seq_ids} == {"a": (0, 1), "b": (0, 2)}
    assert snap.num_free_blocks == 3
    with pytest.raises(ValueError):
        snap.fill[0] = 1  # read-only


def test_numpy_integer_ids_and_sizes_are_accepted():
    import numpy as np

    m = BlockManager(num_blocks=np.int64(4), block_size=np.int32(2))
    m.allocate(np.int64(3), np.arange(3))
    assert m.num_tokens(3) == 3


def test_numpy_integers_are_accepted_and_stats_are_frozen_copies():
    np = pytest.importorskip("numpy")
    m = BlockManager(np.int64(8), np.int32(4), enable_prefix_caching=True)
    assert (m.num_blocks, m.block_size) == (8, 4) and type(m.num_blocks) is int
    assert m.can_allocate(np.int64(32)) and not m.can_allocate(np.int64(33))  # 8 blocks of 4 tokens
    m.allocate("a", range(9))  # 9 query tokens, 3 query blocks, no hit
    before = m.prefix_cache_stats
    m.allocate("b", range(9))  # blocks 0 and 1 hit: 8 hit tokens
    assert (before.queries_tokens, before.hits_tokens) == (9, 0)  # the earlier copy did not move
    after = m.prefix_cache_stats
    assert (after.queries_tokens, after.hits_tokens, after.queries_blocks, after.hits_blocks) == (18, 8, 6, 2)
    assert m.ref_count(np.int64(0)) == 2
    with pytest.raises(AttributeError):
        after.hits_tokens = 0  # frozen


def test_a_hash_collision_is_a_miss_not_a_wrong_hit(monkeypatch):
    import core.paging.block_manager as bm

    monkeypatch.setattr(bm, "_chain_hash", lambda parent, tokens: 7)  # every block collides
    m = BlockManager(8, 4, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])  # block 0 = [1, 2, 3, 4] cached under hash 7
    assert m.allocate("b", [9, 9, 9, 9, 5]) == 0  # same hash, other tokens: a miss
    assert m.block_table("b")[0] != m.block_table("a")[0]
    assert m.prefix_cache_stats.hits_blocks == 0
    assert m.allocate("c", [1, 2, 3, 4, 6]) == 1  # same hash and the same tokens: a true hit
    assert m.block_table("c")[0] == m.block_table("a")[0]


def test_a_hit_also_needs_the_same_parent_hash(monkeypatch):
    import core.paging.block_manager as bm

    # block 1's hash ignores its parent: [0,0,0,0][5,5,5,5] and [1,1,1,1][5,5,5,5] collide on their second block
    monkeypatch.setattr(bm, "_chain_hash", lambda parent, tokens: hash(tokens))
    m = BlockManager(16, 4, enable_prefix_caching=True)
    m.allocate("a", [0, 0, 0, 0, 5, 5, 5, 5, 1])
    m.allocate("b", [1, 1, 1, 1, 5, 5, 5, 5, 1])  # block 0 misses, so block 1 can never hit
    assert m.prefix_cache_stats.hits_blocks == 0
    assert set(m.block_table("a")).isdisjoint(m.block_table("b"))


def test_sliding_window_releases_blocks_behind_the_window():
    m = BlockManager(100, 16, sliding_window=32)
    m.allocate("a", range(100))  # ceil(100 / 16) = 7 blocks, all held: the first token reads position 0
    assert m.num_held_blocks("a") == 7 and m.num_free_blocks == 93
    # token 100 attends to positions 69..100; blocks 0..3 (positions 0..63) lie wholly before 69
    assert m.append_token("a", 0) == AppendResult(slot=6 * 16 + 4, cow=None)
    assert m.block_table("a") == [-1, -1, -1, -1, 4, 5, 6]  # the table keeps its length
    assert m.num_free_blocks == 97 and m.num_held_blocks("a") == 3
    assert [m.ref_count(b) for b in range(7)] == [0, 0, 0, 0, 1, 1, 1]
    # tokens 101..110: their windows start at 70..79, inside block 4 (64..79): nothing more is released
    m.append_tokens("a", [0] * 10)
    assert m.num_held_blocks("a") == 3
    m.extend("a", [0])  # token 111: window 80..111, block 4 goes; no new block (111 is block 6's last slot)
    assert m.block_table("a") == [-1, -1, -1, -1, -1, 5, 6] and m.num_free_blocks == 98
    m.append_token("a", 0)  # token 112 starts block 7: the oldest free block, 7 (released ones queue behind)
    assert m.block_table("a") == [-1, -1, -1, -1, -1, 5, 6, 7] and m.num_free_blocks == 97


def test_sliding_window_fork_shares_what_is_held_and_caching_keeps_hashes():
    m = BlockManager(10, 2, enable_prefix_caching=True, sliding_window=2)
    m.allocate("a", [1, 2, 3, 4, 5])  # blocks 0, 1, 2
    m.append_token("a", 6)  # token 5 sees 4..5: block 0 (0..1) and block 1 (2..3) are released
    assert m.block_table("a") == [-1, -1, 2]
    assert m.num_cached_free_blocks == 2  # both full, both still cached
    m.fork("a", "b")
    assert m.block_table("b") == [-1, -1, 2] and m.ref_count(2) == 2 and m.num_free_blocks == 9
    assert m.allocate("c", [1, 2, 3, 4, 9]) == 2  # the released blocks are revived from the cache
    assert m.block_table("c")[:2] == [0, 1]
    m.free("a")
    m.free("b")
    assert m.ref_count(2) == 0


def test_sliding_window_out_of_blocks_changes_nothing():
    m = BlockManager(3, 2, sliding_window=4)
    m.allocate("a", range(6))  # 3 blocks, the pool is full
    m.fork("a", "b")  # b shares all three
    before = state(m)
    # token 6 of a: window 3..6 releases block 0 (0..1), but b still holds it; a new block is needed: none free
    with pytest.raises(OutOfBlocksError):
        m.append_token("a", 0)
    with pytest.raises(OutOfBlocksError):
        m.extend("a", [0, 0])
    assert state(m) == before
    m.free("b")  # now the release frees block 0 and token 6 can take it
    assert m.append_token("a", 0) == AppendResult(slot=0 * 2 + 0, cow=None)
    assert m.block_table("a") == [-1, 1, 2, 0]


def test_sliding_window_must_be_a_positive_integer():
    with pytest.raises(InvalidArgumentError, match="sliding_window"):
        BlockManager(4, 4, sliding_window=0)
