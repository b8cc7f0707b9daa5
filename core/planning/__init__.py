"""Capacity planning: model and GPU presets, KV accounting, plans, the workload what-if and the CLI."""
