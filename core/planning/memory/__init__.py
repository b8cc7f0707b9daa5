"""What fits in memory: KV accounting (`kv_accounting`), the resolved deployment (`resolved`), the capacity plan
(`plan`, its types in `plan_types`, its decode roofline in `decode_roofline`), the workload what-if (`what_if`), the
`vllm serve` flags (`vllm_command`), vLLM's CPU KV space (`cpu_kv`) and the host KV tier (`offload`). Imports
`core.planning.catalog` only (of planning)."""
