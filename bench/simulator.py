"""Simulator speed: 10,000 ShareGPT-like requests (2 req/s, seed 0) on the paper's 15,728-slot cache, per policy
(paged block size 16), and the Simulator page's default run (1,000 requests, every default policy).

Prints one JSON object: {"num_requests": 10000, "policies": {name: {"wall_s", "tokens_per_s"}}, "page_default":
{"num_requests", "wall_s"}}; tokens_per_s counts simulated tokens (prompt + generated) per wall second.
Targets (2-core machine): each policy <= 10 s, the page default <= 2 s.

Usage: python -m bench.simulator [--quick]   (--quick: 1,000 requests instead of 10,000, ~10x faster)
"""

import json
import sys
import time

from core.page_models.simulator import DEFAULT_PARAMS, run_comparison
from core.serving.memory_policies import orca_max, orca_oracle, orca_pow2, paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import sharegpt


def main(num_requests: int = 10_000) -> dict:
    requests = sharegpt(num_requests, rate=2.0, seed=0)
    tokens = sum(r.prompt_len + r.n * r.output_len for r in requests)
    policies = {}
    for policy in (paged(16), orca_max(), orca_pow2(), orca_oracle()):
        started = time.perf_counter()
        simulate(requests, policy, SimulatorConfig())
        wall = time.perf_counter() - started
        policies[policy.name] = {"wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall)}
    started = time.perf_counter()
    run_comparison(DEFAULT_PARAMS)
    page_wall = time.perf_counter() - started
    return {
        "num_requests": num_requests,
        "policies": policies,
        "page_default": {"num_requests": DEFAULT_PARAMS.num_requests, "wall_s": round(page_wall, 3)},
    }


if __name__ == "__main__":
    print(json.dumps(main(1_000 if "--quick" in sys.argv[1:] else 10_000)))
