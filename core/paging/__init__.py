"""Paged KV memory: the block manager, the KV tensors, the buddy allocator and the playground session."""
