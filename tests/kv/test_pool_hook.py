"""The pool's connector seam (`core.kv.block_pool.PoolHook`, vLLM's KV connector): a stub host tier written here,
with nothing in `core/sched` or `core/serving` edited, receives what eviction drops and answers a later prompt's
lookup through the pool's hook; `KVCacheManager` then serves the prompt from it, as it does from `HostTier`.
The keys it receives are checked against the chained hash computed by hand (`hash_block_tokens`)."""

import pytest

from core.errors import InvalidArgumentError
from core.kv import BlockPool, HostLoad, HostTier, KVCacheManager, PoolHook
from core.kv.block_hash import hash_block_tokens
from core.kv.specs import FullAttentionSpec

SPEC = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)


class EvictionStore(PoolHook):
    """A stub second tier: it keeps every block the pool evicts (keyed by its hash, one slot each, in eviction
    order) and serves a prompt's consecutive run of them; it ignores what the pool stores."""

    block_size = 4

    def __init__(self):
        self.slots: dict[int, tuple[int, int | None, tuple]] = {}  # hash -> (slot, parent, tokens)
        self.evicted: list[tuple[int, int, int | None, tuple]] = []
        self.stored_chains = 0
        self.finished: list[tuple[list, set]] = []

    def on_stored(self, hashes, parent_hash, token_ids, first_block):
        self.stored_chains += 1

    def on_evicted(self, group, block_hash, parent_hash, tokens):
        self.evicted.append((group, block_hash, parent_hash, tokens))
        self.slots.setdefault(block_hash, (len(self.slots), parent_hash, tokens))

    def lookup(self, hashes, token_ids, start, max_blocks):
        out = []
        for index in range(start, min(max_blocks, len(hashes))):
            entry = self.slots.get(hashes[index])
            parent = hashes[index - 1] if index else None
            if entry is None or entry[1:] != (parent, tuple(token_ids[index * 4 : index * 4 + 4])):
                break
            out.append(entry[0])
        return out

    def on_request_finished(self, keys, reused):
        self.finished.append((list(keys), set(reused)))


def test_a_stub_tier_receives_evicted_blocks_and_answers_a_lookup_through_the_pool():
    store = EvictionStore()
    kv = KVCacheManager([SPEC], 4, enable_prefix_caching=True, host_tier=store)
    assert kv.pool.hook is store
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # 2 full blocks and 1 token
    kv.allocate("a", prompt)
    kv.mark_computed("a", 9)
    kv.free("a")  # blocks 0..1 stay cached, free
    assert store.stored_chains == 1 and store.evicted == []
    kv.allocate("b", list(range(100, 116)))  # 4 blocks: both cached blocks of "a" are evicted
    h0 = hash_block_tokens(None, (1, 2, 3, 4))
    h1 = hash_block_tokens(h0, (5, 6, 7, 8))
    # freed last to first, evicted least recently freed first: block 1 of "a", then block 0
    assert store.evicted == [(0, h1, h0, (5, 6, 7, 8)), (0, h0, None, (1, 2, 3, 4))]
    kv.free("b")
    assert kv.pool.num_leading_cached(0, [h0, h1]) == 0  # the pool holds neither now
    hits = kv.allocate("again", prompt)  # the hook's lookup serves both full blocks
    assert hits == 8 and (kv.gpu_cache_hits, kv.host_cache_hits) == (0, 8)
    table = kv.block_ids("again")[0]
    assert kv.take_host_loads() == [HostLoad(1, table[0], 0), HostLoad(0, table[1], 0)]
    kv.mark_computed("again", 9)
    kv.free("again")
    assert store.finished[-1] == ([h0, h1], {h0, h1})


def test_the_pool_alone_calls_its_hook():
    store = EvictionStore()
    pool = BlockPool(2, [SPEC], hook=store)
    assert pool.lookup_external([1], [1, 2, 3, 4], 0, 1) == []
    block = pool.take_one()
    pool.cache_blocks(0, [block], [11], None, [1, 2, 3, 4])
    pool.release(block)
    assert store.stored_chains == 1
    pool.take(2)  # the free uncached block, then the cached one: evicted
    assert store.evicted == [(0, 11, None, (1, 2, 3, 4))]
    assert pool.lookup_external([11], [1, 2, 3, 4], 0, 1) == [0]
    assert BlockPool(2, [SPEC]).lookup_external([11], [1, 2, 3, 4], 0, 1) == []  # no hook: nothing outside


def test_the_host_tier_is_the_pools_hook():
    tier = HostTier(8, 4)
    kv = KVCacheManager([SPEC], 8, enable_prefix_caching=True, host_tier=tier)
    assert isinstance(tier, PoolHook) and kv.pool.hook is tier and kv.pool.offload is tier
    kv.allocate("a", list(range(9)))
    kv.mark_computed("a", 9)
    assert len(tier.stored_keys()) == 2  # stored as computed, through `on_stored`
    with pytest.raises(InvalidArgumentError, match="PoolHook"):
        KVCacheManager([SPEC], 8, enable_prefix_caching=True, host_tier=object())
