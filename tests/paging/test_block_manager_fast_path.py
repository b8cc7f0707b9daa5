"""`append_token`'s fast path (a token that lands in the unshared last block without filling it) gives exactly
what its slow path gives: the same slot, the same copy-on-write, the same pool, after any mix of operations."""

import random

import numpy as np
import pytest

from core.errors import OutOfBlocksError
from core.paging.block_manager import BlockManager


class SlowPathOnly(BlockManager):
    """The reference: every append disarms the fast path first, so it always takes the one append path through
    the KV core's manager (room check, copy-on-write, new block, caching)."""

    def append_token(self, seq_id, token_id):
        seq = self._seq(seq_id)
        seq.next_slot = seq.fast_end = 0
        return super().append_token(seq_id, token_id)


def _same_state(a: BlockManager, b: BlockManager) -> None:
    sa, sb = a.snapshot(), b.snapshot()
    assert sa.block_tables == sb.block_tables and sa.num_tokens == sb.num_tokens
    for name in ("ref_count", "fill", "is_cached", "is_free", "free_order"):
        assert np.array_equal(getattr(sa, name), getattr(sb, name)), name
    assert a.prefix_cache_stats == b.prefix_cache_stats
    assert a.take_events() == b.take_events()


@pytest.mark.parametrize("block_size", [1, 2, 3, 5])
@pytest.mark.parametrize("caching", [False, True])
def test_fast_path_equals_slow_path_under_random_operations(block_size, caching):
    rng = random.Random(block_size * 10 + caching)
    fast = BlockManager(30, block_size, caching, enable_kv_cache_events=True)
    slow = SlowPathOnly(30, block_size, caching, enable_kv_cache_events=True)
    live: list[int] = []
    next_id = 0
    fast_appends = 0
    for _ in range(1500):
        op = rng.random()
        both = (fast, slow)
        if op < 0.12 or not live:
            prompt = [rng.randint(0, 2) for _ in range(rng.randint(1, 9))]  # few ids: cache hits happen
            try:
                hits = [m.allocate(next_id, prompt) for m in both]
            except OutOfBlocksError:
                with pytest.raises(OutOfBlocksError):
                    slow.allocate(next_id, prompt)
                continue
            assert hits[0] == hits[1]
            live.append(next_id)
            next_id += 1
        elif op < 0.2:
            parent = rng.choice(live)
            for m in both:
                m.fork(parent, next_id)
            live.append(next_id)
            next_id += 1
        elif op < 0.3:
            victim = live.pop(rng.randrange(len(live)))
            for m in both:
                m.free(victim)
        elif op < 0.38:
            seq = rng.choice(live)
            tokens = [rng.randint(0, 2) for _ in range(rng.randint(0, 7))]
            try:
                cow = fast.extend(seq, tokens)
            except OutOfBlocksError:
                with pytest.raises(OutOfBlocksError):
                    slow.extend(seq, tokens)
                continue
            assert slow.extend(seq, tokens) == cow
        elif op < 0.4:
            assert fast.reset_prefix_cache() == slow.reset_prefix_cache()
        else:
            seq = rng.choice(live)
            token = rng.randint(0, 2)
            armed = fast._seqs[seq].next_slot < fast._seqs[seq].fast_end
            try:
                result = fast.append_token(seq, token)
            except OutOfBlocksError:
                assert not armed  # the fast path never needs a block
                with pytest.raises(OutOfBlocksError):
                    slow.append_token(seq, token)
                _same_state(fast, slow)
                continue
            assert slow.append_token(seq, token) == result
            if armed:
                fast_appends += 1
                assert result.cow is None
        _same_state(fast, slow)
    if block_size > 1 + caching:  # otherwise every token starts or fills a block: no fast path exists
        assert fast_appends > 100


def test_a_fork_disarms_both_sides_until_copy_on_write():
    m = BlockManager(10, 4)
    m.allocate("a", [1, 2])  # the last block holds 2 of 4 tokens
    assert m.append_token("a", 3).cow is None
    m.fork("a", "b")
    shared = m.block_table("a")[-1]
    first = m.append_token("a", 4)
    assert first.cow is not None and first.cow[0] == shared  # copied, not written in place
    assert m.append_token("b", 5).slot == shared * 4 + 3  # b now holds the old block alone: no copy
    assert m.ref_count(shared) == 1
