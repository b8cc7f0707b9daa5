"""PagedAttention Lab core: a library with no Streamlit dependency.

Subpackages, from the bottom up:
- `core.kv`: the one home of KV-cache memory: per-layer KV cache specs in vLLM V1's vocabulary, the one reader
  of a Hugging Face config's layer kinds, and vLLM V1's layout arithmetic (groups, blocks, concurrency).
- `core.paging`: the block manager (paged KV block metadata), the KV tensors, the buddy allocator.
- `core.kernels`: the paged attention API, its backends (torch, C for the CPU, Triton, gather) and their timing.
- `core.sched`: the continuous-batching scheduler and the slim memory protocol it drives, below both the
  simulator and the engine (it imports neither).
- `core.serving`: workloads, memory policies, step time and the serving simulator.
- `core.planning`: model and GPU presets, KV accounting, capacity plans, the workload what-if and the CLI.
  Serving may import planning (the step-time model reads its presets' KV accounting); planning never imports
  serving.
- `core.engine`: a real Llama-family model run through the paged KV cache (config, weights, forward pass,
  sampling, the engine loop, its metrics and the sharing measurement; the real model's fetch and GGUF files).
- `core.live`: reading a running vLLM (or fleet): its Prometheus metrics, its KV cache events (ZMQ, with replay)
  and the cached-block tree they describe, and the planner's prediction beside what the server reports.
- `core.serve`: the engine served the way vLLM serves (OpenAI-style HTTP, `/metrics` with vLLM's names, KV events
  on ZMQ): `python -m core.serve`.
- `core.jobs`: heavy work off the server process: the worker pool, the worker loop and the result caches; it runs
  the functions it is given and imports no domain package.
- `core.page_models`: what a page computes (the planner's scenarios, the simulator's comparison, the playground
  and its guided scenarios, the heavy tasks pages submit to `core.jobs`), over the packages above; no domain
  package imports it, and it imports neither streamlit nor `ui`. `tests/test_layers.py` checks these layers.

Top-level modules: `errors` (every typed error, one base class), `device` (torch device, memory budget),
`common` (ceiling division, argument checks, the budget check, timing), `limits` (operator limits read from
the environment), `hosts` (where the Live page may connect: PAGED_LAB_LIVE_HOSTS and the address classes it
refuses), `uploads` (bounded reading of uploaded files).
"""
