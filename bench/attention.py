"""Decode attention: paged (each backend) vs the contiguous baseline, measured in the same run. Prints one JSON.

    python bench/attention.py            # batch {1, 16, 64} x context {512, 2048, 8192} x dtypes
    python bench/attention.py --quick    # batch 16, context 2048, float32 only (under a minute)
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
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.device import default_device, device_label
from core.errors import BackendUnavailableError, MemoryBudgetError
from core.kernels.attention import available_backends
from core.kernels.cpu_backend import kernel_info
from core.kernels.cpu_isa import ENV_ISA, ISAS, cpu_description, isa_problem
from core.kernels.timer import apply_timing_settings
from core.kernels.timing import KernelConfig, check_budget, copy_bandwidth, measure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="batch 16, context 2048, float32 only")
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
        batches, contexts, dtypes = [16], [2048], ["float32"]
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
    print(json.dumps(report, indent=1))


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
