"""Simulator speed: 10,000 ShareGPT-like requests (2 req/s, seed 0) on the paper's 15,728-slot cache, per policy
(paged block size 16), the Simulator page's default run (1,000 requests, every default policy), and the hybrid
paged policy (every KV cache group on one pool) for gpt-oss-20b's groups on a tenth of the requests.

Prints one JSON object: {"num_requests": 10000, "policies": {name: {"wall_s", "tokens_per_s"}}, "page_default":
{"num_requests", "wall_s"}, "hybrid": {"model", "num_requests", "wall_s", "tokens_per_s"}}; tokens_per_s counts
simulated tokens (prompt + generated) per wall second.
Targets (2-core machine): each policy <= 10 s, the page default <= 2 s.

Usage: python -m bench.simulator [--quick]   (--quick: 1,000 requests instead of 10,000, ~10x faster)
"""

import json
import sys
import time

from core.kernels.cpu_isa import cpu_description
from core.page_models.simulator import DEFAULT_PARAMS, model_kv_groups, run_comparison
from core.planning.cost.step_time import opt_13b_a100
from core.serving.memory_policies import Policy, orca_max, orca_oracle, orca_pow2, paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import sharegpt


def main(num_requests: int = 10_000) -> dict:
    requests = sharegpt(num_requests, rate=2.0, seed=0)
    tokens = sum(r.prompt_len + r.n * r.output_len for r in requests)
    policies = {}
    for policy in (paged(16), orca_max(), orca_pow2(), orca_oracle()):
        started = time.perf_counter()
        simulate(requests, policy, SimulatorConfig(step_time=opt_13b_a100()))
        wall = time.perf_counter() - started
        policies[policy.name] = {"wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall)}
    started = time.perf_counter()
    run_comparison(DEFAULT_PARAMS)
    page_wall = time.perf_counter() - started
    hybrid_requests = requests[: num_requests // 10]
    hybrid_tokens = sum(r.prompt_len + r.n * r.output_len for r in hybrid_requests)
    started = time.perf_counter()
    simulate(
        hybrid_requests,
        Policy("paged", 16, kv_groups=model_kv_groups("gpt-oss-20b")),
        SimulatorConfig(step_time=opt_13b_a100()),
    )
    hybrid_wall = time.perf_counter() - started
    return {
        "cpu": cpu_description(),
        "num_requests": num_requests,
        "policies": policies,
        "page_default": {"num_requests": DEFAULT_PARAMS.num_requests, "wall_s": round(page_wall, 3)},
        "hybrid": {
            "model": "gpt-oss-20b",
            "num_requests": len(hybrid_requests),
            "wall_s": round(hybrid_wall, 3),
            "tokens_per_s": round(hybrid_tokens / hybrid_wall),
        },
    }


if __name__ == "__main__":
    print(json.dumps(main(1_000 if "--quick" in sys.argv[1:] else 10_000)))
