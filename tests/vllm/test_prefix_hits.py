"""The KV core's prefix cache against a running vLLM's, request by request, through eviction.

Prompts share Zipf-drawn prefixes (a few hot, a tail of cold ones) and end in a unique suffix; they go to the real
vLLM one at a time (one output token each, so each request's blocks are freed before the next arrives) and to
the lab's `BlockManager` with the same pool: vLLM's 64 blocks less its null block 0. Together they prefill ~4.7x
the cache, so cold prefixes are evicted and come back as misses. vLLM's hits per request are the deltas of its
`vllm:prefix_cache_hits` counter (tokens); the lab's are `allocate`'s hit blocks x block size.
"""

import random

from core.live.metrics import parse_vllm_metrics
from core.paging.block_manager import BlockManager

NUM_REQUESTS = 28
NUM_PREFIXES = 12
ZIPF_S = 0.8


def _workload(seed: int, block_size: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [
        [
            rng.randrange(100, 49_000)
            for _ in range(rng.randrange(4, 12) * block_size + rng.randrange(block_size))
        ]
        for _ in range(NUM_PREFIXES)
    ]
    weights = [1 / (rank + 1) ** ZIPF_S for rank in range(NUM_PREFIXES)]
    prompts = []
    for _ in range(NUM_REQUESTS):
        prefix = rng.choices(prefixes, weights)[0]
        prompts.append(prefix + [rng.randrange(100, 49_000) for _ in range(rng.randrange(8, 120))])
    return prompts


def _hits(server) -> float:
    return parse_vllm_metrics(server.get("/metrics").decode()).prefix_cache_hits or 0.0


def test_prefix_hits_equal_vllms_request_by_request_through_eviction(real_vllm):
    block_size = real_vllm.block_size
    prompts = _workload(seed=3, block_size=block_size)
    usable_blocks = real_vllm.num_gpu_blocks_override - 1  # vLLM's block 0 is its null block
    assert sum(map(len, prompts)) > 2.5 * usable_blocks * block_size  # the cache overflows
    lab = BlockManager(usable_blocks, block_size, enable_prefix_caching=True)

    ours, theirs = [], []
    before = _hits(real_vllm)
    for index, prompt in enumerate(prompts):
        ours.append(lab.allocate(index, prompt) * block_size)
        lab.free(index)
        real_vllm.complete(prompt, max_tokens=1)
        after = _hits(real_vllm)
        theirs.append(after - before)
        before = after

    assert ours == theirs
    assert 0 < sum(ours) < sum(map(len, prompts))  # hits and misses both happened
    # eviction decided some of them: an unbounded cache would have hit more
    unbounded = BlockManager(10_000, block_size, enable_prefix_caching=True)
    for index, prompt in enumerate(prompts):
        unbounded.allocate(index, prompt)
        unbounded.free(index)
    assert unbounded.prefix_cache_stats.hits_tokens > sum(ours) + 20 * block_size
