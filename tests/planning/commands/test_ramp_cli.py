"""`python -m core.planning ramp`: its figures are those of `drained_ramp` + `ramp_report` called directly on a
fleet built by hand (as bench/kv_cache_wins.py built it before the command: the planner's KV tokens, the engine's
step model, a paged policy with prefix caching, a Fleet of the replicas); prefix-aware routing beats round-robin
on a ramp whose prefixes overflow a replica's cache but not their share of it; bad values exit 2 with one line
naming the flag."""

import json
import math
import subprocess
import sys

import pytest

from core.planning.commands.dispatch import main
from core.planning.cost.fits.engine_profiles import engine_request_overhead_s
from core.planning.predict.deployment import Deployment
from core.serving.fleet import Fleet
from core.serving.memory_policies import paged
from core.serving.resume import SimulationSession
from core.serving.sim_config import SimulatorConfig
from core.serving.staged_run import TIMEOUT_S, drained_ramp
from core.serving.staged_workload import SharedPrefixPrompts, Stage, ramp_report

# the KV-cache-wins fleet at a tenth (`kv_cache_wins_deployment(routing, 10)`'s numbers) at block size 64
FLEET = [
    "--model",
    "qwen3-32b",
    "--gpu",
    "h100-80gb",
    "--tp",
    "2",
    "--gpu-memory-utilization",
    "0.4444",
    "--block-size",
    "64",
    "--max-num-seqs",
    "128",
    "--max-num-batched-tokens",
    "256",
]
# 40 groups x 2 users, 2,000-token prefixes: 80,000 prefix tokens, 2.6x a replica's ~30,700; a quarter of them
# (prefix-aware over 4 replicas) fits one
SHARED = [
    "--prompt-len",
    "2100",
    "--output-len",
    "50",
    "--shared-prefix-len",
    "2000",
    "--num-prefixes",
    "40",
    "--users-per-prefix",
    "2",
]


def _ramp(capsys, *args) -> dict:
    assert main(["ramp", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _same(got, want) -> bool:
    """JSON's None stands for NaN (a stage that finished nothing); floats to rounding (the command adds the
    front end's seconds to each latency, this test to the times it subtracts)."""
    if isinstance(want, float) and math.isnan(want):
        return got is None
    if isinstance(want, float):
        return got == pytest.approx(want, rel=1e-12, abs=1e-12)
    return got == want


@pytest.mark.parametrize(
    ("routing", "engine"),
    [("prefix-aware", "vllm"), ("random", "vllm"), ("prefix-aware", "vllm-cross-model")],
)
def test_the_command_prints_drained_ramp_and_ramp_report_of_the_same_fleet(capsys, routing, engine):
    """The cross-model profile's request-side seconds (a front-end time outside the steps) are added to every
    first token and finish, as `predict` adds them to TTFT and E2E."""
    stages, seed = [Stage(20.0, 4.0), Stage(3.0, 4.0), Stage(60.0, 2.0)], 3
    body = _ramp(
        capsys,
        *FLEET,
        "--replicas",
        "3",
        "--routing",
        routing,
        "--stages",
        "20x4, 3x4,60X2",
        "--warmup-stages",
        "1",
        *SHARED,
        "--seed",
        str(seed),
        "--engine",
        engine,
    )
    # the independent path: the deployment, its SimulatorConfig, policy and fleet built by hand
    deployment = Deployment(
        "qwen3-32b",
        "h100-80gb",
        tp=2,
        replicas=3,
        max_num_seqs=128,
        max_num_batched_tokens=256,
        block_size=64,
        gpu_memory_utilization=0.4444,
        routing=routing,
        engine=engine,
    )
    max_len = 2100 + 50
    kv_tokens = deployment.memory_plan(max_len).kv_tokens
    config = SimulatorConfig(
        kv_capacity_tokens=kv_tokens,
        max_num_seqs=128,
        max_num_batched_tokens=256,
        max_seq_len=max_len,
        step_time=deployment.step_model(),
        max_snapshots=1,
    )
    session = SimulationSession(paged(64, enable_prefix_caching=True), config, fleet=Fleet(3, routing, seed))
    prompts = SharedPrefixPrompts(40, 2, 2000, 100, 50)
    result, stage_of = drained_ramp(stages, prompts, session, seed)
    frame = result.requests.copy()
    front_end = engine_request_overhead_s(engine) or 0.0
    assert (front_end > 0) == (engine == "vllm-cross-model")
    frame["first_token_time"] += front_end
    frame["finish_time"] += front_end
    want = ramp_report(frame, stages, first_stage=1, stage_of=stage_of, timeout_s=TIMEOUT_S)

    assert body["kind"] == (
        "transient replay of a staged ramp as inference-perf runs it, not a steady-state estimate"
    )
    assert body["kv_tokens_per_replica"] == kv_tokens and body["requests"] == 80 + 12 + 120
    for key in (
        "output_tokens_per_s",
        "ttft_p90_s",
        "ttft_mean_s",
        "prefix_hit_rate",
        "unfinished",
        "timed_out",
    ):
        assert _same(body[key], want[key]), key
    assert len(body["stages"]) == 3
    for got, row in zip(body["stages"], want["stages"], strict=True):
        assert got.keys() == row.keys() and all(_same(got[k], row[k]) for k in row)
    assert body["prefix_hit_rate"] > 0
    # the deployment as predict echoes it, and the server's `vllm serve` command
    assert body["deployment"] == deployment.flags()
    assert (
        "--block-size 64" in body["vllm_command"]
        and "--gpu-memory-utilization 0.4444" in body["vllm_command"]
    )
    assert body["ramp"]["stages"] == [[20.0, 4.0], [3.0, 4.0], [60.0, 2.0]]


def test_prefix_aware_beats_round_robin_when_the_prefixes_overflow_a_replica(capsys):
    """4 replicas: under round-robin each sees all 40 prefixes (80,000 tokens, more than its cache), under
    prefix-aware a quarter of them (20,000, within it): prefix-aware hits several times as often, and at 40-80
    requests/s round-robin's prefills fall behind: its output tok/s is lower and its TTFT p90 longer."""
    runs = {
        routing: _ramp(
            capsys,
            *FLEET,
            "--replicas",
            "4",
            "--routing",
            routing,
            "--stages",
            "20x5,40x3,80x2",
            "--warmup-stages",
            "1",
            *SHARED,
        )
        for routing in ("prefix-aware", "round-robin")
    }
    aware, blind = runs["prefix-aware"], runs["round-robin"]
    kv = aware["kv_tokens_per_replica"]
    assert 40 * 2000 > kv > 40 * 2000 / 4  # the case: all prefixes overflow a replica, a quarter of them fit
    assert aware["prefix_hit_rate"] > 0.7 > 0.2 > blind["prefix_hit_rate"]
    assert aware["output_tokens_per_s"] > 2 * blind["output_tokens_per_s"]
    assert aware["ttft_p90_s"] * 5 < blind["ttft_p90_s"]
    for run in runs.values():
        assert run["unfinished"] == 0 and run["timed_out"] == 0


def _args(**changed) -> list[str]:
    flags = {"--replicas": "2", "--routing": "prefix-aware", "--stages": "5x2,10x2"} | changed
    return [*FLEET, *SHARED, *[w for pair in flags.items() for w in pair]]  # the last of a flag wins


@pytest.mark.parametrize(
    ("changed", "word"),
    [
        ({"--stages": "15x"}, "--stages"),
        ({"--stages": "15x50;3x20"}, "--stages"),
        ({"--stages": "0x20"}, "--stages"),
        ({"--stages": "3x-1"}, "--stages"),
        ({"--stages": "0.1x1"}, "--stages"),  # int(0.1 x 1): no request
        ({"--replicas": "0"}, "--replicas"),
        ({"--routing": "sticky"}, "--routing"),
        ({"--warmup-stages": "2"}, "--warmup-stages"),
        ({"--shared-prefix-len": "2100"}, "--shared-prefix-len"),
        ({"--users-per-prefix": "0"}, "--users-per-prefix"),
        ({"--block-size": "48"}, "--block-size"),
        ({"--gpu-memory-utilization": "1.5"}, "--gpu-memory-utilization"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_the_flag(capsys, changed, word):
    try:
        code = main(["ramp", *_args(**changed)])
    except SystemExit as exit_:  # argparse's own refusals (a choice flag), one line too
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], captured.err


def test_the_module_entry_point_exits_2_without_a_traceback():
    run = subprocess.run(
        [sys.executable, "-m", "core.planning", "ramp", *_args(**{"--stages": "3xfast"})],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "error: --stages: stage 1 '3xfast' is not RATExSECONDS (requests/s x seconds, e.g. 15x50,3x20)"
    ]
