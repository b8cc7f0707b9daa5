"""The rows a step's expert GEMMs compute: vLLM 0.12's padded DeepGEMM kernel worked by hand, which rows ran it."""

from dataclasses import replace

import numpy as np
import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.expert_rows import (
    block_fp8_experts,
    check_vllm_version,
    moe_tensor_parallel,
    padded_expert_rows,
    vllm_expert_block_rows,
    vllm_version,
)
from core.planning.cost.fits.benchmark_replay import step_model
from core.planning.cost.fits.published_vllm_rows import ROWS, expert_block_rows
from core.planning.cost.step_time import from_specs

# Qwen3-235B-A22B's config.json: 94 layers, hidden 4,096, 128 experts of moe_intermediate_size 1,536, 8 a token.
LAYERS, HIDDEN, EXPERTS, TOP_K, EXPERT_INTERMEDIATE = 94, 4096, 128, 8, 1536


def test_padded_rows_by_hand():
    # round_up(n x 8 + 128 x 127, 128): 4 tokens 32 + 16,256 = 16,288 -> 16,384; 100 tokens 17,056 -> 17,152
    assert padded_expert_rows(4, TOP_K, EXPERTS, 128) == 16_384
    assert padded_expert_rows(100, TOP_K, EXPERTS, 128) == 17_152
    assert padded_expert_rows(0, TOP_K, EXPERTS, 128) == 0.0
    # one 8,192-token prefill chunk: 65,536 routed rows + 16,256 -> 81,792 (already a multiple of 128)
    assert padded_expert_rows(8192, TOP_K, EXPERTS, 128) == 81_792
    rows = padded_expert_rows(np.array([0.0, 4.0, 100.0]), TOP_K, EXPERTS, 128)
    assert rows.tolist() == [0.0, 16_384.0, 17_152.0]


def test_a_decode_step_computes_the_padding_at_the_dense_efficiency():
    """Qwen3-235B-A22B FP8 at TP 2 on H200: 4 decoding tokens, and vLLM 0.12's kernel computes 16,384 rows of
    each MoE layer's two GEMMs (gate-up 4,096 x 2 x 768, down 768 x 4,096 on a GPU) where routing fills 32: the
    16,352 rows of padding at the dense efficiency on top of the routed rows' price."""
    gpu = GPUS["h200-141gb"]
    routed = from_specs(
        MODELS["qwen3-235b-a22b"], gpu, 2, "fp8", expert_flops_efficiency=0.2, flops_efficiency=0.5
    )
    padded = replace(routed, expert_block_rows=128)
    per_row = (
        2 * 3 * HIDDEN * (EXPERT_INTERMEDIATE // 2) * LAYERS
    )  # FLOPs of one row over the layers, one GPU
    assert routed.expert_flops_per_token / TOP_K == pytest.approx(per_row, rel=1e-9)
    assert 16_384 * per_row == pytest.approx(2.9e13, rel=0.01)  # the module docstring's 29 TFLOP
    step = (4, 4000, 4004)  # 4 decodes at a context of 1,000
    extra = float(padded.breakdown(*step).compute_s) - float(routed.breakdown(*step).compute_s)
    assert extra == pytest.approx((16_384 - 32) * per_row / (gpu.peak_fp8_flops * 0.5), rel=1e-9)
    assert extra > 0.025  # ~29 ms of tiles: the step is compute-bound at 4 tokens
    assert float(padded.breakdown(*step).memory_s) == float(routed.breakdown(*step).memory_s)  # routed reads
    assert padded.seconds(*step) == float(padded.breakdown(*step).total_s)
    assert padded.step_seconds(*step) == pytest.approx(padded.seconds(*step), rel=1e-12)
    # an 8,192-token prefill chunk: 16,256 rows of padding on 65,536 routed ones
    chunk = (8192, 0, 8192 * 8193 / 2)
    extra = float(padded.breakdown(*chunk).compute_s) - float(routed.breakdown(*chunk).compute_s)
    assert extra == pytest.approx(16_256 * per_row / (gpu.peak_fp8_flops * 0.5), rel=1e-9)
    # flat in the batch: 4 -> 20 tokens adds 128 rows of tiles (16,384 -> 16,512)
    assert padded_expert_rows(20, TOP_K, EXPERTS, 128) - padded_expert_rows(4, TOP_K, EXPERTS, 128) == 128


def test_a_dp_rank_pads_every_ranks_tokens_with_the_experts_split_over_all_ranks():
    """Attention DP 2 at tp 1 (vLLM 0.12: one MoE TP group of 2, every rank's tokens gathered): 4 decodes on each
    rank make 64 routed rows, round_up(64 + 16,256, 128) = 16,384 computed, each row of an expert split 2 ways,
    i.e. half of what expert_flops_per_token / k (the tp 1 rank's) counts."""
    gpu = GPUS["h200-141gb"]
    model = MODELS["qwen3-235b-a22b"]
    rank = from_specs(
        model, gpu, 1, "fp8", data_parallel=2, expert_flops_efficiency=0.2, flops_efficiency=0.5
    )
    padded = replace(rank, expert_block_rows=128)
    per_row = 2 * 3 * HIDDEN * EXPERT_INTERMEDIATE * LAYERS / 2  # one row of an expert split over 2 GPUs
    assert rank.expert_token_ranks == 2 and rank.expert_flops_per_token / TOP_K == pytest.approx(2 * per_row)
    step = (4, 4000, 4004)
    extra = float(padded.breakdown(*step).compute_s) - float(rank.breakdown(*step).compute_s)
    assert extra == pytest.approx((16_384 - 64) * per_row / (gpu.peak_fp8_flops * 0.5), rel=1e-9)
    # the same GPU's work as TP 2 (one group of 2 GPUs, 8 decodes): the padding costs the same
    tp2 = from_specs(model, gpu, 2, "fp8", expert_flops_efficiency=0.2, flops_efficiency=0.5)
    tp2_extra = float(replace(tp2, expert_block_rows=128).breakdown(8, 8000, 8008).compute_s) - float(
        tp2.breakdown(8, 8000, 8008).compute_s
    )
    assert extra == pytest.approx(tp2_extra, rel=1e-9)


def test_which_vllm_runs_the_padded_kernel():
    assert (
        vllm_version("0.12.0") == (0, 12, 0) and vllm_version("unknown") is None and vllm_version("") is None
    )
    assert vllm_expert_block_rows("0.12.0", True, "h200-141gb", 2) == 128
    assert vllm_expert_block_rows("0.12.1", True, "h100-80gb", 4) == 128
    assert vllm_expert_block_rows("0.11.2", True, "h100-80gb", 4) == 0  # not read: taken as routed
    assert vllm_expert_block_rows("0.13.0", True, "h200-141gb", 2) == 0  # pull request 30494
    assert vllm_expert_block_rows("0.12.0", False, "h200-141gb", 2) == 0  # MXFP4, int4 or per-tensor experts
    assert vllm_expert_block_rows("0.12.0", True, "a100-80gb", 2) == 0  # no DeepGEMM before Hopper
    assert vllm_expert_block_rows("0.12.0", True, "h200-141gb", 8) == 0  # off by default at MoE TP 8
    assert vllm_expert_block_rows("unknown", True, "h200-141gb", 2) == 0
    # in the sample only Qwen3-235B-A22B's vLLM 0.12 rows (TP 2 / 4, EP rows included; its attention-DP rows,
    # pvr.ATTENTION_DP_ROWS, too) ran it
    padded = {(r.model, r.backend_version) for r in ROWS if expert_block_rows(r)}
    assert padded == {("qwen3-235b-a22b", "0.12.0")}
    assert sum(1 for r in ROWS if expert_block_rows(r)) == 32
    row = next(r for r in ROWS if expert_block_rows(r))
    assert step_model(row, {}).expert_block_rows == 128
    minimax = next(r for r in ROWS if r.model == "minimax-m2.5")
    assert step_model(minimax, {}).expert_block_rows == 0


def test_padding_needs_routed_experts():
    dense = from_specs(MODELS["llama-3.1-8b"], GPUS["h100-80gb"])
    with pytest.raises(InvalidArgumentError, match="expert_block_rows"):
        replace(dense, expert_block_rows=128)
    moe = from_specs(MODELS["qwen3-235b-a22b"], GPUS["h200-141gb"], 2, "fp8")
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="expert_block_rows"):
            replace(moe, expert_block_rows=bad)
        with pytest.raises(InvalidArgumentError, match="expert_block_rows"):
            from_specs(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], expert_block_rows=bad)
    # a dense model, or every expert read (the ablation), has no routed rows to pad: the kernel is moot there
    assert from_specs(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], expert_block_rows=128).expert_block_rows == 0
    ablation = from_specs(
        MODELS["qwen3-235b-a22b"],
        GPUS["h200-141gb"],
        2,
        "fp8",
        moe_reads_all_experts=True,
        expert_block_rows=128,
    )
    assert ablation.expert_block_rows == 0


def test_block_fp8_experts_is_the_checkpoints_format_loaded_as_it_is():
    fp8, bf16, minimax = MODELS["qwen3-235b-a22b-fp8"], MODELS["qwen3-235b-a22b"], MODELS["minimax-m2.5"]
    assert block_fp8_experts(fp8, "fp8") and block_fp8_experts(minimax, "fp8")
    assert not block_fp8_experts(bf16, "fp8")  # a 16-bit checkpoint quantized online: one scale per tensor
    assert not block_fp8_experts(fp8, "bf16")  # the FP8 checkpoint served in 16 bits
    assert not block_fp8_experts(MODELS["gpt-oss-120b"], "int4") and not block_fp8_experts(
        MODELS["kimi-k2.5"], "int4"
    )
    # MoE TP: tp x D, 1 with expert parallelism
    assert (moe_tensor_parallel(2), moe_tensor_parallel(2, 4), moe_tensor_parallel(2, 4, True)) == (2, 8, 1)


@pytest.mark.parametrize(
    ("model", "weights", "gpu", "tp", "dp", "ep", "rows"),
    [
        ("qwen3-235b-a22b-fp8", "auto", "h200-141gb", 2, 1, False, 128),
        ("qwen3-235b-a22b-fp8", "fp8", "h100-80gb", 4, 1, False, 128),
        ("qwen3-235b-a22b-fp8", "auto", "h200-141gb", 2, 2, False, 128),  # MoE TP 4
        ("qwen3-235b-a22b-fp8", "auto", "h200-141gb", 4, 2, False, 0),  # MoE TP 8: off by default
        ("qwen3-235b-a22b-fp8", "auto", "h200-141gb", 8, 1, True, 128),  # EP: whole experts, MoE TP 1
        ("qwen3-235b-a22b-fp8", "auto", "a100-80gb", 4, 1, False, 0),
        ("qwen3-235b-a22b", "fp8", "h200-141gb", 2, 1, False, 0),
        ("minimax-m2.5", "auto", "h200-141gb", 4, 1, False, 128),
    ],
)
def test_from_specs_prices_the_kernel_of_the_vllm_release_it_is_given(model, weights, gpu, tp, dp, ep, rows):
    """`from_specs(..., vllm_version=...)` applies `vllm_expert_block_rows` to the deployment: 0.12 pads where the
    rule says; 0.13 (pull request 30494) and today's vLLM (no version) never; an explicit expert_block_rows wins."""
    spec, gpu_spec = MODELS[model], GPUS[gpu]
    moe = {"data_parallel": dp, "expert_parallel": ep} if dp > 1 or ep else {}
    at = {
        v: from_specs(spec, gpu_spec, tp, weights, vllm_version=v, **moe) for v in ("0.12.0", "0.13.0", None)
    }
    assert (at["0.12.0"].expert_block_rows, at["0.13.0"].expert_block_rows, at[None].expert_block_rows) == (
        rows,
        0,
        0,
    )
    if rows:  # the same model as the rule's rows given by hand
        assert at["0.12.0"] == from_specs(spec, gpu_spec, tp, weights, expert_block_rows=rows, **moe)
    given = from_specs(spec, gpu_spec, tp, weights, vllm_version="0.13.0", expert_block_rows=64, **moe)
    assert given.expert_block_rows == 64


@pytest.mark.parametrize("bad", ["0.x", "latest", "v0.12", " ", 12])
def test_a_vllm_version_that_names_no_release_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="--vllm-version"):
        check_vllm_version(bad)
    with pytest.raises(InvalidArgumentError, match="--vllm-version"):
        from_specs(MODELS["qwen3-235b-a22b-fp8"], GPUS["h200-141gb"], 2, vllm_version=bad)
    assert check_vllm_version(None) is None and check_vllm_version("0.12") == "0.12"
    assert check_vllm_version("") is None  # a page's empty box: today's vLLM
