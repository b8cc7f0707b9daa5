"""The one-group block manager facade and the KV tensors, over `core.kv`.

Why not in `core.kv`: `BlockManager` holds no pool, table or snapshot type of its own (its pool, tables and
snapshot are `core.kv`'s); it is the facade for callers that write K/V at once (the playground, the paged
`KVCache` here), caching a block as soon as it fills. `KVCache` holds torch tensors, which `core.kv` (metadata
only, no torch) never touches. The playground over them is in `core.page_models`."""
