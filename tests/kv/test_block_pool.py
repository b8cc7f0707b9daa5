"""BlockPool on hand-worked examples: take order, ref counts, cache keys that need equal tokens, and the events
each change publishes (BlockStored chained by parent, BlockRemoved on eviction only, AllBlocksCleared)."""

import pytest

from core.errors import InvalidArgumentError, OutOfBlocksError
from core.kv.block_pool import BlockPool
from core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from core.kv.specs import FullAttentionSpec, SlidingWindowSpec

FULL = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=8)
WINDOW = SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=8, sliding_window=3)


def stored(hashes, parent, tokens, group=0, kind="full_attention", window=None):
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=2,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=group,
        kv_cache_spec_kind=kind,
        kv_cache_spec_sliding_window=window,
    )


def test_take_order_uncached_first_then_cached_lru():
    pool = BlockPool(5, [FULL], enable_kv_cache_events=True)
    assert pool.take(5) == [0, 1, 2, 3, 4] and pool.num_free_blocks == 0 and pool.usage == 1.0
    pool.cache_block(0, 1, 101, None, (1, 2))
    pool.cache_block(0, 3, 103, 101, (3, 4))
    pool.release_all([4, 3, 2, 1, 0])  # a request frees its blocks last to first
    assert pool.free_order() == [4, 2, 0, 3, 1] and pool.num_cached_free_blocks == 2
    assert pool.take_events() == [stored([101], None, [1, 2]), stored([103], 101, [3, 4])]
    assert [pool.take_one() for _ in range(3)] == [4, 2, 0]
    assert pool.take_events() == []  # taking uncached blocks evicts nothing
    assert pool.take_one() == 3  # the least recently freed cached block: the request's tail
    assert pool.take_events() == [BlockRemoved(block_hashes=[103], medium="GPU", group_idx=0)]
    assert pool.cached_hashes() == {(0, 101)} and pool.num_evicted_blocks == 1
    with pytest.raises(OutOfBlocksError):
        pool.take(2)
    assert pool.num_free_blocks == 1 and pool.cached_hashes() == {(0, 101)}


def test_ref_counts_and_revival_of_a_cached_free_block():
    pool = BlockPool(3, [FULL])
    a, b = pool.take(2)
    pool.cache_block(0, a, 7, None, (5, 6))
    pool.touch(a)  # a second request shares it
    assert pool.ref_counts[a] == 2
    pool.release(a)
    pool.release(a)
    assert pool.num_free_blocks == 2 and pool.num_cached_free_blocks == 1
    assert pool.get_cached(0, 7, None, (5, 6)) == a
    pool.touch(a)  # a prefix-cache hit revives it
    assert pool.ref_counts[a] == 1 and pool.num_free_blocks == 1 and pool.free_order() == [2]
    assert pool.ref_counts[b] == 1


def test_a_hit_needs_equal_tokens_and_parent_not_just_the_hash():
    pool = BlockPool(2, [FULL, WINDOW])
    block = pool.take_one()
    assert pool.cache_block(0, block, 42, None, (1, 2))
    assert pool.get_cached(0, 42, None, (1, 2)) == block
    assert pool.get_cached(0, 42, None, (1, 3)) is None  # a colliding hash is a miss
    assert pool.get_cached(0, 42, 5, (1, 2)) is None
    assert pool.get_cached(1, 42, None, (1, 2)) is None  # each group has its own cache
    other = pool.take_one()
    assert not pool.cache_block(0, other, 42, None, (1, 2))  # the first block keeps the key
    assert pool.block_hash(other) is None and pool.cached_group(block) == 0


def test_cache_blocks_emits_one_event_per_run_of_new_blocks():
    pool = BlockPool(6, [FULL, WINDOW], enable_kv_cache_events=True)
    first = pool.take(1)
    pool.cache_blocks(1, first, [20], None, [1, 2])
    blocks = pool.take(3)
    added = pool.cache_blocks(1, [first[0], *blocks], [20, 21, 22, 23], None, [1, 2, 3, 4, 5, 6, 7, 8])
    assert added == 3
    window = {"group": 1, "kind": "sliding_window", "window": 3}
    assert pool.take_events() == [
        stored([20], None, [1, 2], **window),
        stored([21, 22, 23], 20, [3, 4, 5, 6, 7, 8], **window),
    ]
    other = pool.take(2)  # the middle block's hash is cached already: two runs around it
    pool.cache_blocks(0, other, [30, 31], 22, [9, 9, 8, 8])
    assert pool.take_events() == [stored([30, 31], 22, [9, 9, 8, 8])]


def test_reset_forgets_every_hash_and_keeps_free_order():
    pool = BlockPool(3, [FULL], enable_kv_cache_events=True)
    a, b, c = pool.take(3)
    pool.cache_blocks(0, [a, b], [1, 2], None, [1, 1, 2, 2])
    pool.release_all([c, b])
    pool.take_events()
    assert pool.reset_prefix_cache() == 2
    assert pool.take_events() == [AllBlocksCleared()]
    assert pool.cached_hashes() == set() and pool.num_cached_free_blocks == 0
    assert pool.free_order() == [c, b] and pool.block_hash(a) is None


def test_events_off_queue_nothing_and_bad_arguments_are_refused():
    pool = BlockPool(2, [FULL])
    block = pool.take_one()
    pool.cache_block(0, block, 1, None, (1, 1))
    pool.reset_prefix_cache()
    assert pool.take_events() == []
    with pytest.raises(InvalidArgumentError):
        BlockPool(0, [FULL])
    with pytest.raises(InvalidArgumentError):
        BlockPool(4, [])


def test_longest_cached_run_is_the_walk_of_get_cached_up_to_a_collision():
    """The one-probe-per-block run against `get_cached` block by block (the reference): it stops at a missing
    key, and at a key whose cached block holds other tokens or another parent (a collision), never past it."""
    tokens = tuple(range(100, 112))  # 6 blocks of 2
    keys = [11, 12, 13, 14, 15, 16]

    def reference(pool):
        hits, parent = [], None
        for i, key in enumerate(keys):
            block = pool.get_cached(0, key, parent, tokens[2 * i : 2 * i + 2])
            if block is None:
                break
            hits.append(block)
            parent = key
        return hits

    def pool_with(chain):  # chain: (key, parent, tokens) per cached block
        pool = BlockPool(8, [FULL])
        for key, parent, toks in chain:
            pool.cache_block(0, pool.take_one(), key, parent, toks)
        return pool

    whole = [(keys[i], keys[i - 1] if i else None, tokens[2 * i : 2 * i + 2]) for i in range(6)]
    cases = {
        "all": whole,
        "a missing key": whole[:3] + whole[4:],
        "other tokens": [*whole[:2], (13, 12, (0, 0)), *whole[3:]],
        "another parent": [*whole[:4], (15, 99, tokens[8:10]), *whole[5:]],
        "a first block's collision": [(11, None, (7, 7)), *whole[1:]],
    }
    expected = {
        "all": 6,
        "a missing key": 3,
        "other tokens": 2,
        "another parent": 4,
        "a first block's collision": 0,
    }
    for name, chain in cases.items():
        pool = pool_with(chain)
        for max_blocks in (0, 3, 6, 9):
            run = pool.longest_cached_run(0, keys, tokens, 2, max_blocks)
            assert run == reference(pool)[:max_blocks], (name, max_blocks)
            assert len(run) == min(expected[name], max_blocks), (name, max_blocks)
        assert pool.longest_cached_run(0, keys, list(tokens), 2, 6) == reference(pool)  # a list of ids too
        for num_known in (1, 3, 6):  # the prompt's own leading keys as tuples the caller keeps
            known = [(keys[i - 1] if i else None, tokens[2 * i : 2 * i + 2]) for i in range(num_known)]
            pool = pool_with(chain)
            want = reference(pool)
            assert pool.longest_cached_run(0, keys, tokens, 2, 6, known) == want, (name, num_known)
            probed = min(num_known, pool.num_leading_cached(0, keys))  # blocks found for known keys
            found = [pool._cached[0][key] for key in keys[:probed]]
            adopted = [pool._block_key[b] is k for b, k in zip(found, known, strict=False)]
            assert all(adopted) == (len(want) >= probed), (name, num_known)  # equal keys: adopted
            assert any(adopted) == all(adopted), (name, num_known)  # all or none
            assert pool.longest_cached_run(0, keys, tokens, 2, 6, known) == want  # by identity now
