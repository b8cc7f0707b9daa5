"""`core.kv`: the one home of KV-cache memory, shaped like vLLM V1's KV cache manager.

- `specs`: what one layer keeps per block (full attention, sliding window, chunked local, MLA, Mamba).
"""

from core.kv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

__all__ = [
    "ChunkedLocalAttentionSpec",
    "FullAttentionSpec",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "SlidingWindowSpec",
]
