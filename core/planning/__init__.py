"""Capacity planning: model and GPU presets, KV accounting, plans, the step-time model, the workload what-if and
the CLI.

Layering: planning may import `core.serving` (it drives the simulator with its step-time model); serving never
imports planning, the one allowed direction. The Planner page's scenarios live above both in
`core.page_models.planner`."""
