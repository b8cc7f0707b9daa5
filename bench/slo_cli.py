"""Time the SLO planner's command line as a user runs it and print one JSON object.

    python -m bench.slo_cli [--repeats 3]

For each case (issue 23's: Llama-3.1-8B at 12 req/s and Llama-3.1-70B at 4 and 12 req/s, 2,000 prompt / 300
output tokens, TTFT p95 <= 1 s, TPOT p95 <= 50 ms, on the H100 / H200 / L40S presets; issue 30's `--disagg`:
the 8B case again, and 8,000-token prompts at 2 req/s under TPOT p99 <= 12 ms on H100s) the whole command
`python -m core.planning slo ...` runs in a fresh interpreter `--repeats` times: wall_s (median, min, max),
cpu_s (the child's user + system CPU seconds: what a shared machine's load does not inflate as much),
the search's own elapsed_s (from the JSON it prints), the exit status (2 when no configuration meets the SLO:
an answer too), the answer (the cheapest configuration, or the error), and how many configurations were
evaluated / simulated. The baseline, measured in the same run: a fresh interpreter that only imports the
command's module (`import core.planning.commands.slo_cli`: torch, pandas and the planner), so ratio_to_import says how
much of the wall time is the search. target_met: every case's slowest run under TARGET_S (issue 23: "answers
... in under 10 s"). The machine is shared: the load average before and after is recorded.

predict_cases: issue 37's `python -m core.planning predict` with the levers on (Llama-3.1-8B on 2 x H100 at 8
req/s, 4,000 / 256 tokens, a 3,500-token prefix shared 8 ways, EAGLE with acceptance 0.8,0.6,0.4), timed the
same way against PREDICT_TARGET_S (issue 37: "<= 5 s on 2 cores"); `--only predict` runs just those.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

from bench.machine import machine_facts
from core.kernels.cpu_isa import cpu_description

TARGET_S = 10.0
COMMON = [
    "--prompt-len",
    "2000",
    "--output-len",
    "300",
    "--ttft-p95",
    "1",
    "--tpot-p95",
    "0.05",
    "--gpus",
    "h100-80gb",
    "h200-141gb",
    "l40s",
]
LONG = [
    "--prompt-len",
    "8000",
    "--output-len",
    "256",
    "--ttft-p95",
    "2",
    "--tpot-p99",
    "0.012",
    "--gpus",
    "h100-80gb",
]
CASES = {
    "llama-3.1-8b@12": ["--model", "llama-3.1-8b", "--rate", "12", *COMMON],
    "llama-3.1-70b@4": ["--model", "llama-3.1-70b", "--rate", "4", *COMMON],
    "llama-3.1-70b@12": ["--model", "llama-3.1-70b", "--rate", "12", *COMMON],
    # issue 30's `slo --disagg`: the same question with disaggregated deployments too, and 8k-token prompts
    # under a tight TPOT p99 that only a prefill / decode split meets within 8 H100s
    "llama-3.1-8b@12 --disagg": ["--model", "llama-3.1-8b", "--rate", "12", *COMMON, "--disagg"],
    "llama-3.1-8b@2 8k prompts --disagg": ["--model", "llama-3.1-8b", "--rate", "2", *LONG, "--disagg"],
}
PREDICT_TARGET_S = 5.0
PREDICT_CASES = {
    "llama-3.1-8b 2 x h100 @8 prefix 3500 x 8 eagle": [
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--replicas",
        "2",
        "--rate",
        "8",
        "--prompt-len",
        "4000",
        "--output-len",
        "256",
        "--shared-prefix-len",
        "3500",
        "--num-prefixes",
        "8",
        "--spec-tokens",
        "3",
        "--spec-acceptance",
        "0.8,0.6,0.4",
        "--spec-method",
        "eagle",
    ],
}


def _run(args: list[str]) -> tuple[float, subprocess.CompletedProcess, float]:
    """(wall seconds, the finished process, its CPU seconds: user + system, from the children's rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _spread(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "runs": times}


def _answer(body: dict) -> dict:
    best = body.get("best")
    if best is None:
        return {"error": body.get("error", {}).get("message")}
    keys = (
        "gpu",
        "num_gpus",
        "tp",
        "pp",
        "replicas",
        "max_num_seqs",
        "kv_dtype",
        "ttft_p95_s",
        "tpot_p95_s",
        "throughput_tokens_per_s",
        "binding",
        "mode",
        "prefill_gpus",
        "decode_gpus",
    )
    return {k: best.get(k) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.slo_cli", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("slo", "predict"), help="run one part only")
    args = parser.parse_args()
    load_before = os.getloadavg()
    baseline = [_run(["-c", "import core.planning.commands.slo_cli"])[0] for _ in range(args.repeats)]
    predict_cases = {} if args.only == "slo" else _predict_cases(args.repeats)
    cases = {}
    for name, argv in {} if args.only == "predict" else CASES.items():
        walls, cpus, searches, body, status = [], [], [], {}, None
        for _ in range(args.repeats):
            wall, done, cpu = _run(["-m", "core.planning", "slo", *argv])
            if done.returncode not in (0, 2) or not done.stdout.strip():
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
            body, status = json.loads(done.stdout), done.returncode
            walls.append(wall)
            cpus.append(cpu)
            searches.append(body["elapsed_s"])
        cases[name] = {
            "argv": argv,
            "exit_status": status,
            "wall_s": _spread(walls),
            "cpu_s": _spread(cpus),
            "search_s": _spread(searches),
            "ratio_to_import": statistics.median(walls) / statistics.median(baseline),
            "num_candidates": body["num_candidates"],
            "num_evaluated": body["num_evaluated"],
            "num_simulated": body["num_simulated"],
            "num_reused": body["num_reused"],
            "answer": _answer(body),
        }
    slowest = max((c["wall_s"]["max"] for c in cases.values()), default=None)
    predict_slowest = max((c["wall_s"]["max"] for c in predict_cases.values()), default=None)
    print(
        json.dumps(
            {
                "cpu": cpu_description(),
                "machine": machine_facts(load_before, python=platform.python_version()),
                "target_s": TARGET_S,
                "baseline_import_s": _spread(baseline),
                "cases": cases,
                "slowest_wall_s": slowest,
                "target_met": None if slowest is None else slowest < TARGET_S,
                "predict_target_s": PREDICT_TARGET_S,
                "predict_cases": predict_cases,
                "predict_target_met": None
                if predict_slowest is None
                else predict_slowest <= PREDICT_TARGET_S,
            },
            indent=2,
        )
    )


def _predict_cases(repeats: int) -> dict:
    """Each of PREDICT_CASES `repeats` times in a fresh interpreter: wall and CPU seconds, and what it answered."""
    cases = {}
    for name, argv in PREDICT_CASES.items():
        walls, cpus, body = [], [], {}
        for _ in range(repeats):
            wall, done, cpu = _run(["-m", "core.planning", "predict", *argv])
            if done.returncode != 0:
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
            body = json.loads(done.stdout)
            walls.append(wall)
            cpus.append(cpu)
        keys = ("ttft_p99_s", "tpot_p99_s", "prefix_hit_rate", "mean_accepted_len", "simulated_requests")
        cases[name] = {
            "argv": argv,
            "wall_s": _spread(walls),
            "cpu_s": _spread(cpus),
            "answer": {k: body.get(k) for k in keys},
        }
    return cases


if __name__ == "__main__":
    main()
