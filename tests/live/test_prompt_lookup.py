"""Where is my prompt cached (`core.live.prompt_lookup`, `core.page_models.live_lookup`): the leading blocks a
tree holds, checked against the KV core's own prefix-cache hits (a KVCacheManager keyed by vLLM's hashes,
its events replayed into the tree), through eviction; the inputs' refusals; the labels' fetch."""

import random

import pytest

from core.errors import InvalidArgumentError, LiveEndpointError
from core.kv import FullAttentionSpec, KVCacheManager
from core.kv.block_hash import VllmBlockHasher, vllm_block_hashes
from core.kv.events import KVEventBatch
from core.live.prompt_lookup import PrefixLabels, first_words, lookup_prompt, parse_token_ids
from core.live.tree import CachedBlockTree
from core.page_models.live_lookup import LookupRequest, answer_lookup

BS = 16


def serve(kv: KVCacheManager, tree: CachedBlockTree, rid, prompt) -> int:
    hit = kv.allocate(rid, prompt)
    kv.mark_computed(rid, len(prompt))
    kv.free(rid)
    tree.apply_batch(KVEventBatch(0.0, kv.take_events()))
    return hit


def test_leading_blocks_equal_the_kv_cores_hits_through_eviction():
    """Every probe prompt (a shared system prefix, some branches, fresh text; lengths not multiples of the block
    size so the last-token rule does not cut a block) is looked up in the tree built from the events, then
    allocated: the tokens the lookup says are cached are the tokens the pool serves from cache."""
    rng = random.Random(7)
    kv = KVCacheManager(
        [FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8)],
        40,
        enable_prefix_caching=True,
        enable_kv_cache_events=True,
        block_hasher=VllmBlockHasher(),
    )
    tree = CachedBlockTree()
    system = [rng.randrange(5000) for _ in range(64)]
    branches = [system + [rng.randrange(5000) for _ in range(48)] for _ in range(4)]
    checked = 0
    for step in range(60):
        base = rng.choice(branches) if rng.random() < 0.7 else [rng.randrange(5000) for _ in range(80)]
        prompt = base[: rng.randrange(20, len(base) + 1)] + [
            rng.randrange(5000) for _ in range(rng.randrange(0, 40))
        ]
        if len(prompt) % BS == 0:
            prompt.append(1)
        (found,) = lookup_prompt(prompt, {"server": tree}) or [None]
        hit = serve(kv, tree, step, prompt)
        expected = 0 if found is None else found.cached_tokens
        assert hit == expected, (step, hit, found)
        checked += hit > 0
    assert checked > 10 and kv.pool.num_evicted_blocks > 0  # hits and evictions both happened


def test_lookup_per_server_and_medium_and_the_answer():
    prompt = list(range(100))
    hashes = vllm_block_hashes(prompt, BS)
    gpu, both = CachedBlockTree(), CachedBlockTree()
    from core.kv.events import BlockStored

    def store(tree, n, medium):
        tree.apply(BlockStored(hashes[:n], None, prompt[: n * BS], BS, None, medium, None))

    store(gpu, 2, "GPU")
    store(both, 6, "GPU")
    store(both, 3, "CPU")
    found = lookup_prompt(prompt, {"a": gpu, "b": both})
    assert [(p.server, p.medium, p.cached_blocks, p.num_blocks) for p in found] == [
        ("a", "GPU", 2, 6),
        ("b", "CPU", 3, 6),
        ("b", "GPU", 6, 6),
    ]
    answer = answer_lookup(
        LookupRequest(" ".join(map(str, prompt)), "token ids"), {"a": gpu, "b": both}, None
    )
    assert not answer.error and "b (GPU, group 0) caches the first 6 of the prompt's 6" in answer.sentence
    assert answer.rows[0]["cached tokens"] == 32 and answer.rows[2]["cached (% of prompt tokens)"] == 96.0
    fresh = answer_lookup(LookupRequest("500 501 502 " * 10, "token ids"), {"a": gpu, "b": both}, None)
    assert fresh.sentence.startswith("No server caches the prompt's first block (30 tokens, 1 full block)")
    salted = answer_lookup(LookupRequest("0 1 2 " * 40, "token ids", cache_salt="x"), {"b": both}, None)
    assert all(row["leading blocks cached"] == 0 for row in salted.rows)  # another tenant's salt: no hit
    other_seed = answer_lookup(
        LookupRequest(",".join(map(str, prompt)), "token ids", hash_seed="0"), {"b": both}, None
    )
    assert all(row["leading blocks cached"] == 0 for row in other_seed.rows)


def test_bad_inputs_are_messages():
    assert "not a non-negative integer" in answer_lookup(LookupRequest("1 2 x", "token ids"), {}, None).error
    assert "metrics URL" in answer_lookup(LookupRequest("hello", "text"), {}, None).error
    assert "xxhash" in answer_lookup(LookupRequest("1 2", "token ids", "xxhash"), {}, None).error
    assert parse_token_ids("[1, 2,3 4]") == [1, 2, 3, 4]
    with pytest.raises(InvalidArgumentError, match="no token ids"):
        parse_token_ids(" , ")
    with pytest.raises(InvalidArgumentError, match="1 to"):
        lookup_prompt([], {})


def test_labels_fetch_a_few_per_call_and_stop_at_a_failure():
    from core.live.tree import CachedBlock

    blocks = [CachedBlock(i, None, (i, i + 1)) for i in range(5)]
    labels = PrefixLabels(per_call=2)
    assert labels.fetch(blocks, lambda ids: f"tok{ids[0]} tok{ids[1]}") == 2
    assert labels.fetch(blocks, lambda ids: f"tok{ids[0]}") == 2 and labels.texts[3] == "tok3"

    def down(_ids):
        raise LiveEndpointError("http://127.0.0.1:1/detokenize: connection refused", "refused")

    assert labels.fetch(blocks, down) == 0 and "refused" in labels.error and 4 not in labels.texts
    assert first_words("  The quick brown fox jumps over the lazy dog") == "The quick brown fox jumps…"
    assert first_words("short") == "short"
