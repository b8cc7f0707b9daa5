"""Planning against a running server: what sits above the `core.live` client.

- `planned`: planned vs observed: fit the step-time model to a server's histograms over a window and predict the
  window's TTFT / TPOT percentiles with the simulator (`plan_against_observed`; method in docs/live-planned.md);
- `planned_model`: what it plans with: the roofline of the server's model on its hardware, the scheduler limits;
- `compare`: a capacity plan (`core.planning.memory.plan`) beside what a server's /metrics report (`compare_with_server`).
"""
