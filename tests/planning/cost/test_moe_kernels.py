"""vLLM's fused-MoE kernel rows (core/planning/cost/fits/data/vllm_moe_kernels.csv), the kernel model and its fit
(`core.planning.cost.fits.moe_kernels`), and the saved run of `python -m bench.moe_kernels`
(bench/results/moe-kernels.json)."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from bench.moe_kernels import deployment_comparison, fits_and_held_out, uniform_routing_fits
from core.errors import InvalidArgumentError
from core.planning.cost.fits import moe_kernels as mk
from tests.conftest import ROOT

SAVED = ROOT / "bench" / "results" / "moe-kernels.json"


def test_provenance_and_row_counts():
    header = mk.provenance()
    for fact in (
        "ai-dynamo/aiconfigurator",
        "095f58a51c4ca8e61b66ec108d86f223f8d559ce",
        "Apache-2.0",
        "moe/vllm/",
        "moe_perf.parquet",
        "balanced and moe_ep_size 1",
    ):
        assert fact in header
    rows = mk.load_rows()
    assert tuple(rows.columns) == mk.COLUMNS
    # the per-table counts the header states (balanced, EP 1, the three formats)
    counts = rows.groupby(["gpu", "version"]).size().to_dict()
    assert counts == {
        ("h100-80gb", "0.14.0"): 2322,
        ("h100-80gb", "0.19.0"): 2538,
        ("h200-141gb", "0.14.0"): 2322,
        ("h200-141gb", "0.18.0"): 3564,
        ("h200-141gb", "0.19.0"): 2754,
    }
    assert len(rows) == 13500
    for fact in ("13,500", "2,322 of 37,762", "2,538 of 46,494", "3,564 of 64,260", "2,754 of 48,195"):
        assert fact in header
    assert set(rows["moe_dtype"]) == set(mk.FORMATS)
    # the kernel each version's rows name (docs: Marlin at 0.14.0, the moe_wna16 path labelled Marlin later)
    sources = rows.groupby(["moe_dtype", "version"])["kernel_source"].unique().to_dict()
    assert list(sources["int4_wo", "0.14.0"]) == ["vllm_marlin_moe"]
    assert list(sources["int4_wo", "0.19.0"]) == ["vllm_marlin_int4_moe"]
    assert list(sources["fp8_block", "0.18.0"]) == ["vllm_fused_moe"]
    assert (rows["latency_ms"] > 0).all()


def test_one_row_against_its_source():
    """H200 SXM, vLLM 0.14.0 table (h200_sxm/moe/vllm/0.14.0/moe_perf.parquet at 095f58a51c4c), the row at index
    21105: kernel_source vllm_marlin_moe, moe_dtype int4_wo, 4 tokens, hidden 7,168, width 2,048, top 8 of 384
    experts (Kimi-K2.5's shape), moe_tp_size 8, moe_ep_size 1, balanced: latency 0.06563200056552887 ms; its
    repeat (index 21685) 0.066240 ms."""
    rows = mk.load_rows()
    match = rows[
        (rows["gpu"] == "h200-141gb")
        & (rows["version"] == "0.14.0")
        & (rows["moe_dtype"] == "int4_wo")
        & (rows["num_tokens"] == 4)
        & mk.shape_mask(rows, mk.MoeShape(7168, 2048, 8, 384))
        & (rows["moe_tp_size"] == 8)
    ]
    assert list(match["kernel_source"]) == ["vllm_marlin_moe"] * 2
    assert match["latency_ms"].iloc[0] == pytest.approx(0.06563200056552887, rel=5e-6)
    assert match["latency_ms"].iloc[1] == pytest.approx(0.066240, rel=5e-6)
    # the repeats are averaged before use
    assert mk.measured_ms(match, 4) == pytest.approx((0.065632 + 0.066240) / 2, rel=1e-9)


def _torch_balanced(num_tokens: int, topk: int, num_experts: int) -> int:
    """aiconfigurator's balanced routing (collector/helper.py balanced_logits at the commit of the data), redone
    in torch on CPU (its tensors' dtypes: int64 indices, float32 after the true division): the distinct experts
    chosen."""
    stride = math.ceil(num_experts / topk)
    tokens = torch.arange(num_tokens).unsqueeze(1)
    slots = torch.arange(topk).unsqueeze(0)
    if num_tokens >= stride:
        chosen = (tokens + slots * stride) % num_experts
    else:
        chosen = (tokens * stride / num_tokens + slots * stride) % num_experts
    return int(torch.unique(chosen.long()).numel())


def test_balanced_routing_matches_the_collectors_construction():
    rows = mk.load_rows()
    combos = sorted(
        {(int(n), int(k), int(e)) for n, k, e in rows[["num_tokens", "topk", "num_experts"]].to_numpy()}
    )
    for n, k, e in combos:
        assert mk.balanced_experts_touched(n, k, e) == _torch_balanced(n, k, e), (n, k, e)
    # the held-out shapes: every choice a distinct expert until all are touched
    for shape in mk.HELD_OUT_SHAPES.values():
        for n in (1, 4, 8, 16, 1024):
            assert mk.balanced_experts_touched(n, shape.topk, shape.num_experts) == min(
                shape.num_experts, n * shape.topk
            )
    with pytest.raises(InvalidArgumentError):
        mk.balanced_experts_touched(0, 8, 128)


def test_kernel_model_by_hand():
    """Qwen3-235B-A22B's experts (hidden 4,096, width 1,536, 8 of 128) in FP8 on one of 2 H200s (4.8 TB/s, FP8 peak
    1,979 TFLOP/s): one expert is 3 x 4,096 x 1,536 / 2 = 9,437,184 bytes. 4 tokens touch 32 experts:
    301,989,888 bytes = 62.9146 us at 4.8 TB/s; 2 x 4 x 8 x 9,437,184 = 603,979,776 FLOPs = 0.3052 us. With
    fixed 40 us, bandwidth 0.75, FLOP/s 0.2: 40 + 62.9146 / 0.75 = 123.886 us (memory-bound). 8,192 tokens touch
    all 128 (1,207,959,552 bytes, 251.658 us); 2 x 8,192 x 8 x 9,437,184 = 1,236,950,581,248 FLOPs = 625.038 us
    at peak: 40 + 625.038 / 0.2 = 3,165.19 us (compute-bound)."""
    rows = pd.DataFrame(
        {
            "gpu": ["h200-141gb"] * 2,
            "version": ["0.19.0"] * 2,
            "kernel_source": ["vllm_fused_moe"] * 2,
            "moe_dtype": ["fp8_block"] * 2,
            "num_tokens": [4, 8192],
            "hidden_size": [4096] * 2,
            "inter_size": [1536] * 2,
            "topk": [8] * 2,
            "num_experts": [128] * 2,
            "moe_tp_size": [2] * 2,
            "latency_ms": [0.1, 3.0],
        }
    )
    memory, compute = mk.ideal_seconds(rows)
    assert memory == pytest.approx([301_989_888 / 4.8e12, 1_207_959_552 / 4.8e12], rel=1e-12)
    assert compute == pytest.approx([603_979_776 / 1.979e15, 1_236_950_581_248 / 1.979e15], rel=1e-12)
    # uniform routing expects 128 (1 - (120 / 128)^4) = 29.13 experts at 4 tokens
    uniform, _ = mk.ideal_seconds(rows, routing="uniform")
    assert uniform[0] == pytest.approx(128 * (1 - (120 / 128) ** 4) * 9_437_184 / 4.8e12, rel=1e-12)
    model = mk.KernelModel(40e-6, 0.75, 0.2)
    seconds = model.seconds(memory, compute)
    assert seconds[0] == pytest.approx(40e-6 + 301_989_888 / 4.8e12 / 0.75, rel=1e-12)
    assert seconds[0] == pytest.approx(123.886e-6, rel=1e-5)
    assert seconds[1] == pytest.approx(3165.19e-6, rel=1e-5)
    assert mk.expert_bytes(mk.HELD_OUT_SHAPES["qwen3-235b-a22b"], "fp8_block", 2) == 128 * 9_437_184
    # int4 at the planner's 4.5 bits a parameter, MXFP4 at 4.25
    assert mk.BYTES_PER_PARAM == {"fp8_block": 1.0, "int4_wo": 0.5625, "w4a16_mxfp4": 0.53125}
    with pytest.raises(InvalidArgumentError):
        mk.KernelModel(40e-6, 1.2, 0.2)


def test_fit_recovers_the_parameters_of_synthetic_rows():
    rows = mk.load_rows()
    rows = rows[(rows["moe_dtype"] == "fp8_block") & (rows["version"] == "0.19.0")]
    memory, compute = mk.ideal_seconds(rows)
    truth = mk.KernelModel(35e-6, 0.7, 0.25)
    exact = truth.seconds(memory, compute)
    fit = mk.fit_kernel_model(memory, compute, exact)
    assert fit.rms_log_error < 1e-9
    assert fit.model.fixed_s == pytest.approx(35e-6, rel=1e-6)
    assert fit.model.bandwidth_efficiency == pytest.approx(0.7, rel=1e-6)
    assert fit.model.flops_efficiency == pytest.approx(0.25, rel=1e-6)
    # 5 % log-normal noise: the parameters within a few percent, the RMS log error the noise's
    noise = np.random.default_rng(7).normal(0.0, 0.05, size=exact.size)
    noisy = mk.fit_kernel_model(memory, compute, exact * np.exp(noise))
    assert noisy.model.fixed_s == pytest.approx(35e-6, rel=0.03)
    assert noisy.model.bandwidth_efficiency == pytest.approx(0.7, rel=0.03)
    assert noisy.model.flops_efficiency == pytest.approx(0.25, rel=0.03)
    assert noisy.rms_log_error == pytest.approx(0.05, rel=0.1)
    with pytest.raises(InvalidArgumentError):
        mk.fit_kernel_model(memory[:3], compute[:3], exact[:3])


def test_measured_latency_interpolates_in_log_tokens():
    rows = mk.load_rows()
    one = rows[
        (rows["gpu"] == "h200-141gb")
        & (rows["version"] == "0.19.0")
        & (rows["moe_dtype"] == "fp8_block")
        & mk.shape_mask(rows, mk.HELD_OUT_SHAPES["minimax-m2.5"])
        & (rows["moe_tp_size"] == 4)
    ]
    at = one.set_index("num_tokens")["latency_ms"]
    assert mk.measured_ms(one, 16) == pytest.approx(at[16])
    # 24 tokens: halfway in log between 16 and 32? log(24) sits at log2(1.5) = 0.585 of the way
    w = math.log(24 / 16) / math.log(2)
    assert mk.measured_ms(one, 24) == pytest.approx(at[16] + w * (at[32] - at[16]))
    with pytest.raises(InvalidArgumentError):
        mk.measured_ms(one, 20000)
    with pytest.raises(InvalidArgumentError):
        mk.measured_ms(rows.iloc[:0], 4)


def test_moe_layers_of_the_held_out_presets():
    # Qwen3-235B-A22B 94 layers all MoE; MiniMax-M2.5 62; Kimi-K2.5 61 with the first dense
    assert {m: mk.moe_layers(m, s) for m, s in mk.HELD_OUT_SHAPES.items()} == {
        "qwen3-235b-a22b": 94,
        "minimax-m2.5": 62,
        "kimi-k2.5": 60,
    }
    with pytest.raises(InvalidArgumentError):
        mk.moe_layers("kimi-k2.5", mk.MoeShape(7168, 2048, 8, 100))


def _numbers(tree, prefix="") -> dict:
    """{path: value} of a JSON tree's leaves (strings and booleans as they are)."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _numbers(sub, f"{prefix}/{key}").items()}
    return {prefix: tree}


def test_step_model_charge_is_the_breakdowns_expert_part():
    """step_model_expert_seconds against StepTimeModel.breakdown: the memory roof with and without the expert
    bytes, the compute roof with and without the expert FLOPs, over the MoE layers."""
    from dataclasses import replace

    from core.planning.catalog.hardware import GPUS
    from core.planning.catalog.models import MODELS
    from core.planning.cost.fits.engine_profiles import engine_step_defaults
    from core.planning.cost.step_time import from_specs

    step = from_specs(
        MODELS["kimi-k2.5"], GPUS["h200-141gb"], 8, "int4", **engine_step_defaults("vllm-cross-model")
    )
    no_reads = replace(step, expert_weight_bytes=0.0)
    no_flops = replace(
        step, flops_per_token=step.flops_per_token - step.expert_flops_per_token, expert_flops_per_token=0.0
    )
    for n in (4, 1024):
        memory, compute = mk.step_model_expert_seconds(step, n, 60)
        whole = step.breakdown(n, 0.0)
        assert 60 * memory == pytest.approx(
            float(whole.memory_s - no_reads.breakdown(n, 0.0).memory_s), rel=1e-9
        )
        assert 60 * compute == pytest.approx(
            float(whole.compute_s - no_flops.breakdown(n, 0.0).compute_s), rel=1e-9
        )


def test_saved_run_equals_recomputing():
    saved = json.loads(SAVED.read_text())
    rows = mk.load_rows()
    fits, held_out, models = fits_and_held_out(rows)
    for fmt, by_version in fits.items():
        for version, fit in by_version.items():
            stored = saved["fits"][fmt][version]
            for key in ("fixed_us", "bandwidth_efficiency", "flops_efficiency", "rms_log_err"):
                assert stored[key] == pytest.approx(fit[key], rel=1e-6), (fmt, version, key)
            assert stored["rows"] == fit["rows"]
    assert _numbers(saved["held_out"]) == pytest.approx(_numbers(held_out), rel=1e-6)
    assert _numbers(saved["fits_uniform_routing"]) == pytest.approx(
        _numbers(uniform_routing_fits(rows)), rel=1e-6
    )
    deployments = deployment_comparison(rows, models)
    assert len(saved["deployments"]) == len(deployments) == 4
    for stored, now in zip(saved["deployments"], deployments, strict=True):
        assert (stored["model"], stored["tp"], stored["moe_layers"]) == (
            now["model"],
            now["tp"],
            now["moe_layers"],
        )
        for n, point in now["by_tokens"].items():
            for key in ("lab_charge_us", "lab_memory_us", "lab_compute_us"):
                assert stored["by_tokens"][n][key] == pytest.approx(point[key], rel=1e-9)
            assert stored["by_tokens"][n]["measured_us"] == pytest.approx(point["measured_us"], rel=1e-9)
    profile = saved["end_to_end_profile"]
    from core.planning.cost.fits.engine_profiles import VLLM_CROSS_MODEL_PROFILE

    assert profile["expert_flops_efficiency"] == VLLM_CROSS_MODEL_PROFILE["expert_flops_efficiency"]
    assert profile["expert_bandwidth_efficiency"] == VLLM_CROSS_MODEL_PROFILE["expert_bandwidth_efficiency"]
