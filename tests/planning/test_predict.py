"""Steady-state predictions (`core.planning.predict.prediction`, `core.serving.steady_state`) and the predict / max-rate
command lines, against what must hold whatever the simulator's knobs: Little's law's throughput below capacity,
a closed loop of one client worked by hand, two seeds agreeing, and bad input exiting 2 with one line."""

import json
import math
import subprocess
import sys

import pytest

from core.errors import InvalidArgumentError
from core.planning.predict.load import Load
from core.planning.predict.max_rate import max_rate
from core.planning.predict.prediction import Deployment, idle_lifetime, predict
from core.serving.steady_state import metric_keys

LLAMA = Deployment("llama-3.1-8b", "h100-80gb")


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
    """One client: every request runs alone, so its end-to-end latency is the idle prefill + decodes."""
    load = Load(None, 512, 64, concurrency=1)
    p = predict(LLAMA, load)
    step = LLAMA.step_model()
    prefill = step.prefill_seconds(512, LLAMA.max_num_batched_tokens)
    decodes = sum(step.decode_step_seconds(1, 512 + i) for i in range(1, 64))
    assert p.metrics["e2e_p50_s"] == pytest.approx(prefill + decodes, rel=0.02)
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
    return subprocess.run([sys.executable, "-m", "core.planning", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


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
    ok = _cli("predict", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--concurrency", "8",
              "--prompt-len", "256", "--output-len", "32")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    body = json.loads(ok.stdout)
    assert body["converged"] is True and body["deployment"]["engine"] == "vllm"
    for bad in (["--rate", "-2"], ["--rate", "nan"], ["--concurrency", "0"], ["--tp", "3", "--rate", "1"],
                ["--gpu", "nope", "--rate", "1"], ["--engine", "nope", "--rate", "1"]):  # fmt: skip
        args = ["predict", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--prompt-len", "10",
                "--output-len", "10", *bad]  # fmt: skip
        if bad == ["--rate", "-2"]:  # one as a process: its exit status and stderr
            run = _cli(*args)
            status, err = run.returncode, run.stderr
        else:  # the rest through the same main, in this process (a process each took ~1 s)
            status, err = _cli_here(capsys, *args)
        assert status == 2, bad
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
