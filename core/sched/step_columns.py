"""`COLUMNS`: the per-step record both drivers of the scheduler keep, the serving simulator
(`core.serving.simulator`) and the engine (`core.engine.metrics`, which adds its own columns after these).

One row per step. Memory columns are `core.sched.memory.MemoryMetrics` in KV token slots (plus
`external_fragmentation`, the allocator slack: free memory is not waste); `time_s` is the end of the step in
seconds and `step_time_ms` its duration; counts are of requests (`running`, `waiting`, `swapped`), sequences
(`running_seqs`) or tokens (`tokens_generated`, `prefill_tokens`, `kv_tokens_read`, `prefix_hit_tokens`).
"""

COLUMNS = (
    "step",
    "time_s",
    "step_time_ms",
    "running",
    "running_seqs",
    "waiting",
    "swapped",
    "preemptions",
    "preemptions_total",
    "free_blocks",
    "free_slots",
    "token_states",
    "reservation",
    "internal_fragmentation",
    "allocator_slack",
    "external_fragmentation",
    "tokens_generated",
    "prefill_tokens",
    "kv_tokens_read",
    "prefix_hit_tokens",
)
