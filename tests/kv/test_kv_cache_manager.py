"""KVCacheManager on hand-worked examples: which table entries a window or chunk releases, when blocks enter the
prefix cache, how many prompt tokens a hit serves, fork with copy-on-write, Mamba's one state block, events."""

import pickle

import pytest

from core.errors import (
    DuplicateSequenceError,
    InvalidArgumentError,
    KVEventDecodeError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from core.kv import KVCacheManager
from core.kv.events import BlockRemoved, BlockStored
from core.kv.specs import ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec, SlidingWindowSpec


def full(bs=4):
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8)


def window(w, bs=4):
    return SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, sliding_window=w)


def chunked(c, bs=4):
    return ChunkedLocalAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, attention_chunk_size=c)


def h(parent, tokens):
    return hash((parent, tuple(tokens)))


@pytest.mark.parametrize(
    ("computed", "released"),
    # window 6, block 4: after c computed tokens the next token (position c) reads c-5 .. c, so block i
    # (positions 4i .. 4i+3) is released once 4i + 3 < c - 5, i.e. i < (c - 5) // 4
    [(0, 0), (5, 0), (8, 0), (9, 1), (12, 1), (13, 2), (16, 2), (17, 3)],
)
def test_sliding_window_6_block_4_releases(computed, released):
    m = KVCacheManager([window(6)], 10)
    m.allocate("r", list(range(17)))  # 5 blocks, held whole until computed
    assert m.block_ids("r")[0] == [0, 1, 2, 3, 4]
    m.mark_computed("r", computed)
    assert m.block_ids("r")[0] == [-1] * released + [0, 1, 2, 3, 4][released:]
    assert m.num_free_blocks == 5 + released and m.num_held_blocks("r") == (5 - released,)


@pytest.mark.parametrize(
    ("computed", "released"),
    # chunk 8, block 4: the next token (position c) reads its own chunk from 8 * (c // 8)
    [(0, 0), (7, 0), (8, 2), (15, 2), (16, 4), (17, 4)],
)
def test_chunked_local_8_block_4_releases(computed, released):
    m = KVCacheManager([chunked(8)], 5)
    m.allocate("r", list(range(18)))
    m.mark_computed("r", computed)
    assert m.block_ids("r")[0] == [-1] * released + [0, 1, 2, 3, 4][released:]


def test_window_releases_follow_decode_tokens_and_free_their_blocks():
    m = KVCacheManager([full(), window(6)], 8)
    m.allocate("r", [1, 2, 3, 4, 5, 6, 7, 8])  # 2 + 2 blocks
    m.mark_computed("r", 8)
    assert m.block_ids("r") == ([0, 1], [2, 3])
    assert m.append_token("r", 9) == (None, None)  # position 8 starts a new block in both groups
    assert m.block_ids("r") == ([0, 1, 4], [2, 3, 5])
    m.mark_computed("r", 9)  # the next token (position 9) reads 4..9: block 0 of the window group goes
    assert m.block_ids("r") == ([0, 1, 4], [-1, 3, 5])
    assert m.num_free_blocks == 3 and m.usage == pytest.approx(5 / 8)


def test_nothing_is_served_from_the_cache_before_it_is_computed():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    m = KVCacheManager([full()], 20, enable_prefix_caching=True)
    assert m.allocate("a", prompt) == 0
    assert m.allocate("b", prompt) == 0  # a's K/V are not written yet
    m.mark_computed("a", 4)
    assert m.allocate("c", prompt) == 4  # one computed full block
    m.mark_computed("a", 9)
    assert m.allocate("d", prompt) == 8  # two full blocks; the last token is always computed
    assert m.allocate("e", prompt[:8]) == 4  # an 8-token prompt may reuse only its first block
    assert m.block_ids("d")[0][:2] == m.block_ids("a")[0][:2]
    assert m.num_computed_tokens("d") == 8 and m.num_computed_tokens("b") == 0
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (9 * 4 + 8, 4 + 8 + 4)


def test_hybrid_hit_is_the_prefix_cached_in_every_group():
    # full attention with blocks of 4, a window group with blocks of 2: hits are multiples of 4
    m = KVCacheManager([full(4), window(3, bs=2)], 40, enable_prefix_caching=True)
    prompt = list(range(11))
    m.allocate("a", prompt)
    m.mark_computed("a", 11)
    assert m.allocate("b", prompt) == 8
    tables = m.block_ids("b")
    assert tables[0][:2] == m.block_ids("a")[0][:2] and tables[0][2] not in m.block_ids("a")[0]
    # full takes blocks 0-2, the window group 3-8; a computed 11 tokens, so the window (3) released 3-6,
    # which stayed cached. b's hit covers 8 tokens: position 8 reads 6..8, so b holds hit block 6 (tokens
    # 6, 7) only, and needs blocks 3-5 not at all
    assert m.block_ids("a")[1] == [-1, -1, -1, -1, 7, 8]
    assert tables[1] == [-1, -1, -1, 6, 10, 11] and m.num_computed_tokens("b") == 8
    m.mark_computed("b", 11)
    assert m.block_ids("b")[1] == [-1, -1, -1, -1, 10, 11]


def test_a_mamba_group_means_one_state_block_and_no_hits():
    mamba = MambaSpec(block_size=16, shapes=((4, 4),), dtype="fp32")
    m = KVCacheManager([full(), mamba], 10, enable_prefix_caching=True)
    prompt = list(range(9))
    m.allocate("a", prompt)
    assert m.block_ids("a") == ([0, 1, 2], [3])
    m.mark_computed("a", 9)
    assert m.allocate("b", prompt) == 0
    m.fork("a", "c")
    assert m.append_token("c", 1) == ((2, 8), (3, 9))  # both written blocks were shared: copy on write
    assert m.block_ids("c") == ([0, 1, 8], [9]) and m.block_ids("a") == ([0, 1, 2], [3])
    assert m.append_token("a", 1) == (None, None)  # a holds its blocks alone again


def test_fork_shares_blocks_and_copies_the_partial_last_block_on_write():
    m = KVCacheManager([full()], 6)
    m.allocate("p", [1, 2, 3, 4, 5, 6])
    m.fork("p", "c")
    assert m.block_ids("c") == ([0, 1],) and m.num_free_blocks == 4
    assert m.append_token("c", 7) == ((1, 2),)
    assert m.block_ids("c") == ([0, 2],) and m.block_ids("p") == ([0, 1],)
    assert m.append_token("p", 8) == (None,)
    m.append_token("c", 9)
    assert m.append_token("c", 10) == (None,)  # position 8 starts a new block
    assert m.block_ids("c") == ([0, 2, 3],)
    m.free("p")
    m.free("c")
    assert m.num_free_blocks == 6


def test_events_chain_by_parent_and_eviction_alone_removes():
    m = KVCacheManager([full(2)], 4, enable_prefix_caching=True, enable_kv_cache_events=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    assert m.take_events() == []
    m.mark_computed("a", 3)
    m.mark_computed("a", 5)
    h1 = h(None, [1, 2])
    h2 = h(h1, [3, 4])
    common = {"block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}
    assert m.take_events() == [
        BlockStored(
            block_hashes=[h1],
            parent_block_hash=None,
            token_ids=[1, 2],
            kv_cache_spec_kind="full_attention",
            **common,
        ),
        BlockStored(
            block_hashes=[h2],
            parent_block_hash=h1,
            token_ids=[3, 4],
            kv_cache_spec_kind="full_attention",
            **common,
        ),
    ]
    m.free("a")
    assert m.take_events() == []  # freeing keeps the cache
    # free now: uncached 3 and 2 (a's partial last block), then cached 1 (a's tail) and 0 (its head)
    m.allocate("b", [9, 9, 9, 9, 9])  # 3 blocks: 3, 2, then evicts 1
    assert m.block_ids("b") == ([3, 2, 1],)
    assert m.take_events() == [BlockRemoved(block_hashes=[h2], medium="GPU", group_idx=0)]
    assert m.cached_block_hashes() == {(0, h1)}
    m.free("b")
    assert m.allocate("c", [1, 2, 7]) == 2  # the head survived
    assert m.reset_prefix_cache() == 1


def test_refused_calls_change_nothing():
    m = KVCacheManager([full(), window(4)], 5, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])  # 2 + 2 blocks
    before = (m.block_ids("a"), m.num_free_blocks, m.prefix_cache_queries)
    with pytest.raises(OutOfBlocksError) as info:
        m.allocate("b", [1])  # needs 2, 1 free
    assert (info.value.needed, info.value.free) == (2, 1)
    with pytest.raises(DuplicateSequenceError):
        m.allocate("a", [1])
    with pytest.raises(UnknownSequenceError):
        m.free("zz")
    with pytest.raises(InvalidArgumentError):
        m.mark_computed("a", 6)
    with pytest.raises(InvalidArgumentError):
        m.allocate("c", [True])
    m.append_token("a", 6)
    m.append_token("a", 7)
    m.append_token("a", 8)
    with pytest.raises(OutOfBlocksError):
        m.append_token("a", 9)  # position 8 needs a block in both groups, 1 free
    assert m.num_tokens("a") == 8 and m.num_free_blocks == 1
    assert before[2] == m.prefix_cache_queries
    assert m.blocks_needed(5) == 4 and not m.can_allocate(5) and m.can_allocate(1) is False


def test_snapshot_names_group_owner_and_fill():
    m = KVCacheManager([full(), window(4)], 6)
    m.allocate("a", [1, 2, 3, 4, 5])
    snap = m.snapshot()
    assert snap.group.tolist() == [0, 0, 1, 1, -1, -1]
    assert snap.owner.tolist() == [0, 0, 0, 0, -1, -1]
    assert snap.fill.tolist() == [4, 1, 4, 1, 0, 0]
    assert snap.free_order.tolist() == [4, 5] and snap.num_held_blocks == 4
    assert snap.block_tables == {"a": ((0, 1), (2, 3))}


def test_bad_construction_and_decode_error_are_typed():
    with pytest.raises(InvalidArgumentError):
        KVCacheManager([], 4)
    with pytest.raises(InvalidArgumentError):
        KVCacheManager([full()], 0)
    error = pickle.loads(pickle.dumps(KVEventDecodeError("bad")))
    assert isinstance(error, KVEventDecodeError) and str(error) == "bad"


def test_taking_new_blocks_never_evicts_another_groups_hit():
    """The program the state machine found: the chunked group's hit (block 3, free and cached, at the head
    of the LRU queue) was evicted when the window group took its new blocks first."""
    specs = [full(2), window(8, bs=2), chunked(8, bs=2)]
    m = KVCacheManager(specs, 26, enable_prefix_caching=True)
    for r in range(6):
        m.allocate(r, [0])
    m.mark_computed(0, 1)
    for r in range(6):
        m.free(r)
    m.allocate(7, [0, 0])
    m.allocate(8, [1, 1, 0, 0, 0, 0, 0, 0])
    m.mark_computed(8, 8)  # the chunk group releases its 4 blocks (cached) first
    m.free(7)
    m.free(8)
    for r in (9, 10, 11, 12):
        m.allocate(r, [0])  # the last uncached free blocks but 2 go
    assert m.allocate(13, [1, 1, 1, 0, 0]) == 2
    tables = m.block_ids(13)
    assert [t[0] for t in tables] == [21, 25, 3]  # each group's cached [1, 1] block
    held = [b for r in m.request_ids() for t in m.block_ids(r) for b in t if b >= 0]
    assert len(held) == len(set(held)) == 26 - m.num_free_blocks
