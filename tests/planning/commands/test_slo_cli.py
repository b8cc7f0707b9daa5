"""The SLO planner's command line, run in-process as issue 23 asks it to answer (Llama-3.1-8B / 70B on the H100,
H200 and L40S presets): every configuration it calls feasible fits by the exact planner, re-derived here from
the model's shapes and the GPU's memory; and the bad SLOs it must refuse, each with exit 2, the reason on stderr,
and (when nothing meets the SLO) every configuration still on stdout."""

import json
import math

import pytest

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.commands.dispatch import main
from core.planning.memory.plan import plan
from core.planning.search.slo_candidates import SloCandidates, enumerate_candidates
from core.planning.search.slo_eval import step_model as slo_step_model

GPUS_ASKED = ["h100-80gb", "h200-141gb", "l40s"]
PROMPT, OUTPUT = 2000, 300


def _argv(model: str, rate: float, *extra: str) -> list[str]:
    return [
        "slo",
        "--model",
        model,
        "--rate",
        str(rate),
        "--prompt-len",
        str(PROMPT),
        "--output-len",
        str(OUTPUT),
        "--gpus",
        *GPUS_ASKED,
        *extra,
    ]


def _kv_bytes_per_token_by_hand(model, tp: int, pp: int, kv_dtype: str) -> int:
    """K and V of one token on the most loaded GPU: 2 x its layers x its KV heads x head_dim x dtype bytes
    (bf16: 2, fp8: 1); a KV head is replicated when tp exceeds the KV heads."""
    layers = math.ceil(model.num_layers / pp)
    heads = max(1, model.num_kv_heads // tp)
    return 2 * layers * heads * model.head_dim * (1 if kv_dtype == "fp8" else 2)


@pytest.mark.parametrize(("model", "rate"), [("llama-3.1-8b", 12.0), ("llama-3.1-70b", 4.0)])
def test_every_configuration_the_cli_calls_feasible_fits_in_memory(capsys, model, rate):
    assert main(_argv(model, rate, "--ttft-p95", "1", "--tpot-p95", "0.05")) == 0
    body = json.loads(capsys.readouterr().out)
    spec = MODELS[model]
    feasible = [c for c in body["configs"] if c["feasible"]]
    assert feasible and body["best"] in body["configs"] and body["best"]["meets_slo"]
    assert {c["gpu"] for c in body["configs"]} <= set(GPUS_ASKED)
    for c in body["configs"]:
        gpu = GPUS[c["gpu"]]
        exact = plan(
            spec,
            gpu,
            num_gpus=c["tp"] * c["pp"],
            tensor_parallel=c["tp"],
            pipeline_parallel=c["pp"],
            kv_dtype=c["kv_dtype"],
            max_model_len=PROMPT + OUTPUT,
            max_num_seqs=c["max_num_seqs"],
            max_num_batched_tokens=8192,
        )
        assert exact.fits == c["feasible"], c
        assert not c["meets_slo"] or (c["feasible"] and c["simulated"]), c
        if not c["feasible"]:
            continue
        # the exact planner's figures, re-derived: per-token KV bytes from the shapes, the KV slots it reports
        # inside the memory left by weights and activations, and room for one whole request
        per_token = _kv_bytes_per_token_by_hand(spec, c["tp"], c["pp"], c["kv_dtype"])
        assert exact.kv_bytes_per_token == per_token, c
        assert c["kv_tokens"] == exact.kv_tokens == exact.num_blocks * 16, c
        usable = gpu.memory_bytes * 0.9
        assert exact.weights_bytes + exact.activation_bytes + c["kv_tokens"] * per_token <= usable, c
        assert exact.weights_bytes == pytest.approx(spec.num_params * 2 / (c["tp"] * c["pp"]), rel=0.1), c
        assert c["kv_tokens"] >= PROMPT + OUTPUT, c
        assert c["num_gpus"] == c["tp"] * c["pp"] * c["replicas"] <= 8, c


@pytest.mark.parametrize(
    ("slo_args", "stderr"),
    [
        (["--ttft-p95", "-1"], "--ttft-p95 (seconds) must be greater than 0, got -1"),
        (["--ttft-p95", "0"], "must be greater than 0"),
        (["--tpot-p95", "nan"], "--tpot-p95 (seconds)"),
        (["--ttft-p95", "inf"], "--ttft-p95 (seconds)"),
        ([], "needs at least one latency target"),
    ],
)
def test_the_cli_refuses_bad_slos_with_exit_2_and_the_reason(capsys, slo_args, stderr):
    assert main(_argv("llama-3.1-8b", 12.0, *slo_args)) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and stderr in out.err and "Traceback" not in out.err
    assert out.out == ""


@pytest.mark.parametrize("rate", ["0", "-3", "nan"])
def test_the_cli_refuses_a_bad_rate(capsys, rate):
    assert main(_argv("llama-3.1-8b", rate, "--ttft-p95", "1")) == 2
    out = capsys.readouterr()
    assert "rate (requests/s)" in out.err and out.out == ""


def test_the_cli_says_what_cannot_be_met_and_still_prints_every_configuration(capsys):
    # Llama-3.1-70B in bf16 at 12 req/s needs more than 8 of these GPUs: the rate is what cannot be met
    assert main(_argv("llama-3.1-70b", 12.0, "--ttft-p95", "1", "--tpot-p95", "0.05")) == 2
    out = capsys.readouterr()
    body = json.loads(out.out)
    error = body["error"]
    assert error["metric"] == "rate" and error["target"] == 12.0 and error["shortfall"] > 1
    assert error["best"] == pytest.approx(12.0 / error["shortfall"])
    assert f"{error['shortfall']:.2f}x short" in out.err and body["best"] is None and body["configs"]
    most = max(c["capacity_requests_per_s"] for c in body["configs"] if c["feasible"])
    assert error["best"] == pytest.approx(most)  # the closest configuration's bound, as the message says
    # a TPOT no GPU reaches: the shortfall is the closest configuration's predicted floor over the target
    assert main(_argv("llama-3.1-8b", 1.0, "--tpot-p95", "0.0001")) == 2
    out = capsys.readouterr()
    error = json.loads(out.out)["error"]
    assert error["metric"] == "tpot_p95_s" and error["best"] == pytest.approx(error["shortfall"] * 1e-4)
    assert (
        "TPOT p95 <= 0.0001 s cannot be met" in out.err and f"{error['shortfall']:.2f}x the target" in out.err
    )


def test_the_search_prices_the_vllm_release_it_is_given():
    """`slo --vllm-version 0.12.0`: every candidate's step model and deployment carry the release, so Qwen3-235B-A22B
    FP8 on 2 x H200 is priced with vLLM 0.12's padded MoE kernel (`expert_block_rows` 128), as `predict` prices it;
    without it, today's routed kernel (0)."""
    model = MODELS["qwen3-235b-a22b-fp8"]
    for version, rows in (("0.12.0", 128), (None, 0)):
        cands = SloCandidates(gpus=("h200-141gb",), max_gpus=2, tensor_parallel=(2,), vllm_version=version)
        candidate = next(c for c in enumerate_candidates(model, cands) if c.tp == 2)
        assert slo_step_model(model, candidate, cands.step_overrides()).expert_block_rows == rows
        deployment = candidate.deployment(model, cands)
        assert deployment.vllm_version == version and deployment.step_model().expert_block_rows == rows
    # an empty release (a page's cleared box) is today's vLLM, held as None
    assert SloCandidates(vllm_version="").vllm_version is None
    assert candidate.deployment(model, SloCandidates(vllm_version="")).vllm_version is None


def test_the_cli_echoes_the_release_it_priced(capsys):
    """`slo --vllm-version 0.12.0` says so beside the engine, and the model's check is the rows' own at that release."""
    argv = [
        "slo",
        "--model",
        "qwen3-235b-a22b-fp8",
        "--rate",
        "1",
        "--prompt-len",
        "1000",
        "--output-len",
        "100",
    ]
    argv += ["--gpus", "h200-141gb", "--tpot-p95", "0.06", "--max-gpus", "2"]
    assert main([*argv, "--vllm-version", "0.12.0"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["vllm_version"] == "0.12.0" and body["profile_check"]["model"]["tpot_rms_rel_err"] == 0.137
    assert main(argv) == 0
    body = json.loads(capsys.readouterr().out)
    assert "vllm_version" not in body and body["profile_check"]["model"]["tpot_rms_rel_err"] == 0.341


@pytest.mark.parametrize(
    ("flags", "stderr"),
    [
        (["--vllm-version", "0.x"], "--vllm-version takes a vLLM release"),
        (["--vllm-version", "0.12.0", "--engine", "trtllm"], "not vLLM's profile"),
    ],
)
def test_the_cli_refuses_a_bad_vllm_release(capsys, flags, stderr):
    assert main(_argv("qwen3-235b-a22b-fp8", 1.0, "--ttft-p95", "1", *flags)) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and stderr in out.err and out.out == ""
