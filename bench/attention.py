"""Decode attention: paged (each backend) vs the contiguous baseline, measured in the same run. Prints one JSON.

    python bench/attention.py            # batch {1, 16, 64} x context {512, 2048, 8192} x dtypes
    python bench/attention.py --quick    # batch 16, context 2048, float32 and bfloat16 (about a minute)
    python bench/attention.py --quick --isa avx2   # the "cpu" C kernel built for AVX2 (PAGED_LAB_CPU_ISA)

Backends: every one `core.kernels.attention.available_backends` lists for the device (on CPU: "cpu", the in-place C
kernel, where a C compiler built it; "torch"; "gather"), or --backends. 32 query / 8 KV heads, head_dim 128,
block size 16. Dtypes float32 and bfloat16 (and float16 on CUDA).
Problems whose paged cache + copies exceed the memory budget (core.device.memory_budget_bytes) are skipped and
listed under "skipped". The contiguous baseline is the faster of SDPA and a grouped-query matmul on the same
contiguous K/V; copy_gbps is dst.copy_(src) into a preallocated tensor, counting bytes read + written.
The JSON names the machine ("cpu": model, family/model numbers, vector features, logical CPUs), the ISA the C
kernel was built for and its tiles ("cpu_kernel", as the built library reports them), and the ISA torch's own CPU
kernels dispatch to ("torch_cpu_capability": the contiguous baseline's; ATEN_CPU_CAPABILITY=avx2 lowers it).

On CPU, vLLM's own CPU paged-attention kernel (from the vLLM in .venv-vllm, `python -m core.serve.vllm_env
install`) is a second baseline: "vllm_kernel" holds, per problem and dtype vLLM supports, the lab's `cpu` kernel
and vLLM's `cpu_attention_with_kv_cache` timed on the same query and K/V, paired round by round (bench/vllm_kernel.py
says how), and "lab_over_vllm" the median ratio per dtype (below 1: the lab's kernel is faster). Without vLLM
installed (or with --no-vllm) "vllm_kernel" says why there is none and the rest runs as before.
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.device import default_device, device_label
from core.errors import BackendUnavailableError, LabError, MemoryBudgetError
from core.kernels.attention import available_backends
from core.kernels.cpu_backend import kernel_info
from core.kernels.cpu_isa import ENV_ISA, ISAS, cpu_description, isa_problem
from core.kernels.timer import apply_timing_settings
from core.kernels.timing import KernelConfig, check_budget, copy_bandwidth, measure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="batch 16, context 2048, float32 and bfloat16")
    parser.add_argument(
        "--no-vllm",
        action="store_true",
        help="skip vLLM's CPU kernel baseline (CPU runs only; needs .venv-vllm)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--repeats", type=int, default=11, help="timed rounds per measurement (median and quartiles kept)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds before each measurement")
    parser.add_argument("--backends", default=None, help="comma-separated, default: every backend available")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,16,64)")
    parser.add_argument(
        "--contexts", default=None, help="comma-separated context lengths (default 512,2048,8192)"
    )
    parser.add_argument(
        "--dtypes", default=None, help="comma-separated dtypes (default float32,bfloat16[,float16])"
    )
    parser.add_argument(
        "--isa",
        choices=ISAS,
        default=None,
        help=f"ISA the 'cpu' C kernel is built for (sets {ENV_ISA}; default: its value, else native)",
    )
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="keep glibc's default mmap/trim thresholds (see core.kernels.timer.tune_malloc)",
    )
    return parser


def problem_grid(args, device: torch.device) -> tuple[list[int], list[int], list[str]]:
    """The batches, context lengths and dtypes to measure: --quick's one problem or the full grid, each
    overridden by its own flag."""
    if args.quick:
        batches, contexts, dtypes = [16], [2048], ["float32", "bfloat16"]
    else:
        batches, contexts = [1, 16, 64], [512, 2048, 8192]
        dtypes = ["float32", "bfloat16"] + (["float16"] if device.type == "cuda" else [])
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    if args.contexts:
        contexts = [int(c) for c in args.contexts.split(",")]
    if args.dtypes:
        dtypes = args.dtypes.split(",")
    return batches, contexts, dtypes


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.isa is not None:
        os.environ[ENV_ISA] = args.isa
        problem = isa_problem(args.isa)
        if problem is not None:
            parser.error(problem)
    malloc_tuning = not args.no_malloc_tuning
    settings = apply_timing_settings(malloc_tuning)

    device = torch.device(args.device) if args.device else default_device()
    backends = args.backends.split(",") if args.backends else available_backends(device)
    batches, contexts, dtypes = problem_grid(args, device)

    copy = copy_bandwidth(device, malloc_tuning=malloc_tuning)
    report = {
        "device": device_label(device),
        **_machine(device),
        "threads": settings.threads,
        "malloc_tuning": settings.malloc_tuning,
        "settings": settings.as_dict(),
        "copy": copy,
        "copy_gbps": round(copy["median"], 2),
        "results": [],
        "skipped": [],
        "note": "medians of --repeats interleaved rounds after --warmup, with quartiles (_p25, _p75); ratio = "
        "median over rounds of paged_ms / contiguous_ms in the same round; achieved_gbps = K+V bytes read / "
        "paged_ms (1e9 bytes/s); busy: other processes took CPU during the measurement (other_cores)",
    }
    for dtype in dtypes:
        for batch in batches:
            for context in contexts:
                config = KernelConfig(batch=batch, context_len=context, dtype=dtype)
                try:
                    check_budget(config)
                except MemoryBudgetError as error:
                    report["skipped"].append(
                        {"batch": batch, "context_len": context, "dtype": dtype, "why": str(error)}
                    )
                    continue
                report["results"].extend(
                    measure(
                        config,
                        backends,
                        device,
                        repeats=args.repeats,
                        warmup=args.warmup,
                        malloc_tuning=malloc_tuning,
                    )
                )
                print(f"done batch {batch} context {context} {dtype}", file=sys.stderr, flush=True)
    if device.type == "cpu":
        report.update(_vllm_baseline(args, backends, batches, contexts, dtypes))
    print(json.dumps(report, indent=1))


def _vllm_baseline(
    args, backends: list[str], batches: list[int], contexts: list[int], dtypes: list[str]
) -> dict:
    """{"vllm_kernel": {vllm, torch, threads, results} or {"error": why none}, "lab_over_vllm": {dtype: ratio}}:
    the lab's `cpu` kernel against vLLM's CPU kernel on every problem of the grid in a dtype both support."""
    if args.no_vllm:
        return {"vllm_kernel": {"error": "skipped (--no-vllm)"}}
    if "cpu" not in backends:
        return {"vllm_kernel": {"error": "the lab's `cpu` C kernel is not among the backends measured"}}
    from bench.vllm_kernel import VLLM_DTYPES, VLLMKernel, compare

    results = []
    try:
        with VLLMKernel(torch.get_num_threads()) as kernel:
            for dtype in [d for d in dtypes if d in VLLM_DTYPES]:
                for batch in batches:
                    for context in contexts:
                        config = KernelConfig(batch=batch, context_len=context, dtype=dtype)
                        try:
                            check_budget(config)
                        except MemoryBudgetError:
                            continue  # listed under "skipped" already
                        results.append(compare(config, kernel, repeats=args.repeats, warmup=args.warmup))
                        print(
                            f"vllm kernel batch {batch} context {context} {dtype}",
                            file=sys.stderr,
                            flush=True,
                        )
            info = kernel.info
    except LabError as error:
        return {"vllm_kernel": {"error": str(error)}}
    ratios: dict[str, list[float]] = {}
    for row in results:
        ratios.setdefault(row["dtype"], []).append(row["ratio"])
    return {
        "vllm_kernel": {**info, "results": results},
        "lab_over_vllm": {dtype: statistics.median(values) for dtype, values in ratios.items()},
    }


def _machine(device: torch.device) -> dict:
    """The CPU, the C kernel's build (or why there is none) and torch's CPU dispatch level, for a CPU run."""
    if device.type != "cpu":
        return {}
    try:
        kernel = kernel_info()
    except BackendUnavailableError as error:
        kernel = {"error": str(error)}
    return {
        "cpu": cpu_description(),
        "cpu_kernel": kernel,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


if __name__ == "__main__":
    main()
