"""Serving simulation: workloads, memory policies (paged, hybrid on one `core.kv` pool, Orca's contiguous ones),
step time and the simulator. The scheduler it drives lives below it, in `core.sched`.

Layering: serving may import `core.planning` (the step-time model `step_time.from_specs` reads the model and GPU
presets' KV accounting); planning never imports serving. The Simulator page's parameters and policy comparison
live above both, in `core.page_models.simulator`."""
