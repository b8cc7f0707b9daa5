"""`PrefixHits`: a prompt's prefix-cache hit over every KV cache group of a `KVCacheManager` (vLLM V1's coordinator,
`find_longest_cache_hit` over the groups): each group's longest run of cached full blocks
(`SingleTypeKVCacheManager.find_longest_cache_hit`), the shortest of them rounded down to a multiple of every
group's block size, never the last prompt token. It keeps what only the lookup uses: the recently hashed prompts'
key chains per block size (`core.kv.block_hash.PrefixChains`, so a shared prefix is hashed once). It changes no
table and takes no block: `KVCacheManager.allocate` saves the hits it returns.
"""

from collections.abc import Sequence
from math import lcm

from core.kv.block_hash import PrefixChains
from core.kv.single_type_manager import SingleTypeKVCacheManager


class PrefixHits:
    """The hit lookup over `managers` (one per group, in order), keys made by `block_hasher` (`core.kv.block_hash`)."""

    def __init__(self, managers: Sequence[SingleTypeKVCacheManager], block_hasher):
        self.managers = tuple(managers)
        self.block_hasher = block_hasher
        self._hit_granularity = lcm(*(manager.block_size for manager in self.managers))
        self._chains: dict[int, PrefixChains] = {}  # block size -> recently hashed prompts' keys

    def find(self, tokens: list[int], hashes: dict[int, list[int]]) -> tuple[int, list[list[int]]]:
        """(hit tokens, hit blocks per group): the longest prefix cached in every group, last token excluded."""
        n = len(tokens)
        per_group = []
        # a block is then one tuple slice (tuple() of a tuple is itself), not two copies
        whole = tuple(tokens)
        known: dict[int, list] = {}  # block size -> the shared prefix's block keys (`PrefixChains.lookup`)
        for manager in self.managers:
            bs = manager.block_size
            keys = hashes.get(bs)
            if keys is None:  # a prompt's keys are computed once, a shared prefix's chain reused
                chains = self._chains.get(bs)
                if chains is None:
                    chains = self._chains[bs] = PrefixChains(bs, self.block_hasher)
                keys, known[bs] = chains.lookup(whole, (n - 1) // bs)
                hashes[bs] = keys
            per_group.append(manager.find_longest_cache_hit(keys, whole, (n - 1) // bs, known[bs]))
        hit_tokens = min(len(hits) * m.block_size for hits, m in zip(per_group, self.managers, strict=True))
        hit_tokens -= hit_tokens % self._hit_granularity
        return hit_tokens, [
            hits[: hit_tokens // m.block_size] for hits, m in zip(per_group, self.managers, strict=True)
        ]
