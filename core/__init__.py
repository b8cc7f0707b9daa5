"""PagedAttention Lab core: a library with no Streamlit dependency.

The map of core. Each package, from the bottom up, names after "imports:" the packages of core it may import
(besides the top-level modules, which any package may import); a package never imports one listed after it, so
there is no upward arrow and no circle. `tests/test_core_map.py` reads this list and checks it against every
import statement of core (module level or inside a function), and that every `core.` name below exists.

- `core.kv` (imports: none): the one home of KV-cache memory: per-layer specs in vLLM V1's vocabulary
  (`core.kv.specs`), the one reader of a Hugging Face config's layer kinds (`core.kv.hf_config`) and of the
  shape facts the engine's and the planner's model views share (`core.kv.model_shape`), the layout
  arithmetic (`core.kv.layout`), the block pool, its single-type managers and the manager over them
  (`core.kv.block_pool`, `core.kv.single_type_manager`, `core.kv.kv_cache_manager`), block hashes, snapshots,
  vLLM's KV events (`core.kv.events`), the Orca baselines' buddy allocator (`core.kv.buddy_allocator`) and the
  scheduler's memory over the KV core, written once (`core.kv.scheduler_memory`).
- `core.paging` (imports: kv): the one-group block manager facade (`core.paging.block_manager`) and the torch
  tensors that hold the paged K/V (`core.paging.kv_cache`).
- `core.kernels` (imports: none): the paged attention API, its backends (torch, C for the CPU, Triton, gather)
  and their timing (`core.kernels.timer`, `core.kernels.timing`).
- `core.sched` (imports: kv): the continuous-batching scheduler (`core.sched.scheduler`), the slim memory
  protocol it drives (`core.sched.memory`, whose records and one implementation,
  `core.kv.scheduler_memory`, are the KV core's) and the run driver (`core.sched.driver`: one step, schedule ->
  allocate -> execute -> postprocess -> observe; the one run record: the step load `core.sched.step_load`, the
  step rows `core.sched.step_columns.StepRows` and the snapshots `core.sched.snapshots`), below both of its
  drivers, the simulator and the engine.
- `core.serving` (imports: kv, kernels, sched): workloads, memory policies, the serving simulator
  (`core.serving.simulator`), latency percentiles and steady state; a step's cost is injected (a step-time
  model), never read from planning.
- `core.planning.catalog` (imports: kv): what is given: model architectures (`core.planning.catalog.models`,
  presets from Hugging Face configs), GPUs (`core.planning.catalog.hardware`), stored weights' bytes
  (`core.planning.catalog.weights`). The planner is laid out by the question each part answers, from here up,
  and no part imports one above it (`tests/test_layers.py` checks the order module by module).
- `core.planning.memory` (imports: kv, planning.catalog): what fits: KV accounting
  (`core.planning.memory.kv_accounting`), the resolved deployment (`core.planning.memory.resolved`), the capacity
  plan (`core.planning.memory.plan`), the workload what-if, the `vllm serve` flags, vLLM's CPU KV space and the
  host KV tier.
- `core.planning.cost` (imports: kv, planning.catalog, planning.memory): what a step costs: the step-time model
  (`core.planning.cost.step_model`, the simulator's step cost, built by `step_time`), speculative decoding, our CPU engine's roofline.
- `core.planning.cost.fits` (imports: serving, planning.catalog, planning.memory, planning.cost): the step-time
  model fitted (`core.planning.cost.fits.step_fit`) to published and measured runs, and the engines' fitted
  profiles (`core.planning.cost.fits.engine_profiles`).
- `core.planning.predict` (imports: kv, serving, planning.catalog, planning.memory, planning.cost,
  planning.cost.fits): what one deployment does at one load, in steady state (`core.planning.predict.deployment`:
  `Deployment`; `core.planning.predict.prediction`: `predict`), disaggregated, and the highest rate within targets. Planning drives the simulator
  with its step-time model; serving never imports planning.
- `core.planning.search` (imports: serving, planning.catalog, planning.memory, planning.cost,
  planning.cost.fits, planning.predict): which deployment meets a latency SLO at the lowest cost
  (`core.planning.search.slo`).
- `core.planning.commands` (imports: planning.catalog, planning.memory, planning.cost, planning.predict,
  planning.search): `python -m core.planning`, argv -> JSON
  (`core.planning.commands.dispatch`).
- `core.planning` (imports: planning.commands): the package itself holds only `__main__`.
- `core.engine` (imports: kv, paging, kernels, sched, serving): a real Llama-family model run through the
  paged KV cache (config, weights, forward pass, sampling, the engine loop, its metrics and the sharing
  measurement; the real model's fetch and GGUF files).
- `core.live` (imports: kv): the client of a running vLLM (or fleet): its Prometheus metrics
  (`core.live.metrics`), its KV cache events over ZMQ with replay (`core.live.subscriber`) and the
  cached-block tree they describe (`core.live.tree`), polls over time and windows between two scrapes
  (`core.live.window`).
- `core.planning.observed` (imports: serving, planning.catalog, planning.memory, planning.cost,
  planning.cost.fits, engine, live): planning against what a running server
  reports: planned vs observed (`core.planning.observed.planned`, fitted to the server's histograms, with the
  model it plans with in `core.planning.observed.planned_model`) and a capacity plan beside a server's figures
  (`core.planning.observed.compare`).
- `core.serve` (imports: kv, engine): the engine served the way vLLM serves (OpenAI-style HTTP, `/metrics`
  with vLLM's names from `core.metric_names`, KV events on ZMQ): `python -m core.serve`; `core.serve.launcher`
  starts it on loopback for the Live page, the tests and `bench.serve`.
- `core.jobs` (imports: none): heavy work off the server process: the worker pool, the worker loop and the
  result caches; it runs the functions it is given.
- `core.page_models` (imports: kv, paging, kernels, serving, planning.catalog, planning.memory, planning.cost,
  planning.cost.fits, planning.predict, planning.search, engine, live, planning.observed): what
  a page computes (the planner's scenarios, the simulator's comparison, the playground and its guided
  scenarios, the Live page's planned vs observed, the heavy tasks pages submit to the worker pool,
  `core.jobs`, which does not import them back); it imports neither streamlit nor `ui`.

Top-level modules (they import no package of core, only each other): `core.errors` (every typed error, one
base class), `core.device` (torch device, memory budget), `core.common` (ceiling division, argument checks,
the budget check, timing), `core.limits` (operator limits read from the environment), `core.hosts` (where the
Live page may connect: PAGED_LAB_LIVE_HOSTS and the address classes it refuses), `core.uploads` (bounded
reading of uploaded files), `core.metric_names` (vLLM's metric names, labels and buckets: the vocabulary both
`core.live` reads and `core.serve` publishes), `core.fields` (an input's one declaration, `InputField`: flag, URL key,
bounds, label, default; the planner's input groups are made of it and the CLI flags, URL fields, widgets and
checks come from them).
"""
