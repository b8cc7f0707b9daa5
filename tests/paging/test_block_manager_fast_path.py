"""`append_token`'s fast path (a token that lands in the unshared last block without filling it) gives exactly
what its slow path gives: the same slot, the same copy-on-write, the same pool, after any mix of operations."""

import copy
import pickle
import random

import numpy as np
import pytest

from core.errors import OutOfBlocksError
from core.paging.block_manager import AppendResult, BlockManager


class SlowPathOnly(BlockManager):
    """The reference: every append disarms the fast slots first, so it always takes the path through the KV
    core's manager (room check, copy-on-write, new block, caching)."""

    def append_token(self, seq_id, token_id):
        self._seq(seq_id).fast = iter(())
        return super().append_token(seq_id, token_id)


class CountsSlowCalls(BlockManager):
    """The manager under test, counting the appends that leave the fast slots for `_append_slow`."""

    slow_calls = 0

    def _append_slow(self, seq, seq_id, token_id):
        self.slow_calls += 1
        return super()._append_slow(seq, seq_id, token_id)


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
    fast = CountsSlowCalls(30, block_size, caching, enable_kv_cache_events=True)
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
            slow_calls = fast.slow_calls
            try:
                result = fast.append_token(seq, token)
            except OutOfBlocksError:
                assert fast.slow_calls > slow_calls  # the fast path never needs a block
                with pytest.raises(OutOfBlocksError):
                    slow.append_token(seq, token)
                _same_state(fast, slow)
                continue
            expected = slow.append_token(seq, token)
            assert result == expected and isinstance(result, AppendResult)
            assert (result.slot, result.cow, repr(result)) == (expected.slot, expected.cow, repr(expected))
            if fast.slow_calls == slow_calls:
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


def test_a_fast_result_is_an_append_result_in_every_use():
    m = BlockManager(4, 8)
    m.allocate("a", [1, 2])
    fast = m.append_token("a", 3)  # block 0's third slot, taken from the fast slots
    plain = AppendResult(slot=2, cow=None)
    assert fast == plain and hash(fast) == hash(plain) and isinstance(fast, AppendResult)
    assert repr(fast) == repr(plain) == "AppendResult(slot=2, cow=None)"
    assert fast._asdict() == {"slot": 2, "cow": None} and fast._replace(slot=5) == (5, None)
    for twin in (pickle.loads(pickle.dumps(fast)), copy.copy(fast), copy.deepcopy(fast)):
        assert twin == plain and type(twin) is AppendResult
