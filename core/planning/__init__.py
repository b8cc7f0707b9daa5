"""Capacity planning: model and GPU presets, KV accounting, plans, the workload what-if and the CLI.

Layering: planning never imports `core.serving` (serving may import planning, the one allowed direction). The
Planner page's scenarios, which combine a plan with a serving workload, live above both in
`core.page_models.planner`."""
