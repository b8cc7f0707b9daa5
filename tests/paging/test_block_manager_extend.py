"""`BlockManager.extend` (bulk append for the simulator) is exactly `append_tokens`: same blocks, same cache."""

import random

import numpy as np
import pytest

from core.errors import OutOfBlocksError
from core.paging.block_manager import BlockManager


def _same(a: BlockManager, b: BlockManager) -> None:
    sa, sb = a.snapshot(), b.snapshot()
    assert sa.block_tables == sb.block_tables and sa.num_tokens == sb.num_tokens
    for name in ("ref_count", "fill", "is_cached", "free_order"):
        assert np.array_equal(getattr(sa, name), getattr(sb, name)), name
    assert a.prefix_cache_stats == b.prefix_cache_stats


@pytest.mark.parametrize("window", [None, 1, 3, 6, 13])
@pytest.mark.parametrize("caching", [False, True])
def test_extend_equals_append_tokens_under_random_operations(caching, window):
    rng = random.Random(11)
    a = BlockManager(40, 4, caching, sliding_window=window)
    b = BlockManager(40, 4, caching, sliding_window=window)
    live: list[int] = []
    next_id = 0
    for _ in range(600):
        op = rng.random()
        if op < 0.25 or not live:
            prompt = [rng.randint(0, 3) for _ in range(rng.randint(1, 10))]  # few ids: cache hits happen
            try:
                hits = a.allocate(next_id, prompt)
            except OutOfBlocksError:
                continue
            assert b.allocate(next_id, prompt) == hits
            live.append(next_id)
            next_id += 1
        elif op < 0.4:
            parent = rng.choice(live)
            a.fork(parent, next_id)
            b.fork(parent, next_id)
            live.append(next_id)
            next_id += 1
        elif op < 0.6:
            victim = live.pop(rng.randrange(len(live)))
            a.free(victim)
            b.free(victim)
        else:
            seq = rng.choice(live)
            tokens = [rng.randint(0, 3) for _ in range(rng.randint(0, 9))]
            try:
                results = a.append_tokens(seq, tokens)
            except OutOfBlocksError:
                with pytest.raises(OutOfBlocksError):
                    b.extend(seq, tokens)
                _same(a, b)
                continue
            cow = b.extend(seq, tokens)
            assert cow == (results[0].cow if results else None)
        _same(a, b)
