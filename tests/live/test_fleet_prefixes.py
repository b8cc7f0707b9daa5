"""Where each prefix lives in a fleet: replicas are the lab's KV core with events on (what a vLLM server publishes),
requests routed round-robin or by prefix; the trees built from their events are compared with what was sent
(brute force over the prompts) and with each replica's own prefix-cache lookup."""

import hashlib

import msgspec

from core.kv.block_hash import extend_block_hashes
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.specs import FullAttentionSpec
from core.live.fleet_prefixes import cached_prompt_tokens, fleet_prefixes
from core.live.tree import CachedBlockTree

BS = 4
SPEC = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8)


def _prompt(prefix: int, request: int) -> list[int]:
    """3 blocks of prefix `prefix`'s tokens, then 2 blocks and 1 token of the request's own."""
    return [1000 * (prefix + 1) + j for j in range(3 * BS)] + [
        10**6 + 100 * request + j for j in range(2 * BS + 1)
    ]


class _SaltedManager(KVCacheManager):
    """A server whose block hashes differ from every other's (vLLM's per-process hash seed)."""

    def __init__(self, salt: int):
        super().__init__([SPEC], 64, enable_prefix_caching=True, enable_kv_cache_events=True)
        self.salt = salt


def _serve(routing):
    """8 requests over 4 prefixes (2 each) on 2 replicas; each runs to completion (prompt computed, freed)."""
    replicas = [
        KVCacheManager([SPEC], 64, enable_prefix_caching=True, enable_kv_cache_events=True) for _ in "ab"
    ]
    sent = {0: [], 1: []}
    for request in range(8):
        prefix = request % 4
        target = request % 2 if routing == "round-robin" else prefix % 2
        prompt = _prompt(prefix, request)
        replicas[target].allocate(request, prompt)
        replicas[target].mark_computed(request, len(prompt))
        replicas[target].free(request)
        sent[target].append(prompt)
    trees = {}
    for name, manager in zip("ab", replicas, strict=True):
        trees[name] = CachedBlockTree()
        for event in manager.take_events():
            trees[name].apply(event)
    return replicas, trees, sent


def _chains(prompts):
    """Every cached block's content as the token chain from its prompt's start (brute force)."""
    return {tuple(p[: (i + 1) * BS]) for p in prompts for i in range(len(p) // BS)}


def test_round_robin_caches_every_prefix_twice_prefix_routing_once():
    """Each replica's cached blocks, the blocks on both and the extra copies equal the brute-force token chains of
    the prompts each replica was sent, under either routing."""
    for routing in ("round-robin", "prefix"):
        _, trees, sent = _serve(routing)
        fleet = fleet_prefixes(trees)
        chains = {name: _chains(sent[i]) for i, name in enumerate("ab")}
        union = chains["a"] | chains["b"]
        both = chains["a"] & chains["b"]
        assert fleet.distinct_blocks == len(union)
        assert fleet.duplicated_blocks == len(both)
        assert fleet.extra_copies == len(both)
        for replica in fleet.replicas:
            assert replica.blocks == len(chains[replica.name])
            assert replica.shared == len(both)
            assert replica.orphans == 0
        assert sum(r.blocks for r in fleet.replicas) == fleet.distinct_blocks + fleet.extra_copies


def test_scattered_prefixes_are_memory_spent_twice():
    """Requests of one prefix sent to both replicas: its 3 prefix blocks are cached on both (3 extra copies a
    prefix); routed by prefix, none is."""
    scattered = _fleet(lambda request, prefix: request % 2)
    partitioned = _fleet(lambda request, prefix: prefix % 2)
    assert scattered.duplicated_blocks == 2 * 3 and scattered.extra_copies == 6
    assert partitioned.duplicated_blocks == 0
    assert scattered.first_blocks[0][1] == ("a", "b")  # a prefix's first block, held by both
    assert all(len(names) == 1 for _, names in partitioned.first_blocks)


def _fleet(route):
    trees = {name: CachedBlockTree() for name in "ab"}
    replicas = {name: _SaltedManager(salt) for salt, name in enumerate("ab")}
    for request in range(8):
        prefix = request // 4  # prefixes 0 and 1, four requests each: 0..3 then 4..7
        name = "ab"[route(request, prefix)]
        prompt = _prompt(prefix, request)
        replicas[name].allocate(request, prompt)
        replicas[name].mark_computed(request, len(prompt))
        replicas[name].free(request)
    for name, manager in replicas.items():
        for event in manager.take_events():
            trees[name].apply(_salted(event, manager.salt))
    return fleet_prefixes(trees)


def _salted(event, salt):
    """The event as a server with another hash function would send it: every hash rewritten."""

    def salted(h):
        return (
            None if h is None else int.from_bytes(hashlib.sha256(f"{salt}:{h}".encode()).digest()[:8], "big")
        )

    if not hasattr(event, "block_hashes"):
        return event
    changes = {"block_hashes": [salted(h) for h in event.block_hashes]}
    if hasattr(event, "parent_block_hash"):
        changes["parent_block_hash"] = salted(event.parent_block_hash)
    return msgspec.structs.replace(event, **changes)


def test_prompt_lookup_per_replica_equals_each_replicas_own_cache():
    replicas, trees, _ = _serve("prefix")
    for prefix, request in ((0, 90), (1, 91), (3, 92)):
        prompt = _prompt(prefix, request)
        got = cached_prompt_tokens(trees, prompt, BS)
        keys = []
        extend_block_hashes(keys, prompt, BS, (len(prompt) - 1) // BS)
        for name, manager in zip("ab", replicas, strict=True):
            assert got[name] == manager.num_cached_prefix_blocks(keys) * BS
        assert sorted(got.values()) == [0, 3 * BS]  # the prefix lives on exactly one replica
    assert cached_prompt_tokens(trees, _prompt(0, 4), BS) == {"a": 5 * BS, "b": 0}  # request 4 ran on a
