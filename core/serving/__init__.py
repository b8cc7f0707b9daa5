"""Serving simulation: workloads, memory policies (`paged_memory`: every KV cache group on one `core.kv` pool;
`counted_memory`: the same paged schedule by block counts alone, for planners; `contiguous_memory`: Orca's
buddy-allocated segments; `memory_policies`: their names and one interface), the simulator (`simulator`, with
`sim_config`, `sim_groups`, `sim_result` below it), per-request latency percentiles (`latency`) and the attention
measured on its batches (`step_attention`). The scheduler it drives lives below it, in `core.sched`.

Layering: serving never imports `core.planning`. What a step costs is injected (`sim_config.StepCost`, e.g.
`core.planning.cost.step_model.StepTimeModel`), so planning may drive the simulator (the SLO planner) and serving knows
no hardware. The Simulator page's parameters and policy comparison live above both, in
`core.page_models.simulator`."""
