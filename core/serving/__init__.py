"""Serving: workloads, the scheduler, memory policies, step time, the simulator and its experiment."""
