"""PagedAttention Lab core: a library with no Streamlit dependency.

Modules: `errors` (the typed errors), `device` (torch device and memory budget), `block_manager`
(paged KV block allocation metadata), `kv_cache` (the torch KV tensors).
"""
