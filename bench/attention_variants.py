"""The `cpu` C kernel built with compile-time variants, each timed against vLLM's CPU kernel in the same rounds.
Prints one JSON.

    python -m bench.attention_variants                                  # the kernel as built, fp32, 2 threads
    python -m bench.attention_variants --threads 1 --cpu-time \\
        --variant shipped --variant PF_LOCALITY=3                        # L2 (shipped) vs L1 prefetch, one core
    python -m bench.attention_variants --dtype bfloat16 --isa avx2 --variant "PV_T=8 PF_BLOCKS=2"

What the kernel's docs (docs/kernels-isa.md) say a compile-time choice costs is measured here: each --variant is
the kernel's source (core/kernels/paged_rows.c) built with those macros defined (-DNAME=VALUE for each
space-separated NAME=VALUE; the tunables: PF_LOCALITY, PF_BLOCKS, PV_T, QK_T, PV_G; "shipped" defines none) for
--isa, with the flags the "cpu" backend uses for that ISA. The problem is bench.attention --quick's (batch 16, context 2,048, 32 query / 8 KV heads, head_dim 128, blocks
of 16, random block order); vLLM's `cpu_attention_with_kv_cache` runs on the same values in its own cache (blocks of
32, bench/vllm_kernel.py). Every round runs each variant once, then vLLM once; ratio = median over rounds of
variant / vLLM in the same round.

--cpu-time times the CPU each call used (`time.process_time` of this process, and of vLLM's worker process) instead
of wall time: on a machine shared with other jobs, a call whose thread was descheduled does not count the time it
waited, so with --threads 1 the figure is the kernel's own cost, memory stalls included. With several threads
it also counts the OpenMP threads' spinning at the region's end, so use it with --threads 1.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.vllm_kernel import VLLMKernel
from core.kernels import cpu_backend
from core.kernels.attention import contiguous_attention
from core.kernels.cpu_isa import FLAG_SETS, ISAS, cpu_description, isa_problem
from core.kernels.timer import LoadMonitor, apply_timing_settings, spread
from core.kernels.timing import KernelConfig, _quartiles, make_problem, tolerance


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attention_variants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        help='macros to define, e.g. "PF_LOCALITY=3 PV_T=8" (repeatable; "shipped": none; default: shipped)',
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument(
        "--isa", default="native", choices=ISAS, help="the build's target (as bench.attention)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="threads of both kernels (default: torch's)"
    )
    parser.add_argument("--cpu-time", action="store_true", help="time CPU used per call, not wall time")
    parser.add_argument("--rounds", type=int, default=12, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    return parser


def defines(variant: str) -> list[str]:
    """The compiler arguments of a --variant: -DNAME=VALUE per NAME=VALUE, none for "shipped"."""
    if variant.strip() in ("", "shipped"):
        return []
    return [f"-D{item}" for item in variant.split()]


def build_variant(extra: list[str], isa: str, directory: Path) -> dict:
    """The kernel's source built for `isa` with `extra` compiler arguments: {"lib", "info"} as cpu_backend loads
    a build (the first of the ISA's flag sets that compiles)."""
    compiler = cpu_backend._find_compiler()
    if compiler is None:
        raise SystemExit("no C compiler found: the 'cpu' kernel cannot be built here")
    (directory / cpu_backend.SOURCE_PATH.name).write_text(cpu_backend.C_SOURCE)
    (directory / cpu_backend.HEADER_PATH.name).write_text(cpu_backend.C_HEADER)
    errors = []
    for isa_flags in FLAG_SETS[isa]:
        flags = (*cpu_backend.BASE_FLAGS, *isa_flags, *extra)
        target = directory / f"variant_{hashlib.sha256(' '.join(flags).encode()).hexdigest()[:12]}.so"
        source = directory / cpu_backend.SOURCE_PATH.name
        proc = subprocess.run(
            [compiler, *flags, str(source), "-o", str(target), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode == 0:
            return cpu_backend._open(target, compiler, isa, flags)
        errors.append(proc.stderr.strip())
    raise SystemExit(f"building the variant {extra} failed: {errors[-1][:500]}")


def kernel_call(lib, problem: dict, config: KernelConfig, threads: int):
    """A function running the built library on `problem` as cpu_backend.cpu_paged_rows does (bfloat16 queries get
    bfloat16 out), returning [batch, heads, head_dim] as float32."""
    q = problem["query"]
    batch, heads, head_dim = q.shape
    kv_heads = config.num_kv_heads
    group = heads // kv_heads
    rows = q.view(batch, kv_heads, group, head_dim)
    table = problem["block_tables"].to(torch.int64).contiguous()
    last = problem["context_lens"].to(torch.int64) - 1
    pos = last.view(batch, 1).expand(batch, group).contiguous()
    kc, vc = problem["key_cache"], problem["value_cache"]
    fn = lib.paged_rows_out
    out_dtype = torch.bfloat16 if q.dtype == torch.bfloat16 else torch.float32

    def run() -> torch.Tensor:
        out = torch.empty(rows.shape, dtype=out_dtype)
        status = fn(
            rows.data_ptr(),
            *rows.stride()[:3],
            kc.data_ptr(),
            *kc.stride()[:3],
            vc.data_ptr(),
            *vc.stride()[:3],
            table.data_ptr(),
            table.stride(0),
            pos.data_ptr(),
            out.data_ptr(),
            cpu_backend.DTYPE_CODES[out_dtype],
            batch,
            kv_heads,
            group,
            head_dim,
            kc.shape[1],
            float(head_dim**-0.5),
            cpu_backend.DTYPE_CODES[q.dtype],
            threads,
            cpu_backend.head_split(batch, kv_heads, threads),
            cpu_backend.FULL_WINDOW,
        )
        if status != 0:
            raise MemoryError("the C kernel could not allocate its scratch memory")
        return out.view(batch, heads, head_dim).float()

    return run


def main() -> None:
    args = build_parser().parse_args()
    problem_text = isa_problem(args.isa)
    if problem_text is not None:
        raise SystemExit(problem_text)
    settings = apply_timing_settings()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    variants = args.variant if args.variant is not None else ["shipped"]
    config = KernelConfig(batch=16, context_len=2048, dtype=args.dtype)
    p = make_problem(config, "cpu")
    reference = contiguous_attention(p["query"], p["key"], p["value"], p["context_lens"]).float()
    clock = time.process_time if args.cpu_time else time.perf_counter
    vllm_key = "cpu_ms" if args.cpu_time else "ms"
    with tempfile.TemporaryDirectory(prefix="kernel-variants-") as tmp:
        built = {v: build_variant(defines(v), args.isa, Path(tmp)) for v in variants}
        runs = {v: kernel_call(b["lib"], p, config, threads) for v, b in built.items()}
        errors = {v: (run() - reference).abs().max().item() for v, run in runs.items()}
        times: dict[str, list[float]] = {v: [] for v in [*variants, "vllm"]}
        with VLLMKernel(threads) as kernel, LoadMonitor() as monitor:
            kernel.load(p, Path(tmp))
            for index in range(args.warmup + args.rounds):
                for variant, run in runs.items():
                    began = clock()
                    run()
                    took = (clock() - began) * 1e3
                    if index >= args.warmup:
                        times[variant].append(took)
                reply = kernel._reply("run")
                if vllm_key not in reply:
                    raise SystemExit(
                        f"vLLM's kernel worker gave no {vllm_key!r} (an older bench/vllm_kernel_worker.py)"
                    )
                if index >= args.warmup:
                    times["vllm"].append(float(reply[vllm_key]))
            info = kernel.info
    load = monitor.load
    report = {
        "command": " ".join(["python -m bench.attention_variants", *sys.argv[1:]]),
        "cpu": cpu_description(),
        "settings": settings.as_dict() | {"threads": threads},
        "clock": "process CPU time" if args.cpu_time else "wall",
        "problem": {"batch": 16, "context_len": 2048, "dtype": args.dtype, "block_size": config.block_size},
        "vllm": info,
        "vllm_ms": spread(times["vllm"]),
        "variants": [
            {
                "variant": variant,
                "isa": built[variant]["info"]["isa"],
                "flags": built[variant]["info"]["flags"],
                **_quartiles("ms", spread(times[variant])),
                **_quartiles(
                    "over_vllm", spread([a / b for a, b in zip(times[variant], times["vllm"], strict=True)])
                ),
                "max_abs_err": errors[variant],
                "tolerance": tolerance(args.dtype),
            }
            for variant in variants
        ],
        "rounds": args.rounds,
        "other_cores": None if load.other_cores is None else round(load.other_cores, 3),
        "load_avg": round(load.load_avg, 2),
        "busy": load.busy,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
