"""Steady-state predictions (`core.planning.predict.prediction`, `core.serving.steady_state`) and the predict / max-rate
command lines, against what must hold whatever the simulator's knobs: Little's law's throughput below capacity,
a closed loop of one client worked by hand, two seeds agreeing, and bad input exiting 2 with one line."""

import json
import math
import subprocess
import sys

import pytest

from core.errors import InvalidArgumentError
from core.planning.memory.plan import replica_memory
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.max_rate import max_rate
from core.planning.predict.prediction import idle_lifetime, predict, replica_steady_state
from core.serving.steady_state import SteadyStateSettings, metric_keys

LLAMA = Deployment("llama-3.1-8b", "h100-80gb")
SMALL = SteadyStateSettings(tolerance=0.2, initial_measured=100, max_requests=400, warmup_lifetimes=2.0)


@pytest.fixture(scope="module")
def seed0():
    """The prediction of 4 req/s of 1500 / 256 tokens with seed 0 (read by two tests)."""
    return predict(LLAMA, Load(4.0, 1500, 256, seed=0))


def test_below_capacity_throughput_is_rate_times_mean_output(seed0):
    p = seed0
    assert p.stable
    assert p.metrics["throughput_tokens_per_s"] == pytest.approx(4.0 * 256, rel=0.05)
    assert set(metric_keys()) <= set(p.to_dict())
    assert p.to_dict()["tpot_p99_s"] >= p.to_dict()["tpot_p50_s"]


def test_two_seeds_agree_on_every_p99_below_the_knee(seed0):
    a = seed0.metrics
    b = predict(LLAMA, Load(4.0, 1500, 256, seed=1)).metrics
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert a[f"{metric}_p99_s"] == pytest.approx(b[f"{metric}_p99_s"], rel=0.10), metric


def test_one_closed_loop_client_sees_the_idle_latency():
    """One client: every request runs alone, so its end-to-end latency is the idle prefill + decodes, plus the
    default profile's request side (the front end's fixed time and the step in flight when the request arrives,
    here the previous request's last decode at context 575)."""
    load = Load(None, 512, 64, concurrency=1)
    p = predict(LLAMA, load)
    step = LLAMA.step_model()
    prefill = step.prefill_seconds(512, LLAMA.max_num_batched_tokens)
    decodes = sum(step.decode_step_seconds(1, 512 + i) for i in range(1, 64))
    request_side = LLAMA.request_overhead_s() + step.decode_step_seconds(1, 575)
    assert p.metrics["e2e_p50_s"] == pytest.approx(request_side + prefill + decodes, rel=0.02)
    assert p.metrics["mean_running_batch"] == pytest.approx(1.0)
    assert idle_lifetime(step, load, LLAMA.max_num_batched_tokens) == pytest.approx(
        prefill + decodes, rel=0.02
    )


def test_overload_is_not_a_steady_state():
    p = predict(LLAMA, Load(40.0, 1500, 256))
    assert not p.stable and not p.converged
    assert p.metrics["throughput_tokens_per_s"] < 0.9 * 40 * 256


def test_max_rate_brackets_the_targets():
    load = Load(1.0, 512, 64)  # short requests: each of the ~20 steady states simulates fewer steps
    found = max_rate(LLAMA, load, {"tpot_p99_s": 0.03})
    assert found.at is not None and found.at.metrics["tpot_p99_s"] <= 0.03
    above = predict(LLAMA, Load(found.max_req_per_s * 1.15, 512, 64))
    assert not above.stable or above.metrics["tpot_p99_s"] > 0.03 * 0.97
    # a rate of the grid 1.03^k, wherever the bracket starts: a warm start (the page's) finds the same one
    k = math.log(found.max_req_per_s) / math.log(1.03)
    assert k == pytest.approx(round(k), abs=1e-9)
    warm = max_rate(LLAMA, load, {"tpot_p99_s": 0.03}, holds_at=found.max_req_per_s / 1.5)
    assert warm.max_req_per_s == found.max_req_per_s and warm.evaluations < found.evaluations


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"rate": -1.0}, "rate"),
        ({"rate": float("nan")}, "rate"),
        ({"rate": None, "concurrency": 0}, "concurrency"),
    ],
)
def test_bad_load_names_the_input(kwargs, word):
    with pytest.raises(InvalidArgumentError, match=word):
        Load(prompt_len=10, output_len=10, **({"rate": None} | kwargs))


def test_bad_deployment_names_the_input():
    with pytest.raises(InvalidArgumentError, match="tensor_parallel"):
        Deployment("llama-3.1-8b", "h100-80gb", tp=3)
    with pytest.raises(InvalidArgumentError, match="engine"):
        Deployment("llama-3.1-8b", "h100-80gb", engine="sglang")


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "core.planning", *args], capture_output=True, text=True, timeout=120
    )


def _cli_here(capsys, *args) -> tuple[int, str]:
    """(exit status, stderr) of `python -m core.planning`'s main in this process (an escaping exception fails
    the test, as a traceback would)."""
    from core.planning.commands.dispatch import main

    try:
        status = main(list(args))
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


def test_predict_cli_prints_one_json_object_and_bad_flags_exit_2(capsys):
    ok = _cli(
        "predict",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--concurrency",
        "8",
        "--prompt-len",
        "256",
        "--output-len",
        "32",
    )
    assert ok.returncode == 0, ok.stderr
    body = json.loads(ok.stdout)
    assert body["converged"] is True and body["deployment"]["engine"] == "vllm-cross-model"
    for bad in (
        ["--rate", "-2"],
        ["--rate", "nan"],
        ["--concurrency", "0"],
        ["--tp", "3", "--rate", "1"],
        ["--gpu", "nope", "--rate", "1"],
        ["--engine", "nope", "--rate", "1"],
    ):
        args = [
            "predict",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100-80gb",
            "--prompt-len",
            "10",
            "--output-len",
            "10",
            *bad,
        ]
        if bad == ["--rate", "-2"]:  # one as a process: its exit status and stderr
            run = _cli(*args)
            status, err = run.returncode, run.stderr
        else:  # the rest through the same main, in this process (a process each took ~1 s)
            status, err = _cli_here(capsys, *args)
        assert status == 2, bad
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_predict_resolves_the_deployment_once_and_builds_no_capacity_plan(monkeypatch):
    """`Deployment.resolve()` is the one resolved deployment the memory and the step cost both read: a
    prediction (here with a host tier, which sizes its blocks from the memory too) derives the model's KV layer
    specs once (`resolve_deployment` is their one caller), builds no `CapacityPlan`, and prices its steps
    with the resolved (concrete) dtypes. Counted by patching; the KV tokens are the whole plan's."""
    import core.planning.memory.resolved as resolved_module
    import core.planning.predict.deployment as deployment_module
    from core.planning.memory.plan_types import CapacityPlan

    derived, plans, priced = [], [], []
    real_specs, real_init, real_from_specs = (
        resolved_module.model_kv_specs,
        CapacityPlan.__init__,
        deployment_module.from_specs,
    )

    def counting_specs(*args, **kwargs):
        derived.append(args)
        return real_specs(*args, **kwargs)

    def counting_init(self, *args, **kwargs):
        plans.append(args)
        real_init(self, *args, **kwargs)

    def recording_from_specs(*args, **kwargs):
        priced.append(args)
        return real_from_specs(*args, **kwargs)

    monkeypatch.setattr(resolved_module, "model_kv_specs", counting_specs)
    monkeypatch.setattr(CapacityPlan, "__init__", counting_init)
    monkeypatch.setattr(deployment_module, "from_specs", recording_from_specs)
    deployment = Deployment("llama-3.1-8b", "h100-80gb", kv_offload_gib=8.0)
    load = Load(2.0, 500, 32, seed=0)
    p = predict(deployment, load, settings=SMALL)
    assert len(derived) == 1 and plans == []
    assert [args[2:6] for args in priced] == [(1, "bf16", "bf16", 1)]  # tp, weights, KV (not "auto"), pp
    monkeypatch.undo()
    capacity = deployment.memory_plan(load.max_len)
    assert p.kv_tokens == capacity.kv_tokens
    memory = replica_memory(deployment.resolve(load.max_len))
    assert deployment.host_offload(capacity) == deployment.host_offload(memory)


@pytest.mark.parametrize(
    "deployment, max_len",
    [
        (Deployment("llama-3.1-8b", "h100-80gb"), 1756),
        (Deployment("llama-3.1-70b", "h100-80gb"), 4096),  # the weights leave no KV budget
        (Deployment("gemma-2-9b", "l4", block_size=32), 8192),  # sliding-window groups
        (
            Deployment("llama-3.1-8b", "a10g", tp=1, kv_dtype="fp8"),
            131072,
        ),  # one request needs too many blocks
    ],
)
def test_replica_memory_is_the_plans_memory(deployment, max_len):
    """What predict sizes a replica with (`replica_memory` of the resolved deployment) is the whole plan's
    fits, verdict, blocks and tokens, whether or not it fits."""
    memory = replica_memory(deployment.resolve(max_len))
    capacity = deployment.memory_plan(max_len)
    got = (memory.fits, memory.verdict, memory.num_blocks, memory.block_bytes, memory.kv_tokens)
    assert got == (
        capacity.fits,
        capacity.verdict,
        capacity.num_blocks,
        capacity.block_bytes,
        capacity.kv_tokens,
    )
    assert (memory.tensor_parallel, memory.pipeline_parallel, memory.block_size, memory.replicas) == (
        capacity.tensor_parallel,
        capacity.pipeline_parallel,
        capacity.block_size,
        capacity.replicas,
    )


def test_a_host_tier_needs_its_offload():
    deployment = Deployment("llama-3.1-8b", "h100-80gb", kv_offload_gib=8.0)
    with pytest.raises(InvalidArgumentError, match="needs its offload"):
        replica_steady_state(deployment, Load(1.0, 100, 10), deployment.step_model(), 10_000)
