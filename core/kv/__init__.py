"""`core.kv`: the one home of KV-cache memory, shaped like vLLM V1's KV cache manager.

- `specs`: what one layer keeps per block (full attention, sliding window, chunked local, MLA, Mamba).
- `hf_config`: the one reader of a Hugging Face config's layer kinds (`read_kv_layers`, `layer_specs`).
- `model_shape`: the one model vocabulary: the facts of a model's shape the engine's `ModelConfig` and the
  planner's `ModelSpec` share (`ModelShape`), read from a config by `read_model_shape`.
- `layout`: vLLM V1's layout arithmetic on the specs (`kv_cache_layout`, `KVCacheLayout`, `KVCacheGroup`).
- `events`: vLLM's KV cache events (BlockStored, BlockRemoved, AllBlocksCleared) and their msgpack wire format.
- `block_hash`: the chained prefix-cache key of a full block.
- `block_pool`: `BlockPool`, the one pool of block ids for every group: free queues, ref counts, the prefix
  cache, the event queue; `PoolHook`, its connector seam (what enters and leaves the cache, external lookups).
- `single_type_manager`: one group's block tables by layer kind (full, sliding window, chunked local, Mamba).
- `kv_cache_manager`: `KVCacheManager`, every group of a model over one pool: allocate, mark_computed,
  append_token, fork (copy-on-write), free, block_ids.
- `block_counts`: the block-count arithmetic the manager's questions are answered with, over its groups' managers
  (`blocks_needed`, `max_blocks_held`, `num_blocks_held`, `blocks_to_append`: the blocks-per-step count).
- `prefix_hits`: `PrefixHits`, composed into the manager: a prompt's prefix-cache hit over every group.
- `host_loads`: the manager's side of a host tier: `check_host_tier`, and `HostLoads`, composed into the manager
  (the host-to-GPU copies a host hit lists, what the tier is told when a request ends).
- `host_tier`: `HostTier`, the host-memory tier behind the pool (vLLM's native CPU offloading; the pool's
  `PoolHook`): its capacity
  by vLLM's arithmetic (`host_tier_num_blocks`), stores as blocks are computed, LRU / ARC eviction, the
  `HostLoad` copies a host hit lists for the executor, events with medium "CPU".
- `bulk_decode`: `BulkDecode`, composed into the manager: many decode steps at once (`decode_steps`) and the
  k-step decode prediction (`num_free_blocks_after_decode`), through the manager's public members.
- `scheduler_memory`: `KVSchedulerMemory`, the scheduler's memory protocol over `KVCacheManager` written once
  (the engine and the simulator configure it with a `KVHook`), and the records it exchanges (`MemoryMetrics`,
  `Admission`).
- `snapshot`: `KVCacheSnapshot`, a frozen picture of a pool for plots and tests, and `slot_usage`, where the held
  slots are.

Block counts have one vocabulary: table entries (`num_required_blocks`) and skipped entries
(`num_skipped_blocks`) per group, and from them blocks a change takes (`num_new_blocks`, `blocks_needed`,
`num_blocks_to_allocate`, `num_blocks_to_append`, `num_blocks_for_decode`, `num_blocks_to_write`), blocks a
request holds (`num_held_blocks`, `num_blocks_held`, `max_blocks_held`) and the pool's free blocks
(`num_free_blocks`, `num_free_blocks_after_decode`); docs/api.md lists them. The manager's arithmetic over its
groups lives in `block_counts`.
"""

from core.kv.block_pool import BlockPool, PoolHook
from core.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_event_batch,
    encode_event_batch,
)
from core.kv.host_tier import HostLoad, HostTier, host_tier_num_blocks
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.single_type_manager import BlockCopy, KVCacheBlocks
from core.kv.snapshot import KVCacheSnapshot
from core.kv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

__all__ = [
    "AllBlocksCleared",
    "BlockCopy",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "ChunkedLocalAttentionSpec",
    "FullAttentionSpec",
    "HostLoad",
    "HostTier",
    "KVCacheBlocks",
    "KVCacheManager",
    "KVCacheSnapshot",
    "KVCacheSpec",
    "KVEventBatch",
    "MLAAttentionSpec",
    "MambaSpec",
    "PoolHook",
    "SlidingWindowSpec",
    "decode_event_batch",
    "encode_event_batch",
    "host_tier_num_blocks",
]
