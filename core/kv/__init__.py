"""`core.kv`: the one home of KV-cache memory, shaped like vLLM V1's KV cache manager.

- `specs`: what one layer keeps per block (full attention, sliding window, chunked local, MLA, Mamba).
- `hf_config`: the one reader of a Hugging Face config's layer kinds (`read_kv_layers`, `layer_specs`).
- `layout`: vLLM V1's layout arithmetic on the specs (`kv_cache_layout`, `KVCacheLayout`, `KVCacheGroup`).
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
