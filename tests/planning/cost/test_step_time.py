"""The step-time model: hand-worked steps (TP all-reduce, PP stages, FP8 peak) and the least-squares fit."""

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.fits.step_fit import FIT_PARAMETERS, fit_step_time
from core.planning.cost.step_model import StepTimeModel
from core.planning.cost.step_time import ALL_REDUCE_LATENCY_S, from_specs, opt_13b_a100
from core.sched import ScheduledStep, step_load


def test_tp2_decode_step_by_hand():
    # Llama-3.1-8B (8.03e9 parameters, 32 layers, hidden 4,096, 8 KV heads x 128) in bf16 on 2 x H100 SXM.
    model = from_specs(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], tensor_parallel=2)
    weights = 8.03e9 * 2 / 2  # bytes per GPU
    kv_per_token = 2 * 32 * (8 // 2) * 128 * 2  # K and V, 4 KV heads per GPU: 65,536 B
    assert (model.weight_bytes, model.kv_bytes_per_token) == (weights, kv_per_token)
    # 2 all-reduces per layer, 2 (tp - 1) / tp = 1 x hidden x 2 bytes per token each; NVLink 900 GB/s both ways
    assert model.comm_bytes_per_token == 2 * 32 * 1 * 4096 * 2
    assert model.comm_latency_s == pytest.approx(64 * ALL_REDUCE_LATENCY_S)
    assert model.interconnect_bandwidth == 450e9
    # 8 sequences decoding at a context of 1,000 tokens: memory-bound
    memory = (weights + kv_per_token * (8_000 + 8)) / (3.35e12 * 0.8)
    compute = (2 * 8.03e9 / 2 * 8 + 4 * 32 * 4096 / 2 * 8 * 1001) / (989e12 * 0.5)
    comm = 64e-5 + 524_288 * 8 / 450e9
    expected = 0.015 + max(memory, compute) + comm
    assert memory > compute
    assert model.decode_step_seconds(8, 1000) == pytest.approx(expected, rel=1e-12)
    assert float(model.step_time(8, 8000, 8 * 1001)) == pytest.approx(expected, rel=1e-12)
    parts = model.breakdown(8, 8000, 8 * 1001)
    assert float(parts.total_s) == pytest.approx(expected, rel=1e-12)
    assert float(parts.comm_s) == pytest.approx(comm)


def test_pp2_runs_the_stages_in_sequence_plus_one_hand_off():
    # Llama-3.1-70B bf16 on 2 x H200 as 2 pipeline stages of 40 layers (+ embedding or head: 1.05e9 params)
    model = from_specs(MODELS["llama-3.1-70b"], GPUS["h200-141gb"], pipeline_parallel=2)
    stage_params = 40 * MODELS["llama-3.1-70b"].layer_params + 1_050_673_152
    assert model.weight_bytes == pytest.approx(stage_params * 2)
    assert model.pipeline_stages == 2
    assert model.comm_bytes_per_token == 8192 * 2  # one hand-off of the hidden state per token
    assert model.comm_latency_s == pytest.approx(ALL_REDUCE_LATENCY_S)
    stage = (model.weight_bytes + model.kv_bytes_per_token * (4 * 500 + 4)) / (4.8e12 * 0.8)
    expected = 0.015 + 2 * stage + 1e-5 + 4 * 16_384 / 450e9
    assert model.step_seconds(4, 2000, 4 * 501) == pytest.approx(expected, rel=1e-12)


def test_fp8_weights_use_the_fp8_peak_and_one_gpu_has_no_traffic():
    bf16 = from_specs(MODELS["llama-3.1-8b"], GPUS["h100-80gb"])
    fp8 = from_specs(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], weight_dtype="fp8")
    assert (bf16.peak_flops, fp8.peak_flops) == (989e12, 1979e12)
    assert fp8.weight_bytes == bf16.weight_bytes / 2
    assert (bf16.comm_bytes_per_token, bf16.comm_latency_s, bf16.pipeline_stages) == (0.0, 0.0, 1)
    assert from_specs(MODELS["llama-3.1-8b"], GPUS["a100-40gb"], weight_dtype="fp8").peak_flops == 312e12


def test_paper_model_is_unchanged():
    assert from_specs(MODELS["opt-13b"], GPUS["a100-40gb"]) == opt_13b_a100()
    model = opt_13b_a100()
    expected = 0.015 + (25.8e9 + 819_200 * (10_000 + 10)) / (1555e9 * 0.8)
    assert model.step_seconds(10, 10_000, 10_010) == pytest.approx(expected)
    assert model.step_seconds(0, 0) == 0.0 and float(model.step_time(0, 5)) == 0.0


def test_model_rejects_bad_fields():
    with pytest.raises(InvalidArgumentError, match="pipeline_stages"):
        replace(opt_13b_a100(), pipeline_stages=0)
    with pytest.raises(InvalidArgumentError, match="comm_latency_s"):
        replace(opt_13b_a100(), comm_latency_s=-1.0)
    with pytest.raises(InvalidArgumentError, match="interconnect_bandwidth"):
        replace(opt_13b_a100(), interconnect_bandwidth=0.0)


def _shapes(seed: int, count: int = 80):
    """Decode batches (memory-bound) and prefill chunks (compute-bound) of OPT-13B sizes."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        if rng.random() < 0.5:
            batch, ctx = int(rng.integers(1, 256)), int(rng.integers(10, 2000))
            rows.append((batch, batch * ctx, batch * (ctx + 1)))
        else:
            chunk = int(rng.integers(64, 4096))
            rows.append((chunk, 0, chunk * (chunk + 1) / 2))
    n, kv, pairs = map(np.array, zip(*rows, strict=True))
    return {"new_tokens": n, "kv_tokens_read": kv, "attention_pairs": pairs}


def test_fit_recovers_known_parameters_exactly():
    truth = opt_13b_a100(
        bandwidth_efficiency=0.6, flops_efficiency=0.35, overhead_s=0.004, per_token_overhead_s=2e-5
    )
    steps = _shapes(0)
    steps["seconds"] = truth.step_time(steps["new_tokens"], steps["kv_tokens_read"], steps["attention_pairs"])
    fit = fit_step_time(pd.DataFrame(steps), opt_13b_a100())  # from the paper's defaults
    for name in FIT_PARAMETERS:
        assert getattr(fit.model, name) == pytest.approx(getattr(truth, name), rel=1e-9), name
    assert fit.rms_relative_error < 1e-12 and fit.at_bound == ()
    assert 0 < fit.compute_bound_steps < 80
    assert fit.to_dict()["num_steps"] == 80


def test_fit_with_noise_stays_close_and_reports_residuals():
    truth = opt_13b_a100(bandwidth_efficiency=0.7, flops_efficiency=0.45, overhead_s=0.010)
    steps = _shapes(1, 200)
    clean = truth.step_time(steps["new_tokens"], steps["kv_tokens_read"], steps["attention_pairs"])
    noise = np.random.default_rng(2).normal(1.0, 0.03, len(clean))  # 3% multiplicative noise
    steps["seconds"] = clean * noise
    fit = fit_step_time(steps, opt_13b_a100())
    assert fit.model.bandwidth_efficiency == pytest.approx(0.7, rel=0.03)
    assert fit.model.flops_efficiency == pytest.approx(0.45, rel=0.03)
    assert fit.model.overhead_s == pytest.approx(0.010, rel=0.1)
    assert np.allclose(fit.residuals_s, fit.predicted_s - steps["seconds"])
    assert 0.02 < fit.rms_relative_error < 0.04  # the noise, not model error


def test_fit_of_the_overhead_alone_and_the_efficiency_bound():
    truth = opt_13b_a100(overhead_s=0.002)
    steps = _shapes(3)
    steps["seconds"] = truth.step_time(steps["new_tokens"], steps["kv_tokens_read"], steps["attention_pairs"])
    fit = fit_step_time(steps, opt_13b_a100(), fit=("overhead_s",))
    assert fit.model.overhead_s == pytest.approx(0.002, rel=1e-9)
    assert fit.model.bandwidth_efficiency == 0.8 and fit.fitted == ("overhead_s",)
    # data faster than the datasheet allows: the efficiencies stop at 1 and say so
    fast = dict(steps, seconds=steps["seconds"] * 0.3)
    bounded = fit_step_time(fast, opt_13b_a100())
    assert {"bandwidth_efficiency", "flops_efficiency"} & set(bounded.at_bound)
    assert bounded.model.bandwidth_efficiency <= 1.0 and bounded.model.flops_efficiency <= 1.0


@pytest.mark.parametrize(
    ("steps", "fit", "message"),
    [
        ({"new_tokens": [1, 2]}, FIT_PARAMETERS, "columns"),
        (
            {"new_tokens": [1], "kv_tokens_read": [0], "attention_pairs": [1], "seconds": [0.1]},
            FIT_PARAMETERS,
            "at least 5 steps",
        ),
        (
            {
                "new_tokens": [0, 1],
                "kv_tokens_read": [0, 0],
                "attention_pairs": [0, 0],
                "seconds": [0.1, 0.1],
            },
            ("overhead_s",),
            "new_tokens > 0",
        ),
        (
            {
                "new_tokens": [1, 2],
                "kv_tokens_read": [0, 0],
                "attention_pairs": [1, 3],
                "seconds": [0.1, math.nan],
            },
            ("overhead_s",),
            "finite",
        ),
        (_shapes(0, 10) | {"seconds": np.ones(10)}, ("flops_efficiency",), "together"),
        (_shapes(0, 10) | {"seconds": np.ones(10)}, ("speed",), "fit names"),
    ],
)
def test_fit_rejects_bad_input(steps, fit, message):
    with pytest.raises(InvalidArgumentError, match=message):
        fit_step_time(steps, opt_13b_a100(), fit=fit)


class _Group:
    def __init__(self, num_seqs, length, num_prefill_total=0):
        self.num_seqs, self.length, self.num_prefill_total = num_seqs, length, num_prefill_total


def test_step_load_of_a_mixed_step_by_hand():
    step = ScheduledStep()
    step.decoding = [_Group(1, 100), _Group(2, 40)]
    step.num_decode_tokens, step.decode_context_tokens = 3, 100 + 2 * 40
    step.prefill_chunks = [(_Group(1, 0, 100), 0, 16), (_Group(2, 0, 40), 32, 8)]  # the second one completes
    load = step_load(step)
    assert (load.decode_tokens, load.prefill_tokens, load.new_tokens) == (3, 24, 27)
    assert load.output_tokens == 3 + 2  # the decodes, and both sequences of the completed prefill
    assert load.kv_tokens_read == 180 + 32
    assert load.attention_pairs == 180 + 3 + (16 * 17 / 2) + (8 * 32 + 8 * 9 / 2)


def test_the_lm_head_is_priced_per_sampled_token_when_split_out():
    split = replace(opt_13b_a100(), flops_per_token=2e10, lm_head_flops_per_output=5.8e9)
    # a 2,000-token prefill chunk samples one token: FLOPs 2e10 x 2,000 + 5.8e9 x 1 + attention
    flops = 2e10 * 2000 + 5.8e9 + 4 * 40 * 5120 * (2000 * 2001 / 2)
    assert split.step_seconds(2000, 0, 2000 * 2001 / 2, output_tokens=1) == pytest.approx(
        0.015 + flops / 156e12
    )
    assert float(split.step_time(2000, 0, 2000 * 2001 / 2, output_tokens=1)) == pytest.approx(
        0.015 + flops / 156e12
    )
    # without output_tokens every token is sampled (the decode default)
    assert split.step_seconds(2000, 0, 2000 * 2001 / 2) > split.step_seconds(2000, 0, 2000 * 2001 / 2, 0.0, 1)
    truth = replace(split, flops_efficiency=0.4, overhead_s=0.004)
    steps = _shapes(8, 60)
    steps["output_tokens"] = np.where(steps["kv_tokens_read"] > 0, steps["new_tokens"], 1)
    steps["seconds"] = truth.step_time(
        steps["new_tokens"],
        steps["kv_tokens_read"],
        steps["attention_pairs"],
        output_tokens=steps["output_tokens"],
    )
    fit = fit_step_time(steps, split)
    assert fit.model.flops_efficiency == pytest.approx(0.4, rel=1e-9) and fit.rms_relative_error < 1e-12


def test_a_model_built_by_hand_prices_like_the_formula():
    model = StepTimeModel(1e9, 1e5, 2e9, 1e6, 1e12, 1e14, 0.5, 0.25, 0.001, per_token_overhead_s=1e-6)
    # 4 decodes at 1,000 context: bytes 1e9 + 1e5 x 4,004; flops 8e9 + 1e6 x 4,004
    memory = (1e9 + 1e5 * 4004) / (1e12 * 0.5)
    compute = (8e9 + 1e6 * 4004) / (1e14 * 0.25)
    assert model.step_seconds(4, 4000, 4004) == pytest.approx(0.001 + 4e-6 + max(memory, compute))


def test_robust_fit_ignores_steps_slowed_by_another_process():
    truth = opt_13b_a100(bandwidth_efficiency=0.7, flops_efficiency=0.45, overhead_s=0.010)
    steps = _shapes(4, 200)
    clean = truth.step_time(steps["new_tokens"], steps["kv_tokens_read"], steps["attention_pairs"])
    slowed = np.random.default_rng(5).random(len(clean)) < 0.1  # one step in ten takes 2-4x as long
    steps["seconds"] = clean * np.where(slowed, np.random.default_rng(6).uniform(2, 4, len(clean)), 1.0)
    plain = fit_step_time(steps, opt_13b_a100())
    robust = fit_step_time(steps, opt_13b_a100(), robust=True)
    assert robust.robust and robust.to_dict()["robust"]
    for name in ("bandwidth_efficiency", "flops_efficiency", "overhead_s"):
        assert getattr(robust.model, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    assert abs(plain.model.bandwidth_efficiency - 0.7) > 5 * abs(robust.model.bandwidth_efficiency - 0.7)


def test_one_token_steps_may_have_their_own_overhead_and_the_fit_finds_it():
    cpu = opt_13b_a100(overhead_s=0.060, single_token_overhead_s=0.037)
    one = (25.8e9 + 819_200 * (100 + 1)) / (1555e9 * 0.8)
    assert cpu.step_seconds(1, 100, 101) == pytest.approx(0.037 + one)
    assert float(cpu.step_time(1, 100, 101)) == pytest.approx(0.037 + one)
    assert cpu.step_seconds(2, 200, 202) > 0.060  # two tokens pay the larger overhead
    steps = _shapes(7, 120)
    steps["new_tokens"][:20] = 1  # lone decodes
    steps["kv_tokens_read"][:20], steps["attention_pairs"][:20] = 500, 501
    steps["seconds"] = cpu.step_time(steps["new_tokens"], steps["kv_tokens_read"], steps["attention_pairs"])
    names = ("bandwidth_efficiency", "flops_efficiency", "overhead_s", "single_token_overhead_s")
    fit = fit_step_time(steps, opt_13b_a100(), fit=names)
    assert fit.model.single_token_overhead_s == pytest.approx(0.037, rel=1e-9)
    assert fit.model.overhead_s == pytest.approx(0.060, rel=1e-9)
    assert fit.to_dict()["single_token_overhead_s"] == pytest.approx(0.037, rel=1e-9)
    without_lone = {k: v[20:] for k, v in steps.items()}
    with pytest.raises(InvalidArgumentError, match="one token and of more"):
        fit_step_time(without_lone, opt_13b_a100(), fit=names)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tensor_parallel": 2},
        {"pipeline_parallel": 2},
        {"single": 0.03},
        {"lm_head": True},
        {"experts": True},  # not plain: `seconds` and `step_time` take the breakdown path
    ],
    ids=["tp1", "tp2", "pp2", "single-token", "lm-head", "moe"],
)
def test_number_paths_are_the_breakdown_bit_for_bit(overrides):
    """`seconds` (Python floats) and `step_time` with a number of new tokens (the simulator's decode runs)
    give exactly `breakdown`'s total (numpy float64, the reference) for numbers and arrays alike."""
    name = "gpt-oss-120b" if overrides.get("experts") else "llama-3.1-8b"
    model = from_specs(
        MODELS[name],
        GPUS["h100-80gb"],
        tensor_parallel=overrides.get("tensor_parallel", 1),
        pipeline_parallel=overrides.get("pipeline_parallel", 1),
    )
    if "single" in overrides:
        model = replace(model, single_token_overhead_s=overrides["single"])
    if overrides.get("lm_head"):
        model = replace(model, lm_head_flops_per_output=1.3e9, per_token_overhead_s=3e-6)
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 300))
        new = n if rng.random() < 0.5 else float(n) + 0.5
        read = float(rng.integers(0, 400_000))
        pairs = read * 3.7 + n * 12.5
        outputs = None if rng.random() < 0.5 else int(rng.integers(0, 8))
        reference = model.breakdown(new, read, pairs, outputs).total_s
        reference = float(np.where(np.asarray(new) > 0, reference, 0.0))
        assert model.seconds(new, read, pairs, outputs) == reference
        reads = read + np.arange(17, dtype=np.float64) * max(n, 1)
        for swap in (0.0, 4096.0):
            total = model.breakdown(new, reads, reads * 2 + 1, outputs).total_s + swap / model.swap_bandwidth
            expected = np.where(np.asarray(new) > 0, total, 0.0)
            got = model.step_time(new, reads, reads * 2 + 1, swap, outputs)
            assert got.dtype == np.float64 and got.shape == (17,)
            assert np.array_equal(got, expected)
