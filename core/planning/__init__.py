"""Capacity planning: model and GPU presets, KV accounting, plans, the step-time model (`step_time`) and its fit
(`step_fit`, `published`: the GPU efficiencies fitted to published figures), the SLO planner (`slo`,
`slo_candidates`, `slo_eval`, `slo_cli`: the cheapest deployment meeting a TTFT / TPOT p95 target; docs/slo.md),
the workload what-if and the CLI.

Layering: planning may import `core.serving` (it drives the simulator with its step-time model); serving never
imports planning, the one allowed direction. The Planner page's scenarios live above both in
`core.page_models.planner`."""
