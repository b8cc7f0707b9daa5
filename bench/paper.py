"""Reproduce the PagedAttention paper's Figure 2 and Figure 13 (ShareGPT, 2 req/s) for OPT-13B on one A100-40GB.

KV cache: 15,728 token slots (12 GiB / 800 KiB per token; Table 1's 15.7K). 2,000 ShareGPT-like requests, Poisson
at 2 req/s, seed 0; max_num_seqs 256, max_num_batched_tokens 2048, max length 2048, recompute preemption, paged
block size 16. Step time: weights + KV roofline at 80% of 1,555 GB/s and 50% of 312 TFLOP/s, plus 15 ms per step.
Shares are averaged over time between 10% and 100% of the last arrival (the steady state, not the final drain).

Prints one JSON object: {"policies": {"orca-max": {...}, "orca-pow2": {...}, "orca-oracle": {...}, "paged": {...}}},
each with token_states_pct, reservation_pct, internal_fragmentation_pct, external_fragmentation_pct (summing to 100),
avg_batched_requests and preemptions. external_fragmentation_pct here is the paper's "external fragmentation &
others": the simulator's allocator slack plus free memory (`summarize`'s external_fragmentation_pct + free_pct).

Usage: python -m bench.paper
"""

import json

from core.kernels.cpu_isa import cpu_description
from core.planning.cost.step_time import opt_13b_a100
from core.serving.memory_policies import orca_max, orca_oracle, orca_pow2, paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import sharegpt

PCT_KEYS = ("token_states_pct", "reservation_pct", "internal_fragmentation_pct", "external_fragmentation_pct")


def run(num_requests: int = 2000, rate: float = 2.0, seed: int = 0) -> dict:
    requests = sharegpt(num_requests, rate=rate, seed=seed)
    last = requests[-1].arrival_time
    config = SimulatorConfig(step_time=opt_13b_a100())
    out = {}
    for policy in (orca_max(), orca_pow2(), orca_oracle(), paged(16)):
        summary = simulate(requests, policy, config).summarize(0.1 * last, last)
        row = {key: round(summary[key], 2) for key in PCT_KEYS[:3]}
        # the paper's "& others" (allocator slack + free), so that the four sum to 100
        row["external_fragmentation_pct"] = round(100.0 - sum(row.values()), 2)
        row["avg_batched_requests"] = round(summary["avg_batched_requests"], 2)
        row["preemptions"] = summary["preemptions"]
        out[policy.name] = row
    return {"cpu": cpu_description(), "policies": out}


if __name__ == "__main__":
    print(json.dumps(run()))
