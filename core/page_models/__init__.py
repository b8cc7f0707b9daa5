"""What a page computes: one layer above the domain packages and below `ui/` and `app_pages/`.

Each module here turns a page's parsed inputs into the data the page draws, by calling the domain packages:
- `planner`: the Planner page's scenarios (model, GPU, plan, workload what-if, an uploaded config.json).
- `simulator`: the Simulator page's parameters and the policy comparison behind it (the bench times it too).
- `slo_planner`: the SLO planner page's search (`plan_slo`), the configurations its chart draws, their latency
  against the rate (`latency_curve`) with the knee, the ranked table and the answer's `vllm serve` flags.
- `playground`: the block-manager playground session (a real `BlockManager` and `KVCache`, with history).
- `scenarios`: the playground's guided scripts, one sentence of narration per step.
- `tasks`: the heavy computations the pages submit to the worker pool (`core.jobs` runs them; it knows them only
  as the function objects it is given).

Layering rule (checked by tests/test_layers.py): modules here may import any domain package (`core.kv`,
`core.paging`, `core.kernels`, `core.serving`, `core.planning`, `core.engine`) and the top-level modules; no
domain package imports `core.page_models`, and nothing here imports streamlit, `ui` or `app_pages`.
"""
