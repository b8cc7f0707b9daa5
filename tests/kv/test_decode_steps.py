"""`KVCacheManager.decode_steps` (the serving simulator's batched decode) against its definition: the same
requests driven token by token through `mark_computed` + `append_token` end with the same tables, ref counts,
free count, computed counts and prefix cache (unless cached blocks were evicted: which ones follows the take
order); a call that does not fit raises and changes nothing."""

import random

import pytest

from core.errors import OutOfBlocksError
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.specs import ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec, SlidingWindowSpec


def _specs(full_only: bool = False):
    """Every layer kind; or (`full_only`, the path of a model whose layers are all full attention) two full
    groups of different block sizes."""
    if full_only:
        return [
            FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1),
            FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=1),
        ]
    return [
        FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1),
        SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=1, sliding_window=7),
        ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, attention_chunk_size=8),
        MambaSpec(block_size=4, num_kv_heads=1, head_size=1),
    ]


def _state(kv: KVCacheManager):
    """Everything but which free ids were taken: table shapes, released entries, counts, cache, ref counts."""
    ids = kv.request_ids()
    return (
        {r: tuple(tuple(b < 0 for b in t) for t in kv.block_ids(r)) for r in ids},
        {r: kv.num_computed_tokens(r) for r in ids},
        kv.num_free_blocks,
        kv.cached_block_hashes(),
        sorted(kv.pool.ref_counts),
    )


def _start(seed: int, num_blocks: int, caching: bool, full_only: bool = False) -> KVCacheManager:
    rnd = random.Random(seed)
    kv = KVCacheManager(_specs(full_only), num_blocks, enable_prefix_caching=caching)
    shared = [rnd.randrange(3) for _ in range(8)]
    for rid in range(3):
        prompt = shared[: rnd.randrange(0, 9)] + [rnd.randrange(3) for _ in range(rnd.randrange(1, 12))]
        kv.allocate(rid, prompt)
        kv.mark_computed(rid, len(prompt))
    kv.fork(0, 10)  # shares request 0's blocks, its partly filled last one included
    return kv


@pytest.mark.parametrize("seed", range(200))
def test_decode_steps_equals_token_by_token(seed):
    rnd = random.Random(1000 + seed)
    caching = seed % 2 == 0
    full_only = seed % 3 == 0  # every group full attention: `decode_steps`' own path
    num_blocks = rnd.choice([40, 60, 200])
    steps = {rid: [rnd.randrange(3) for _ in range(rnd.randrange(1, 30))] for rid in (0, 10, 2)}
    bulk = _start(seed, num_blocks, caching, full_only)
    reference = _start(seed, num_blocks, caching, full_only)
    try:
        for rid, tokens in steps.items():
            for token in tokens:
                reference.mark_computed(rid, reference.num_tokens(rid))
                reference.append_token(rid, token)
    except OutOfBlocksError:
        before = _state(
            bulk
        )  # token by token ran out part-way: the bulk call may still fit (it releases first)
        try:
            bulk.decode_steps(steps)
        except OutOfBlocksError:
            assert _state(bulk) == before
        return
    bulk.decode_steps(steps)
    got, want = _state(bulk), _state(reference)
    if bulk.pool.num_evicted_blocks or reference.pool.num_evicted_blocks:
        got, want = (
            got[:3] + got[4:],
            want[:3] + want[4:],
        )  # which cached blocks are evicted follows take order
    assert got == want
    assert len({b for r in bulk.request_ids() for t in bulk.block_ids(r) for b in t if b >= 0}) == (
        num_blocks - bulk.num_free_blocks
    )


def test_decode_steps_that_do_not_fit_change_nothing():
    kv = KVCacheManager([FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)], 3)
    kv.allocate("a", [1, 2, 3, 4, 5])
    before = (kv.block_ids("a"), kv.num_free_blocks, kv.num_tokens("a"))
    with pytest.raises(OutOfBlocksError):
        kv.decode_steps({"a": [0] * 8})  # 13 tokens need 4 blocks, the pool has 3
    assert (kv.block_ids("a"), kv.num_free_blocks, kv.num_tokens("a")) == before
