"""`KVCacheManager.num_blocks_for_decode` (the engine's decode-step question) against what the appends it
predicts actually take, on random forks, windows and lengths."""

import random

import pytest

from core.kv.kv_cache_manager import KVCacheManager
from core.kv.specs import FullAttentionSpec, SlidingWindowSpec


@pytest.mark.parametrize("seed", range(20))
def test_prediction_equals_the_blocks_the_appends_take(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    specs = [FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1)]
    if rng.random() < 0.5:
        specs.append(
            SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=1, sliding_window=rng.randint(1, 9))
        )
    kv = KVCacheManager(specs, 2_000)
    ids = []
    for r in range(rng.randint(1, 6)):
        kv.allocate(r, [rng.randrange(50) for _ in range(rng.randint(1, 13))])
        ids.append(r)
        for c in range(rng.randint(0, 3)):  # parallel samples sharing every block, the last one partly filled
            kv.fork(r, (r, c))
            ids.append((r, c))
    for _ in range(12):
        for rid in ids:
            kv.mark_computed(rid, kv.num_tokens(rid))  # what the engine does after each step
        order = rng.sample(ids, len(ids))
        predicted = kv.num_blocks_for_decode(order)
        free = kv.num_free_blocks
        for rid in order:
            kv.append_token(rid, 7)
        held_new = free - kv.num_free_blocks
        # the appends take `predicted` blocks; computed-token releases happened before the prediction
        assert predicted == held_new
