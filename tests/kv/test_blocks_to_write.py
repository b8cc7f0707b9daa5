"""`SingleTypeKVCacheManager.num_blocks_to_write`: the free blocks growing a request one token at a time needs
when each token's K/V are written at once (the block manager facade's room check), against a brute-force walk:
the lowest free count the pool reaches while `BlockManager` appends the same tokens one by one."""

import random

import pytest

from core.kv.block_pool import BlockPool
from core.kv.single_type_manager import manager_for
from core.kv.specs import FullAttentionSpec, SlidingWindowSpec
from core.paging.block_manager import BlockManager


def test_the_worked_example():
    spec = SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=1, sliding_window=4)
    pool = BlockPool(8, [spec])
    manager = manager_for(spec, pool, 0)
    rec = manager.save_hits("a", [])
    manager.append_slots(rec, 0, 6)  # 3 blocks, 6 tokens
    manager.fork("a", "b")  # block 0 is shared: releasing it for "a" frees nothing
    assert manager.num_blocks_to_write(rec, 6, 7) == 1
    assert manager.num_blocks_to_write(rec, 6, 9) == 2  # token 8 too: block 1 released (shared), one taken
    assert manager.num_blocks_to_write(rec, 6, 6) == 0
    manager.free("b")  # now each release frees the block the next take takes
    assert manager.num_blocks_to_write(rec, 6, 7) == manager.num_blocks_to_write(rec, 6, 9) == 0


@pytest.mark.parametrize("seed", range(6))
def test_it_is_the_lowest_free_count_of_a_token_by_token_walk(seed):
    rng = random.Random(seed)
    for _ in range(40):
        bs = rng.choice([1, 2, 3, 4])
        window = rng.choice([None, 1, 2, 3, 5, 8])
        m = BlockManager(400, bs, rng.random() < 0.5, window)
        m.allocate("a", list(range(rng.randint(1, 12))))
        for i in range(rng.randint(0, 5)):
            m.append_token("a", i)
        if rng.random() < 0.5:
            m.fork("a", "b")  # shared blocks: releasing them frees nothing for "a"
        count = rng.randint(0, 20)
        spec_manager, seq = m._manager, m._seqs["a"]
        old = m.num_tokens("a")
        needed = spec_manager.num_blocks_to_write(seq.blocks, old, old + count)
        start = lowest = m.num_free_blocks
        for t in range(count):
            m.append_token("a", t)
            lowest = min(lowest, m.num_free_blocks)
        assert needed == start - lowest, (bs, window, old, count)


def test_full_attention_is_num_blocks_to_append():
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)
    manager = manager_for(spec, BlockPool(8, [spec]), 0)
    rec = manager.save_hits("a", [])
    manager.append_slots(rec, 0, 5)
    for new in range(5, 20):
        assert manager.num_blocks_to_write(rec, 5, new) == manager.num_blocks_to_append(rec, 5, new)
