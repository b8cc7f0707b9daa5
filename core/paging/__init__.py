"""Paged KV memory: the block manager, the KV tensors and the buddy allocator (the playground over them is in
`core.page_models`)."""
