"""PagedAttention Lab core: a library with no Streamlit dependency.

Subpackages:
- `core.paging`: the block manager (paged KV block metadata), the KV tensors, the buddy allocator, the playground.
- `core.kernels`: the paged attention API, its backends (torch, C for the CPU, Triton, gather) and their timing.
- `core.serving`: workloads, the scheduler, memory policies, step time, the serving simulator and its experiment.
- `core.planning`: model and GPU presets, KV accounting, capacity plans, the workload what-if and the CLI.

Top-level modules: `errors` (the typed errors, one base class), `device` (torch device, memory budget),
`common` (ceiling division, argument checks, the budget check, timing).
"""
