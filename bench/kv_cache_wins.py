"""llm-d's "KV-cache wins" benchmark replayed through the lab's fleet simulator: its staged Poisson ramp (3 -> 60
QPS, after a 15 QPS warm-up), every routing policy, the whole run's output tok/s and TTFT p90 aggregated as the
benchmark's tool did, next to the published figures. Prints one JSON object.

    python -m bench.kv_cache_wins --engine vllm --out bench/results/kv-cache-wins.json   # the saved run
    python -m bench.kv_cache_wins                          # the published ramp, full length, the default profile
    python -m bench.kv_cache_wins --quick                  # smoke: durations / 5, two policies (distorted)
    python -m bench.kv_cache_wins --policies prefix-aware,round-robin --no-single-prefix
    python -m bench.kv_cache_wins --policies approximate-prefix --no-single-prefix \
        --merge bench/results/kv-cache-wins.json   # add one policy to the saved run, the others' figures kept

This is a TRANSIENT replay, not a steady-state estimate: the fleet starts empty (cold caches, no queue), each
stage's load is held only for its duration, and a saturated policy's queue grows through the ramp and drains
after it; the figures are those of this one run (`core.serving.staged_workload`'s definitions: a stage's output
tok/s = its requests' output tokens / (their last finish - their first arrival), the run's = the mean over the 16
ladder stages, the warm-up left out; TTFT p90 over every request of the run).

The case (`core.planning.predict.published_fleet`, llm-d-kv-cache-manager's benchmarking/73-capacity report): Qwen3-32B on
8 pods of TP 2 H100, 307,328 KV tokens a pod (block size 64, as the benchmark's vLLM ran), 150 groups x 5 users,
6,000-token system prompts, 1,200-token questions (each user's question is sent again every 750 requests, as
inference-perf's shared_prefix data cycles through its 750 prompts), 1,000 output tokens; stages (QPS x seconds):
15 x 50 warm-up, then 3 x 20, 10 x 20, 15 x 20, 20 x 38, 22 x 34, 25 x 30, 30 x 25, 35 x 21, 40 x 38, 43 x 36,
46 x 33, 49 x 30, 52 x 29, 55 x 27, 57 x 26, 60 x 25 (17,084 requests).

`--compress C` divides every stage's duration by C and keeps its rate: the rate sequence and the stages' relative
lengths stay the published ones and it sends 1 / C of the requests, but a request's life (1,000 output tokens, 25 s
or more) does not shrink, and a stage's output tok/s is its tokens over its first arrival to its last finish, so a
compressed stage is credited over a span its own duration no longer dominates: its figures are distorted, which is
why the default is the full length (C = 1; 17,084 requests, 5 policies and the one-prefix pair, about 2 minutes of
CPU a run, `--jobs` processes at once). Policies: prefix-aware (llm-d's precise), round-robin and random (its
random-scheduling), least-loaded (its load-scheduling), approximate-prefix (its estimated-scheduling: the
prefix-cache-scorer at its defaults guessing from the router's own history, with the kv-cache and queue scorers,
weights 1 : 1 : 1). The one-prefix control (groups 1, the same 750 users' questions) expects no gap.
"""

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.kernels.cpu_isa import machine  # noqa: E402
from core.planning.cost.fits.engine_profiles import DEFAULT_ENGINE, ENGINES  # noqa: E402
from core.planning.predict.published_fleet import (  # noqa: E402
    GROUPS,
    OUTPUT_LEN,
    PREFIX_LEN,
    PUBLISHED,
    PUBLISHED_STAGES,
    QUESTION_LEN,
    kv_cache_wins_deployment,
)
from core.planning.predict.replica_sim import FleetSetup  # noqa: E402
from core.planning.predict.replica_sim import fleet_setup as core_fleet_setup  # noqa: E402
from core.serving.fleet import simulate_fleet  # noqa: E402
from core.serving.resume import SimulationSession  # noqa: E402
from core.serving.staged_run import TIMEOUT_S, drained_ramp  # noqa: E402
from core.serving.staged_workload import SharedPrefixPrompts, Stage, ramp_report, staged_requests  # noqa: E402

USERS = 5
BLOCK_SIZE = 64  # the benchmark's vLLM --block-size (and its scorer's blockSize)
WARMUP = Stage(15.0, 50.0)
LADDER = [
    (3, 20),
    (10, 20),
    (15, 20),
    (20, 38),
    (22, 34),
    (25, 30),
    (30, 25),
    (35, 21),
    (40, 38),
    (43, 36),
    (46, 33),
    (49, 30),
    (52, 29),
    (55, 27),
    (57, 26),
    (60, 25),
]
POLICIES = {  # lab policy -> the published scheduler it stands for
    "prefix-aware": "precise prefix-aware",
    "round-robin": "random",
    "random": "random",
    "least-loaded": "load-only",
    "approximate-prefix": "approximate prefix",
}
REPORT_LOAD_ONLY = (
    4266.4  # load-scheduling in the 73-capacity report; the blog prints random's 4,428.7 for it
)


def ramp(compress: float) -> list[Stage]:
    """The published stages, each duration divided by `compress` (rates kept)."""
    return [Stage(WARMUP.rate, WARMUP.duration_s / compress)] + [
        Stage(float(rate), duration / compress) for rate, duration in LADDER
    ]


def fleet_setup(routing: str, seed: int = 0, engine: str = DEFAULT_ENGINE) -> FleetSetup:
    """(policy, SimulatorConfig, Fleet, sized replica) of the published deployment at block size 64, its steps
    priced by `engine`'s profile, built as `python -m core.planning ramp` builds it
    (`core.planning.predict.replica_sim.fleet_setup`)."""
    deployment = replace(kv_cache_wins_deployment(routing), block_size=BLOCK_SIZE, engine=engine)
    return core_fleet_setup(deployment, PREFIX_LEN + QUESTION_LEN + OUTPUT_LEN, seed)


def replay(
    routing: str,
    stages: list[Stage],
    groups: int = GROUPS,
    seed: int = 0,
    overlap: bool = False,
    engine: str = DEFAULT_ENGINE,
) -> dict:
    """One policy's run of the ramp: ramp_report's figures, plus its CPU seconds. overlap False: as the tool ran
    it (`core.serving.staged_run`: each stage once the last has ended, a request failed after the client's
    timeout); True: the stages back to back, every request counted to its finish."""
    started, cpu = time.perf_counter(), time.process_time()
    policy, config, fleet, _ = fleet_setup(routing, seed, engine)
    prompts = SharedPrefixPrompts(groups, USERS, PREFIX_LEN, QUESTION_LEN, OUTPUT_LEN)
    if overlap:
        requests = staged_requests(stages, prompts, seed)
        result = simulate_fleet(requests, policy, config, fleet)
        report = ramp_report(result.requests, stages, first_stage=1)
    else:
        session = SimulationSession(policy, config, fleet=fleet)
        result, stage_of = drained_ramp(stages, prompts, session, seed)
        requests = result.requests
        report = ramp_report(result.requests, stages, first_stage=1, stage_of=stage_of, timeout_s=TIMEOUT_S)
    report["kv_tokens_per_pod"] = config.kv_capacity_tokens
    report["requests"] = len(requests)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    report["cpu_s"] = round(time.process_time() - cpu, 1)
    return report


def _run(job: tuple) -> tuple:
    routing, groups, compress, overlap, engine = job
    return routing, groups, replay(routing, ramp(compress), groups=groups, overlap=overlap, engine=engine)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kv_cache_wins", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--compress", type=float, default=1.0, help="divide every stage's duration by this")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated routing policies")
    parser.add_argument("--no-single-prefix", action="store_true", help="skip the one-prefix control")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: --compress 5, prefix-aware and round-robin (figures distorted)",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="place the stages back to back (a stage meets the last one's queue) and count every request to its "
        "finish, instead of as inference-perf ran them (each stage once the last has ended; 300 s timeout)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel processes")
    parser.add_argument(
        "--engine", choices=ENGINES, default=DEFAULT_ENGINE, help="the engine profile that prices the steps"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument(
        "--merge",
        type=Path,
        help="add the policies run to this saved JSON (each with its machine and load average), leaving the "
        "saved policies' figures and gaps as they are",
    )
    args = parser.parse_args()
    compress = 5.0 if args.quick else args.compress
    policies = ["prefix-aware", "round-robin"] if args.quick else args.policies.split(",")
    for routing in policies:
        if routing not in POLICIES:
            parser.error(f"unknown policy {routing!r}; choose from {', '.join(POLICIES)}")
    jobs = [(routing, GROUPS, compress, args.overlap, args.engine) for routing in policies]
    if not args.no_single_prefix:
        jobs += [
            (routing, 1, compress, args.overlap, args.engine) for routing in ("round-robin", "prefix-aware")
        ]
    started = time.perf_counter()
    runs = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for run in pool.map(_run, jobs):
            runs.append(run)
            routing, groups, got = run
            brief = {k: v for k, v in got.items() if k != "stages"}
            print(f"{routing} groups={groups}: {json.dumps(brief)}", file=sys.stderr, flush=True)
    out = {
        "bench": "kv_cache_wins",
        "kind": "transient replay of a staged ramp, not a steady-state estimate",
        "compress": compress,
        "engine": args.engine,
        "stages_run": "back to back" if args.overlap else "each once the last has ended (inference-perf)",
        "timeout_s": None if args.overlap else TIMEOUT_S,
        "machine": machine(),
        "cpu_count": os.cpu_count(),
        "jobs": args.jobs,
        "stages": [list(stage) for stage in ramp(compress)],
        "policies": {},
    }
    _add_runs(out, runs, compress)
    out["report_load_only_output_tokens_per_s"] = REPORT_LOAD_ONLY
    out["wall_s"] = round(time.perf_counter() - started, 1)
    if args.merge:
        out = _merged(json.loads(args.merge.read_text()), out)
    text = json.dumps(out, indent=1)
    print(text)
    for path in (args.out, args.merge):
        if path:
            path.write_text(text + "\n")


def _add_runs(out: dict, runs: list, compress: float) -> None:
    """Put the replays in `out`: each policy beside its published figures (and, at full length, each ladder stage
    beside the report's row), the gaps prefix-aware / round-robin, and the one-prefix control apart."""
    single = {}
    for routing, groups, got in runs:
        if groups == 1:
            single[routing] = {k: v for k, v in got.items() if k != "stages"}
            continue
        name = POLICIES[routing]
        if compress == 1.0:  # the ladder stages beside the report's own rows
            for row, (rate, ttft) in zip(got["stages"][1:], PUBLISHED_STAGES[name], strict=True):
                row["published"] = {"output_tokens_per_s": rate, "ttft_p90_s": ttft}
        out["policies"][routing] = {
            "published_as": name,
            "published": {"output_tokens_per_s": PUBLISHED[name][0], "ttft_p90_s": PUBLISHED[name][1]},
            **got,
        }
    got = out["policies"]
    if "prefix-aware" in got and "round-robin" in got:
        out["throughput_gap"] = {
            "lab": got["prefix-aware"]["output_tokens_per_s"] / got["round-robin"]["output_tokens_per_s"],
            "published": PUBLISHED["precise prefix-aware"][0] / PUBLISHED["random"][0],
        }
        out["ttft_p90_ratio"] = {
            "lab": got["round-robin"]["ttft_p90_s"] / got["prefix-aware"]["ttft_p90_s"],
            "published": PUBLISHED["random"][1] / PUBLISHED["precise prefix-aware"][1],
        }
    if single:
        single["throughput_gap"] = (
            single["prefix-aware"]["output_tokens_per_s"] / single["round-robin"]["output_tokens_per_s"]
        )
        out["single_prefix"] = single


def _merged(saved: dict, run: dict) -> dict:
    """`saved` with `run`'s policies added (or replaced), each tagged with this run's machine, CPUs, jobs, load
    average and wall time; `saved`'s other policies, gaps and one-prefix control are left as they are."""
    if saved.get("compress") != run["compress"] or saved.get("stages") != run["stages"]:
        raise SystemExit("--merge: the saved run used other stages; rerun them all instead")
    tag = {k: run[k] for k in ("machine", "cpu_count", "jobs", "wall_s")}
    tag["load_average"] = [round(x, 2) for x in os.getloadavg()]
    for routing, entry in run["policies"].items():
        saved["policies"][routing] = {**entry, "run": tag}
    return saved


if __name__ == "__main__":
    main()
