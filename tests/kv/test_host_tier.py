"""The host-memory KV tier (vLLM's native CPU offloading) on hand-worked examples: vLLM's capacity arithmetic,
stores as blocks are computed, hits that continue from HBM into the host tier, the loads listed for the
executor, LRU and ARC eviction, the store threshold, events with medium "CPU", one plain error per bad value,
and a random run against a brute-force model of the LRU tier."""

import math
import pickle
import random
from collections import OrderedDict

import pytest

from core.errors import InvalidArgumentError, LabError
from core.kv import KVCacheManager
from core.kv.events import BlockRemoved, BlockStored
from core.kv.host_tier import HostLoad, HostTier, host_block_size, host_tier_num_blocks
from core.kv.specs import FullAttentionSpec

GIB = 1 << 30


def full(bs=4):
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8)


def h(parent, tokens):
    return hash((parent, tuple(tokens)))


def chain(tokens, bs):
    out, parent = [], None
    for i in range(len(tokens) // bs):
        parent = h(parent, tokens[i * bs : (i + 1) * bs])
        out.append(parent)
    return out


# ---- capacity ----------------------------------------------------------------------------------------------


def test_qwen3_32b_200_gib_holds_819200_tokens_by_vllms_arithmetic():
    # Qwen3-32B bf16: 64 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 262,144 B a token.
    per_token = 64 * 8 * 128 * 2 * 2
    assert per_token == 262_144
    # TP2, 16-token GPU blocks: each rank holds half the heads: 2 MiB a block a rank.
    per_worker_block = per_token * 16 // 2
    blocks = host_tier_num_blocks(200 * GIB, per_worker_block, world_size=2)
    assert blocks == 51_200  # 200 GiB / (2 MiB x 2 ranks)
    assert blocks * 16 == 819_200  # tokens; a guide's "1.31M" is not this arithmetic
    # a 32-token host block (2 GPU blocks) halves the blocks, same tokens
    assert host_tier_num_blocks(200 * GIB, per_worker_block, 2, 2) * 32 == 819_200


def test_host_block_bytes_round_up_to_the_page():
    # 1,000 B a block a rank x 3 ranks = 3,000 B -> one 4,096 B page each: 10 pages hold 10 blocks, not 13
    assert host_tier_num_blocks(40_960, 1_000, world_size=3) == 10
    assert host_tier_num_blocks(4_095, 4_096) == 0
    assert host_tier_num_blocks(0.5 * GIB, 4_096) == (GIB // 2) // 4_096  # a fractional GiB count of bytes


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: host_tier_num_blocks(-1, 4096), "cpu_bytes must be at least 0"),
        (lambda: host_tier_num_blocks(math.nan, 4096), "cpu_bytes must be a finite number"),
        (lambda: host_tier_num_blocks(math.inf, 4096), "cpu_bytes must be a finite number"),
        (lambda: host_block_size(16, 24), "must be a multiple of the GPU block size 16"),
        (lambda: host_block_size(16, 0), "host block size (tokens) must be at least 1"),
        (lambda: HostTier(4, 4, policy="fifo"), "offload policy must be one of lru, arc"),
        (lambda: HostTier(-1, 4), "host tier num_blocks must be at least 0"),
    ],
)
def test_bad_values_are_one_plain_error_each(call, says):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert says in str(info.value)
    assert "\n" not in str(info.value)
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, LabError) and str(again) == str(info.value)


def test_host_block_size_in_gpu_blocks():
    assert host_block_size(16, 16) == 1
    assert host_block_size(16, 64) == 4


# ---- the tier inside the KV cache manager ------------------------------------------------------------------


def manager(num_blocks=4, host_blocks=8, bs=4, events=False, per=1, policy="lru"):
    tier = HostTier(host_blocks, bs, blocks_per_host_block=per, policy=policy, enable_kv_cache_events=events)
    return KVCacheManager(
        [full(bs)], num_blocks, enable_prefix_caching=True, enable_kv_cache_events=events, host_tier=tier
    )


A = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # two full 4-token blocks and one token
B = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32]  # three full blocks and one token


def run(m, rid, tokens):
    hit = m.allocate(rid, tokens)
    m.mark_computed(rid, len(tokens))
    m.free(rid)
    return hit


def test_blocks_are_stored_as_computed_and_hit_from_the_host_after_hbm_evicts_them():
    m = manager()
    assert run(m, "a", A) == 0
    assert m.host_tier.stored_keys() == set(chain(A, 4))  # both full blocks, the partial one never
    run(m, "b", B)  # 4 GPU blocks: evicts a's cached blocks
    assert m.pool.num_cached_blocks == 3 and not (
        set(chain(A, 4)) & {hh for _, hh in m.cached_block_hashes()}
    )
    assert m.take_host_loads() == []
    hit = m.allocate("a2", A)
    assert hit == 8  # both blocks, from the host tier
    table = m.block_ids("a2")[0]
    hosts = [m.host_tier.host_block(k) for k in chain(A, 4)]
    assert m.take_host_loads() == [HostLoad(hosts[0], table[0]), HostLoad(hosts[1], table[1])]
    assert m.take_host_loads() == []  # drained
    assert (m.gpu_cache_hits, m.host_cache_hits, m.prefix_cache_hits) == (0, 8, 8)
    assert m.num_computed_tokens("a2") == 8
    m.mark_computed("a2", 9)  # the loaded blocks enter the GPU prefix cache
    assert set(chain(A, 4)) <= {hh for _, hh in m.cached_block_hashes()}


def test_a_hit_runs_from_hbm_into_the_host_tier():
    m = manager(num_blocks=6)
    run(m, "a", [*A, 10, 11, 12])  # 3 full blocks in both tiers; 3 GPU blocks cached, free
    # 4 blocks for x: 3 free uncached, then the LRU cached one, a's tail (freed last to first: tail first)
    run(m, "x", [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62])
    keys = chain([*A, 10, 11, 12], 4)
    gpu = {hh for _, hh in m.cached_block_hashes()}
    assert keys[0] in gpu and keys[1] in gpu and keys[2] not in gpu
    hit = m.allocate("a2", [*A, 10, 11, 12, 13])
    assert hit == 12  # 2 blocks from HBM, the third from the host
    assert (m.gpu_cache_hits, m.host_cache_hits) == (8, 4)
    table = m.block_ids("a2")[0]
    assert m.take_host_loads() == [HostLoad(m.host_tier.host_block(keys[2]), table[2])]


def test_the_last_prompt_token_is_never_a_host_hit():
    m = manager()
    run(m, "a", [*A[:8], 0])
    run(m, "b", B)
    assert m.allocate("c", A[:8]) == 4  # 8 tokens: the second block holds the last token, recomputed


def test_a_tier_needs_one_full_attention_group_with_caching_and_the_same_block_size():
    with pytest.raises(InvalidArgumentError, match="prefix caching on"):
        KVCacheManager([full()], 4, host_tier=HostTier(4, 4))
    with pytest.raises(InvalidArgumentError, match="block size must be the pool's"):
        KVCacheManager([full(4)], 4, enable_prefix_caching=True, host_tier=HostTier(4, 8))


def test_host_events_carry_medium_cpu_and_the_gpu_hashes():
    m = manager(host_blocks=2, events=True)
    run(m, "a", A)
    k1, k2 = chain(A, 4)
    events = m.take_events()
    cpu = [e for e in events if e.medium == "CPU"]
    common = {"block_size": 4, "lora_id": None, "medium": "CPU", "lora_name": None, "group_idx": 0}
    assert cpu == [
        BlockStored(
            block_hashes=[k1],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            kv_cache_spec_kind="full_attention",
            **common,
        ),
        BlockStored(
            block_hashes=[k2],
            parent_block_hash=k1,
            token_ids=[5, 6, 7, 8],
            kv_cache_spec_kind="full_attention",
            **common,
        ),
    ]
    run(m, "b", B[:5])  # one new block: the full tier evicts its LRU block (a's tail: the head was refreshed)
    cpu = [e for e in m.take_events() if e.medium == "CPU"]
    assert cpu[0] == BlockRemoved(block_hashes=[k2], medium="CPU", group_idx=0)
    assert isinstance(cpu[1], BlockStored) and cpu[1].block_hashes == chain(B[:5], 4)


def test_host_blocks_of_two_gpu_blocks_store_whole_and_load_past_the_hbm_hit():
    m = manager(num_blocks=6, per=2)
    tokens = list(range(100, 117))  # 4 full blocks, 2 host blocks
    run(m, "a", tokens)
    keys = chain(tokens, 4)
    assert m.host_tier.stored_keys() == {keys[1], keys[3]}  # keyed by each host block's last GPU block
    run(m, "x", list(range(200, 217)))  # 5 blocks: evicts a's blocks 3, 2, 1 from HBM (tail first)
    gpu = {hh for _, hh in m.cached_block_hashes()}
    assert keys[0] in gpu and keys[1] not in gpu
    assert m.allocate("a2", tokens) == 16
    table = m.block_ids("a2")[0]
    h0, h1 = m.host_tier.host_block(keys[1]), m.host_tier.host_block(keys[3])
    # block 0 is an HBM hit; the first host block is loaded for its second GPU block only
    assert m.take_host_loads() == [
        HostLoad(h0, table[1], 1),
        HostLoad(h1, table[2], 0),
        HostLoad(h1, table[3], 1),
    ]


# ---- eviction policies, threshold --------------------------------------------------------------------------


def offer_one(tier, key_tokens):
    """Offer a one-block chain whose tokens are `key_tokens`; returns its key."""
    key = h(None, key_tokens)
    tier.offer([key], None, key_tokens, 0)
    return key


def test_lru_and_arc_differ_on_a_reused_block():
    # capacity 2: k1 stored, then reused (loaded) by a request; k2 stored; k3 needs room.
    kept = {}
    for policy in ("lru", "arc"):
        tier = HostTier(2, 2, policy=policy)
        k1 = offer_one(tier, [1, 1])
        tier.on_request_finished([k1], set())
        tier.on_request_finished([k1], {k1})  # a request loaded k1: reused
        k2 = offer_one(tier, [2, 2])
        tier.on_request_finished([k2], set())
        k3 = offer_one(tier, [3, 3])
        kept[policy] = tier.stored_keys()
    # LRU evicts the least recent, k1; ARC keeps the reused k1 (T2) and evicts the once-seen k2 (T1)
    assert kept == {"lru": {h(None, [2, 2]), k3}, "arc": {k1, k3}}


def test_arc_ghost_hit_raises_the_t1_target():
    tier = HostTier(1, 2, policy="arc")
    k1 = offer_one(tier, [1, 1])
    offer_one(tier, [2, 2])  # evicts k1 into B1
    assert tier._policy.b1 and tier._policy.target_t1 == 0
    assert offer_one(tier, [1, 1]) == k1  # a store miss on a B1 ghost: target +1
    assert tier._policy.target_t1 == 1
    assert tier.stored_keys() == {k1}


def test_store_threshold_stores_a_block_on_its_second_offer():
    tier = HostTier(4, 2, store_threshold=2)
    key = offer_one(tier, [7, 7])
    assert tier.stored_keys() == set() and tier.num_skipped_stores == 1
    offer_one(tier, [7, 7])
    assert tier.stored_keys() == {key}


def test_keys_offered_together_are_not_evicted_for_each_other():
    tier = HostTier(1, 2)
    tokens = [1, 1, 2, 2]
    keys = chain(tokens, 2)
    assert tier.offer(keys, None, tokens, 0) == 0  # two new blocks, room for one: the store is skipped
    assert tier.stored_keys() == set()
    assert tier.offer(keys[:1], None, tokens[:2], 0) == 1


def test_lru_tier_matches_a_brute_force_model():
    rng = random.Random(38)
    capacity = 5
    tier = HostTier(capacity, 1)
    model: OrderedDict[int, None] = OrderedDict()  # oldest first
    for _ in range(400):
        first = rng.randrange(12)
        length = rng.randrange(1, 4)
        tokens = list(range(first, first + length))
        keys = chain(tokens, 1)
        if rng.random() < 0.7:
            tier.offer(keys, None, tokens, 0)
            new = [k for k in keys if k not in model]
            if len(new) > capacity:
                continue
            victims = [k for k in model if k not in keys][: max(0, len(model) + len(new) - capacity)]
            if len(model) + len(new) - len(victims) <= capacity:
                for k in victims:
                    del model[k]
                for k in new:
                    model[k] = None
        else:
            tier.on_request_finished(keys, set())
            for k in reversed(keys):
                if k in model:
                    model.move_to_end(k)
        assert tier.stored_keys() == set(model)
        assert tier.num_used_blocks + tier.num_free_blocks == capacity
        ids = [tier.host_block(k) for k in model]
        assert len(set(ids)) == len(ids) and all(0 <= i < capacity for i in ids)


def test_the_live_tree_keeps_the_cpu_pool_apart():
    """The events travel vLLM's wire format to the Live page's tree (`core.live.tree`), which draws one band
    per (group, medium): after HBM evicted a's tail, the CPU pool still holds both of a's blocks."""
    from core.kv.events import decode_event_batch, encode_event_batch
    from core.live.tree import CachedBlockTree

    m = manager(events=True)
    run(m, "a", A)
    run(m, "b", B)
    tree = CachedBlockTree()
    tree.apply_batch(decode_event_batch(encode_event_batch(m.take_events(), ts=1.0)))
    k1, k2 = chain(A, 4)
    assert set(tree.pools()) == {(0, "GPU"), (0, "CPU")}
    assert set(tree.blocks((0, "CPU"))) == {k1, k2, *chain(B, 4)}
    assert not {k1, k2} & set(tree.blocks((0, "GPU")))
    assert k1 in tree.roots((0, "CPU")) and tree.children((0, "CPU"), k1) == [k2]


def test_a_host_block_split_over_two_prefill_chunks_is_stored_whole():
    tier = HostTier(4, 2, blocks_per_host_block=2)
    tokens = [1, 1, 2, 2, 3, 3, 4, 4]
    keys = chain(tokens, 2)
    assert tier.offer(keys[:3], None, tokens[:6], 0) == 1  # host block 0 (GPU 0-1); GPU 2 waits for GPU 3
    assert tier.offer(keys[3:], keys[2], tokens[6:], 3) == 1  # completes host block 1 (GPU 2-3)
    assert tier.stored_keys() == {keys[1], keys[3]}
    assert tier.lookup(keys, tokens, 0, 4) == [tier.host_block(keys[1]), tier.host_block(keys[3])]
