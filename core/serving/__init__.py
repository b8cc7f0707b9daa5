"""Serving simulation: workloads, memory policies (paged, hybrid on one `core.kv` pool, Orca's contiguous ones),
step time, the simulator and its experiment. The scheduler it drives lives below it, in `core.sched`."""
