"""`core.kv`: the one home of KV-cache memory, shaped like vLLM V1's KV cache manager.

- `specs`: what one layer keeps per block (full attention, sliding window, chunked local, MLA, Mamba).
- `events`: vLLM's KV cache events (BlockStored, BlockRemoved, AllBlocksCleared) and their msgpack wire format.
"""

from core.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_event_batch,
    encode_event_batch,
)
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
    "BlockRemoved",
    "BlockStored",
    "ChunkedLocalAttentionSpec",
    "FullAttentionSpec",
    "KVCacheSpec",
    "KVEventBatch",
    "MLAAttentionSpec",
    "MambaSpec",
    "SlidingWindowSpec",
    "decode_event_batch",
    "encode_event_batch",
]
