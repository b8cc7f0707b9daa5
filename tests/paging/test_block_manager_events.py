"""`BlockManager(enable_kv_cache_events=True)`: the one-group facade publishes vLLM's KV cache events as blocks
fill (its callers write K/V at once). Replaying them must rebuild exactly the pool's prefix cache, each stored
hash must chain its parent and tokens, and freeing must publish nothing."""

import random

from core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_event_batch, encode_event_batch
from core.paging.block_manager import BlockManager


def replay(cached: dict, events: list) -> None:
    for event in decode_event_batch(encode_event_batch(events, ts=0.0)).events:
        if isinstance(event, BlockStored):
            parent = event.parent_block_hash
            for i, h in enumerate(event.block_hashes):
                tokens = tuple(event.token_ids[i * event.block_size : (i + 1) * event.block_size])
                assert h == hash((parent, tokens)) and h not in cached
                cached[h] = tokens
                parent = h
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                del cached[h]
        else:
            assert isinstance(event, AllBlocksCleared)
            cached.clear()


def test_block_stored_as_blocks_fill_and_removed_only_on_eviction():
    m = BlockManager(3, 2, enable_prefix_caching=True, enable_kv_cache_events=True)
    m.allocate("a", [1, 2, 3])  # block 0 is full at once
    (first,) = m.take_events()
    assert (first.block_hashes, first.parent_block_hash, first.token_ids) == (
        [hash((None, (1, 2)))],
        None,
        [1, 2],
    )
    assert (first.group_idx, first.kv_cache_spec_kind, first.block_size) == (0, "full_attention", 2)
    m.append_token("a", 4)  # fills block 1
    (second,) = m.take_events()
    assert second.parent_block_hash == first.block_hashes[0] and second.token_ids == [3, 4]
    m.free("a")
    assert m.take_events() == []
    m.allocate("b", [7, 7, 7, 7, 7])  # takes the uncached block, then evicts a's tail, then its head
    kinds = [type(e).__name__ for e in m.take_events()]
    assert kinds == ["BlockRemoved", "BlockRemoved", "BlockStored"]
    m.reset_prefix_cache()
    assert m.take_events() == [AllBlocksCleared()]


def test_events_replay_into_the_cached_set_under_random_operations():
    for window in (None, 3):
        rng = random.Random(5)
        m = BlockManager(
            24, 2, enable_prefix_caching=True, sliding_window=window, enable_kv_cache_events=True
        )
        cached: dict = {}
        live, next_id = [], 0
        for step in range(400):
            op = rng.random()
            if op < 0.3 or not live:
                if m.can_allocate(8):
                    m.allocate(next_id, [rng.randint(0, 2) for _ in range(rng.randint(1, 8))])
                    live.append(next_id)
                    next_id += 1
            elif op < 0.4:
                m.fork(rng.choice(live), next_id)
                live.append(next_id)
                next_id += 1
            elif op < 0.6:
                m.free(live.pop(rng.randrange(len(live))))
                assert m.take_events() == []
            elif op < 0.62:
                m.reset_prefix_cache()
            elif m.num_free_blocks > 2:
                m.extend(rng.choice(live), [rng.randint(0, 2) for _ in range(rng.randint(1, 4))])
            replay(cached, m.take_events())
            assert {(0, h) for h in cached} == m.pool.cached_hashes(), step
