"""Time the capacity planner and print one JSON object.

- plan_us: one `plan()` (Llama-3.1-70B on 4 x H100, fp8 KV), median over repeats, microseconds.
- what_if: `workload_what_if` on 10,000 ShareGPT-like requests (closed-form sums over each request's decode
  steps) against a step-by-step Python count of the same blocks, in the same run: both wall times, their ratio
  (the target: closed form >= 20x faster), and whether both give the same mean blocks held.
- sweep_ms: everything the Planner page computes for its default view (2 scenarios, 3 GPUs x 12 context
  lengths, fragmentation for 9 block sizes, 1,000 requests), milliseconds.

Usage: python -m bench.planner [--quick]
"""

import argparse
import json
import platform
import statistics
import time

from core.kernels.cpu_isa import cpu_description
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.plan import concurrency_vs_context, plan
from core.planning.memory.what_if import fragmentation_by_block_size, workload_what_if
from core.serving.workload import sharegpt


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _step_by_step_blocks(requests, block_size: int) -> float:
    blocks = steps = 0
    for prompt, output in requests:
        for t in range(1, output + 1):
            blocks += -(-(prompt + t) // block_size)
            steps += 1
    return blocks / steps


def main(quick: bool = False) -> dict:
    model, gpu = MODELS["llama-3.1-70b"], GPUS["h100-80gb"]
    capacity = plan(model, gpu, tensor_parallel=4, kv_dtype="fp8", max_model_len=4096)
    plan_s = _median_seconds(
        lambda: plan(model, gpu, tensor_parallel=4, kv_dtype="fp8", max_model_len=4096), 50 if quick else 500
    )

    num_requests = 2_000 if quick else 10_000
    requests = [(r.prompt_len, r.output_len) for r in sharegpt(num_requests, seed=0, max_len=4096)]
    closed_s = _median_seconds(lambda: workload_what_if(capacity, requests), 5)
    started = time.perf_counter()
    brute = _step_by_step_blocks(requests, capacity.block_size)
    brute_s = time.perf_counter() - started
    what_if = workload_what_if(capacity, requests)

    def page_default():
        page_requests = [(r.prompt_len, r.output_len) for r in sharegpt(1000, seed=0, max_len=4096)]
        contexts = [1 << k for k in range(9, 18)]
        for g, tp in (("h100-80gb", 4), ("h200-141gb", 2)):
            p = plan(model, GPUS[g], num_gpus=tp, tensor_parallel=tp, kv_dtype="fp8", max_model_len=4096)
            workload_what_if(p, page_requests)
            fragmentation_by_block_size(page_requests)
            for other in ("a100-80gb", "h200-141gb", "h100-80gb"):
                q = plan(
                    model, GPUS[other], num_gpus=4, tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
                )
                concurrency_vs_context(q, contexts)

    sweep_s = _median_seconds(page_default, 5)
    return {
        "machine": f"{platform.machine()} {platform.python_version()}",
        "cpu": cpu_description(),
        "plan_us": round(plan_s * 1e6, 1),
        "what_if": {
            "num_requests": num_requests,
            "closed_form_ms": round(closed_s * 1e3, 2),
            "step_by_step_ms": round(brute_s * 1e3, 1),
            "speedup": round(brute_s / closed_s, 1),
            "same_mean_blocks": abs(what_if.mean_blocks_held - brute) < 1e-9 * brute,
            "mean_blocks_held": round(what_if.mean_blocks_held, 4),
            "paged_memory_concurrency": round(what_if.paged_memory_concurrency, 1),
            "contiguous_memory_concurrency": what_if.contiguous_memory_concurrency,
        },
        "sweep_ms": round(sweep_s * 1e3, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.planner", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and requests")
    print(json.dumps(main(parser.parse_args().quick)))
