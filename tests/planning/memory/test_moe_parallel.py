"""A MoE model as vLLM serves it: data-parallel attention (`--data-parallel-size D`) and expert parallelism
(`--enable-expert-parallel`) in the capacity plan's memory (`core.planning.memory.kv_accounting`), against
hand-worked examples and vLLM's own expert placement (`determine_expert_map`, run in vLLM's interpreter)."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import get_gpu
from core.planning.catalog.models import MODELS
from core.planning.commands.capacity import capacity_main
from core.planning.commands.dispatch import main as slo_main
from core.planning.commands.predict_cli import predict_main
from core.planning.cost.fits import published_vllm as pv
from core.planning.cost.fits import published_vllm_rows as pvr
from core.planning.cost.fits.engine_profiles import VLLM_CROSS_MODEL_PROFILE
from core.planning.cost.step_time import ALL_REDUCE_LATENCY_S, from_specs
from core.planning.memory.kv_accounting import (
    expert_bytes_fraction,
    kv_bytes_per_token,
    weight_bytes_per_gpu,
    weight_split_per_gpu,
)
from core.planning.memory.plan import PlanInputs, plan, plan_from, replica_memory
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict, replica_steady_state
from core.planning.search.slo import config_deployment
from core.planning.search.slo_candidates import SloCandidates, enumerate_candidates
from core.planning.search.slo_eval import SloConfig
from core.serving.steady_state import SteadyStateSettings
from tests.conftest import ROOT
from tests.vllm_reference import run_vllm_script

SCRIPT = Path(__file__).with_name("vllm_expert_map_script.py")
DSV3 = MODELS["deepseek-v3"]
QWEN = MODELS["qwen3-235b-a22b"]
H200 = get_gpu("h200-141gb")
SETTINGS = SteadyStateSettings(initial_measured=200, max_requests=600)


def test_deepseek_v3_mla_latent_is_whole_on_every_tp_rank():
    """61 layers x (kv_lora_rank 512 + rope 64) x 2 bytes = 70,272 B per token on each of 8 TP ranks (vLLM's
    MLA spec caches the whole latent on every rank); divided by tp it would be 8,784."""
    assert 61 * (512 + 64) * 2 == 70_272
    for tp in (1, 8):
        assert kv_bytes_per_token(DSV3, "auto", tp) == 70_272


def test_deepseek_v3_on_8_h200_data_parallel_attention_gives_each_rank_its_cache():
    """TP 8: one cache of 70,272 B per token per GPU, one scheduler. DP 8 (tp 1) with EP: the same 70,272 B per
    token per GPU, but eight caches, one per rank: the server holds 8 x one rank's requests; each GPU keeps the
    attention and dense layers whole (fp8: 1 byte a parameter) and 32 of the 256 experts."""
    tp8 = plan(DSV3, H200, tensor_parallel=8, max_model_len=8192)
    dp8 = plan(DSV3, H200, tensor_parallel=1, data_parallel=8, expert_parallel=True, max_model_len=8192)
    assert tp8.kv_bytes_per_token == dp8.kv_bytes_per_token == 70_272
    assert dp8.num_gpus == tp8.num_gpus == 8 and dp8.replicas == 1
    assert dp8.max_concurrency_total == 8 * dp8.max_concurrency
    assert tp8.max_concurrency_total == tp8.max_concurrency
    # by hand: 58 MoE layers x 256 experts x 3 x 7,168 x 2,048 expert parameters, the rest dense
    experts = 58 * 256 * 3 * 7168 * 2048
    assert DSV3.expert_params == experts
    dense = DSV3.num_params - experts
    assert dp8.weights_bytes == math.ceil(dense + experts * 32 / 256)
    assert tp8.weights_bytes == math.ceil(DSV3.num_params / 8)
    assert "--data-parallel-size 8" in dp8.vllm_command and "--enable-expert-parallel" in dp8.vllm_command
    assert "--data-parallel-size" not in tp8.vllm_command


def test_qwen3_235b_expert_parallel_weights_per_gpu():
    """Qwen3-235B-A22B in bf16: 94 layers x 128 experts x 3 x 4,096 x 1,536 expert parameters. tp 8 with EP:
    16 whole experts per GPU, the same bytes as tp 8 alone; tp 4 x DP 3 with EP: ceil(128 / 12) = 11 experts on
    the most loaded GPU (vLLM gives the first 128 mod 12 = 8 ranks one more) and the dense part / 4."""
    experts = 94 * 128 * 3 * 4096 * 1536
    assert QWEN.expert_params == experts
    dense = QWEN.num_params - experts
    assert weight_bytes_per_gpu(QWEN, "bf16", 8, 1, 1, True) == math.ceil(
        2 * dense / 8 + 2 * experts * 16 / 128
    )
    assert weight_bytes_per_gpu(QWEN, "bf16", 8, 1, 1, True) == pytest.approx(
        weight_bytes_per_gpu(QWEN, "bf16", 8), abs=2
    )
    assert weight_bytes_per_gpu(QWEN, "bf16", 4, 1, 3, True) == math.ceil(
        2 * dense / 4 + 2 * experts * 11 / 128
    )
    # without EP every expert is split over the 12 GPUs
    assert weight_bytes_per_gpu(QWEN, "bf16", 4, 1, 3) == math.ceil(2 * dense / 4 + 2 * experts / 12)
    assert weight_split_per_gpu(QWEN, "bf16", 4, 1, 3, True)[1] == pytest.approx(2 * experts * 11 / 128)


def test_dense_and_unparallel_moe_weights_are_unchanged():
    """data_parallel 1 without EP is plain tp; a dense model's DP ranks each hold all of it / tp."""
    llama = MODELS["llama-3.1-70b"]
    assert weight_bytes_per_gpu(llama, "auto", 4, 1, 2) == weight_bytes_per_gpu(llama, "auto", 4)
    for tp in (1, 2, 4, 8):
        assert weight_bytes_per_gpu(QWEN, "auto", tp, 1, 1, False) == weight_bytes_per_gpu(QWEN, "auto", tp)


def test_bad_moe_layouts_are_refused():
    with pytest.raises(InvalidArgumentError, match="mixture-of-experts"):
        weight_bytes_per_gpu(MODELS["llama-3.1-8b"], "auto", 1, 1, 1, True)
    with pytest.raises(InvalidArgumentError, match="at least as many routed experts"):
        weight_bytes_per_gpu(MODELS["mixtral-8x7b"], "auto", 4, 1, 4, True)
    with pytest.raises(InvalidArgumentError, match="data_parallel"):
        plan(QWEN, H200, tensor_parallel=4, data_parallel=0)
    with pytest.raises(InvalidArgumentError, match="multiple of"):
        plan_from(PlanInputs(QWEN, H200, num_gpus=12, tensor_parallel=4, data_parallel=2))


def test_moe_replicas_are_separate_servers_in_the_command():
    """Two replicas of a MoE server of DP 2: `--data-parallel-size 2` and a comment to run it twice (one vLLM
    server's DP ranks share the experts); a dense model's replicas stay one `--data-parallel-size`."""
    two = plan_from(
        PlanInputs(QWEN, H200, num_gpus=16, tensor_parallel=4, data_parallel=2, max_model_len=8192)
    )
    assert two.replicas == 2 and two.max_concurrency_total == 4 * two.max_concurrency
    assert "--data-parallel-size 2" in two.vllm_command and "# 2 replicas" in two.vllm_command
    dense = plan(MODELS["llama-3.1-8b"], H200, num_gpus=4, data_parallel=2, max_model_len=8192)
    assert dense.replicas == 2 and "--data-parallel-size 4" in dense.vllm_command


def test_expert_placement_matches_vllms_own_rules():
    """vLLM's `FusedMoEParallelConfig.make`: without EP the MoE layers' tensor parallelism is tp x dp (each expert
    split over all GPUs: `expert_bytes_fraction` 1 / (tp x dp)); with EP it is 1 and the expert parallelism tp x
    dp. vLLM's `determine_expert_map`: the most loaded GPU's experts under EP (`expert_bytes_fraction` x E) are the
    largest local expert count of any rank (Kimi-K2's 384 over 8, Qwen3's 128 over 12 and 3, gpt-oss's 128 over
    48, Mixtral's 8 over 3, DeepSeek-V3's 256 over 8)."""
    cases = [[8, 384], [12, 128], [3, 128], [48, 128], [3, 8], [8, 256]]
    layouts = [[2, 2, False], [4, 2, True], [1, 8, True], [8, 1, True], [8, 1, False]]
    reference = run_vllm_script(SCRIPT, {"cases": cases, "layouts": layouts})
    for (tp, dp, ep), (moe_tp, moe_ep) in zip(layouts, reference["moe"], strict=True):
        assert (moe_tp, moe_ep) == ((1, tp * dp) if ep else (tp * dp, 1))
        assert expert_bytes_fraction(QWEN, tp, dp, ep) == pytest.approx(1 / (moe_tp * moe_ep))
    for (ep, experts), counts in zip(cases, reference["local_experts"], strict=True):
        assert sum(counts) == experts
        model = replace(QWEN, num_experts=experts, num_experts_per_tok=min(8, experts))
        assert round(expert_bytes_fraction(model, ep, 1, True) * experts) == max(counts)
        assert round(expert_bytes_fraction(model, 1, ep, True) * experts) == max(counts)
    assert [max(c) for c in reference["local_experts"]] == [48, 11, 43, 3, 3, 32]


def test_a_dp_rank_step_prices_its_batch_and_all_ranks_experts():
    """Qwen3-235B-A22B FP8 on 2 x (tp 2) DP ranks: one rank's decode step of b tokens, by hand. Weights per GPU:
    the dense part / 2 and the experts / 4 (`weight_split_per_gpu`); the experts read are those the 2 x b tokens
    of both ranks route to, 1 - (1 - 8 / 128)^(2b); the DP collectives add 94 layers x 2 x (2 - 1) x 4,096 x 2
    bytes per token over the link and 2 x 94 latencies beside the tp all-reduces."""
    step = from_specs(
        QWEN, H200, 2, "fp8", data_parallel=2, bandwidth_efficiency=1.0, flops_efficiency=1.0, overhead_s=0.0
    )
    alone = from_specs(QWEN, H200, 2, "fp8", bandwidth_efficiency=1.0, flops_efficiency=1.0, overhead_s=0.0)
    dense, experts = weight_split_per_gpu(QWEN, "fp8", 2, 1, 2, False)
    assert step.weight_bytes == pytest.approx(dense, rel=1e-9)
    assert step.expert_weight_bytes == pytest.approx(experts, rel=1e-9)
    assert step.expert_token_ranks == 2 and alone.expert_token_ranks == 1
    assert step.experts_touched(3) == pytest.approx(1 - (1 - 8 / 128) ** 6)
    assert step.comm_bytes_per_token - alone.comm_bytes_per_token == pytest.approx(94 * 2 * 1 * 4096 * 2)
    assert step.comm_latency_s - alone.comm_latency_s == pytest.approx(2 * 94 * ALL_REDUCE_LATENCY_S)
    assert step.flops_per_token == alone.flops_per_token  # per own token: D x n tokens over tp x D GPUs
    b, ctx = 4, 2000
    memory = (dense + experts * (1 - (1 - 8 / 128) ** (2 * b)) + step.kv_bytes_per_token * (b * ctx + b)) / (
        H200.memory_bandwidth
    )
    compute = (step.flops_per_token * b + step.attention_flops_per_pair * b * (ctx + 1)) / step.peak_flops
    comm = step.comm_latency_s + step.comm_bytes_per_token * b / step.interconnect_bandwidth
    assert step.decode_step_seconds(b, ctx) == pytest.approx(max(memory, compute) + comm, rel=1e-9)


def test_deployment_with_data_parallel_attention_runs_ranks_as_schedulers():
    """A Deployment of D DP ranks: D x tp GPUs per replica, D schedulers with their own KV cache (the plan's per
    DP rank), the closed loop's clients split over them, the throughput D times one rank's; its JSON echoes
    the vLLM flags."""
    deployment = Deployment(QWEN, H200, tp=2, data_parallel=2, weight_dtype="fp8", max_num_seqs=64)
    assert deployment.num_gpus == 4 and deployment.ranks == 2
    memory = replica_memory(deployment.resolve(2100))
    capacity = plan(
        QWEN,
        H200,
        tensor_parallel=2,
        data_parallel=2,
        weight_dtype="fp8",
        max_model_len=2100,
        max_num_seqs=64,
    )
    assert memory.kv_tokens == capacity.kv_tokens and capacity.num_gpus == 4
    flags = deployment.flags()
    assert flags["vllm_parallel_flags"] == "--tensor-parallel-size 2 --data-parallel-size 2"
    assert flags["num_gpus"] == 4 and flags["data_parallel"] == 2
    load = Load(None, 2000, 64, concurrency=8)
    both = predict(deployment, load, settings=SETTINGS)
    assert both.kv_tokens == memory.kv_tokens
    one_rank = replica_steady_state(
        deployment,
        load.per_replica(2),
        deployment.step_model(resolved=deployment.resolve(load.max_len)),
        memory.kv_tokens,
        SETTINGS,
    )
    assert both.metrics["mean_tpot_s"] == pytest.approx(one_rank.metrics["mean_tpot_s"])
    assert both.metrics["throughput_tokens_per_s"] == pytest.approx(
        2 * one_rank.metrics["throughput_tokens_per_s"]
    )
    with pytest.raises(InvalidArgumentError, match="mixture-of-experts"):
        Deployment("llama-3.1-8b", H200, expert_parallel=True)


def test_cli_flags_reach_plan_and_predict(capsys):
    assert (
        capacity_main(
            [
                "--model",
                "qwen3-235b-a22b",
                "--gpu",
                "h200-141gb",
                "--tp",
                "4",
                "--data-parallel-size",
                "2",
                "--enable-expert-parallel",
                "--max-model-len",
                "8192",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["data_parallel"] == 2 and out["expert_parallel"] is True and out["num_gpus"] == 8
    assert (
        "--data-parallel-size 2" in out["vllm_command"] and "--enable-expert-parallel" in out["vllm_command"]
    )
    args = [
        "--model",
        "qwen3-235b-a22b",
        "--gpu",
        "h200-141gb",
        "--tp",
        "2",
        "--weight-dtype",
        "fp8",
        "--prompt-len",
        "500",
        "--output-len",
        "20",
        "--data-parallel-size",
        "2",
        "--enable-expert-parallel",
    ]
    assert predict_main([*args, "--concurrency", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["deployment"]["vllm_parallel_flags"] == (
        "--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel"
    )
    assert predict_main([*args, "--concurrency", "2", "--disagg"]) == 2
    assert (
        predict_main(
            [
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "h200-141gb",
                "--prompt-len",
                "500",
                "--output-len",
                "20",
                "--enable-expert-parallel",
                "--concurrency",
                "2",
            ]
        )
        == 2
    )


def test_the_slo_search_tries_data_parallel_ranks_with_expert_parallel(capsys):
    """`slo --data-parallel-size 1 2 --enable-expert-parallel`: candidates of 1 and 2 DP ranks per replica, each
    row's num_gpus counting the ranks, its memory the plan's per DP rank, its vLLM flags printed; a row turns
    back into the same Deployment (`config_deployment`)."""
    cands = SloCandidates(
        gpus=("h200-141gb",),
        max_gpus=4,
        tensor_parallel=(2,),
        pipeline_parallel=(1,),
        max_num_seqs=(64,),
        kv_dtypes=("auto",),
        weight_dtypes=("fp8",),
        data_parallel=(1, 2),
        expert_parallel=True,
    )
    found = list(enumerate_candidates(QWEN, cands))
    assert sorted((c.data_parallel, c.replicas, c.num_gpus) for c in found) == [
        (1, 1, 2),
        (1, 2, 4),
        (2, 1, 4),
    ]
    assert all(c.expert_parallel for c in found)
    with pytest.raises(InvalidArgumentError, match="mixture-of-experts"):
        list(enumerate_candidates(MODELS["llama-3.1-8b"], cands))
    argv = [
        "slo",
        "--model",
        "qwen3-235b-a22b",
        "--rate",
        "1",
        "--prompt-len",
        "1000",
        "--output-len",
        "50",
        "--ttft-p95",
        "0.001",
        "--gpus",
        "h200-141gb",
        "--max-gpus",
        "4",
        "--tp",
        "2",
        "--pp",
        "1",
        "--max-num-seqs",
        "64",
        "--kv-dtypes",
        "auto",
        "--weight-dtypes",
        "fp8",
        "--data-parallel-size",
        "2",
        "--enable-expert-parallel",
    ]
    assert slo_main(argv) == 2  # a 1 ms TTFT is out of reach: every row still printed
    rows = json.loads(capsys.readouterr().out)["configs"]
    assert [(r["num_gpus"], r["data_parallel"], r["replicas"]) for r in rows] == [(4, 2, 1)]
    row = rows[0]
    assert (
        row["vllm_parallel_flags"]
        == "--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel"
    )
    capacity = plan(
        QWEN,
        H200,
        tensor_parallel=2,
        data_parallel=2,
        expert_parallel=True,
        weight_dtype="fp8",
        max_model_len=1050,
        max_num_seqs=64,
    )
    assert row["kv_tokens"] == capacity.kv_tokens
    config = SloConfig(**row)
    deployment = config_deployment(QWEN, config, cands)
    assert (deployment.data_parallel, deployment.expert_parallel, deployment.num_gpus) == (2, True, 4)


# The cross-model profile as docs/slo.md 2c prints it (bench.slo_published's fit), with its fixed terms.
CROSS_MODEL_FIT = {
    "flops_efficiency": 0.353,
    "layer_overhead_s": 71.3e-6,
    "expert_flops_efficiency": 0.129,
    "request_overhead_s": 0.0286,
} | pv.FIXED


def test_attention_dp_rows_price_as_ranks_and_the_docs_errors_hold():
    """The sample's 19 Qwen3-235B-A22B rows served with attention DP (never fitted): C clients over D ranks as
    vLLM's coordinator balances them (5 over 4: one rank of 2, three of 1), each rank with one DP rank's KV
    cache; their RMS relative errors at the cross-model profile are docs/slo.md 2d's (TTFT 0.526, TPOT 0.590,
    together 0.559; as one TP group of tp x D GPUs 0.712 / 0.597 / 0.657)."""
    row = next(r for r in pvr.ATTENTION_DP_ROWS if (r.tp, r.dp, r.concurrency) == (1, 4, 5))
    assert [(rank.concurrency, clients) for rank, clients in pvr.rank_rows(row)] == [(2, 2), (1, 3)]
    assert (
        pvr.kv_tokens(row)
        == plan(
            QWEN,
            H200,
            tensor_parallel=1,
            data_parallel=4,
            num_gpus=4,
            weight_dtype="fp8",
            max_model_len=row.isl + row.osl,
            max_num_batched_tokens=8192,
        ).kv_tokens
    )
    sixth = (
        pv.SIXTH_STAGE_BENCHMARK
    )  # benchmarks of 20 rounds, every expert routed, as docs/slo.md 2d states these
    rows = pv.attention_dp_comparison(CROSS_MODEL_FIT | pv.ROUTED_EXPERTS, benchmark=sixth)
    assert len(rows) == 19 and all(r["set"] == "attention dp" for r in rows)
    ttft, tpot = [r["ttft_error"] for r in rows], [r["tpot_error"] for r in rows]
    assert rms(ttft) == pytest.approx(0.526, abs=0.005) and rms(tpot) == pytest.approx(0.590, abs=0.005)
    assert rms(ttft + tpot) == pytest.approx(0.559, abs=0.005)
    as_tp = [replace(r, tp=r.tp * r.dp, dp=1) for r in pvr.ATTENTION_DP_ROWS]
    # as one TP group they would run vLLM 0.12's padded MoE kernel (the eighth stage of docs/slo.md 2c); 2d's figure
    # was computed, as every stage before it, with the experts routed
    naive = pv.comparison(CROSS_MODEL_FIT | pv.ROUTED_EXPERTS, as_tp, benchmark=sixth)
    assert rms([r["ttft_error"] for r in naive] + [r["tpot_error"] for r in naive]) == pytest.approx(
        0.657, abs=0.005
    )


def test_attention_dp_rows_at_the_eighth_stage():
    """The same 19 rows with vLLM 0.12's padded MoE kernel priced on each DP rank (every rank's tokens gathered,
    the experts split tp x D ways; docs/slo.md 2d), at the adopted profile and 10 rounds: TPOT 0.531 -> 0.277,
    every row still low; as one TP group 0.646 -> 0.529 together."""
    assert all(pvr.expert_block_rows(r) == 128 for r in pvr.ATTENTION_DP_ROWS)
    routed = pv.attention_dp_comparison(VLLM_CROSS_MODEL_PROFILE | pv.ROUTED_EXPERTS)
    padded = pv.attention_dp_comparison(VLLM_CROSS_MODEL_PROFILE)
    for rows, expected in ((routed, (0.587, 0.531, 0.560)), (padded, (0.557, 0.277, 0.440))):
        ttft, tpot = [r["ttft_error"] for r in rows], [r["tpot_error"] for r in rows]
        assert (rms(ttft), rms(tpot), rms(ttft + tpot)) == pytest.approx(expected, abs=0.001)
    assert all(-0.42 < r["tpot_error"] < -0.18 for r in padded)
    # the saved run of bench.slo_published prints the same (its attention_dp)
    saved = json.loads((ROOT / "bench" / "results" / "slo-published.json").read_text())["attention_dp"]
    for name, rows in (("priced", padded), ("routed", routed)):
        errors = saved[name]["qwen3-235b-a22b"]
        assert errors["rows"] == 19 and errors["tpot_rms_rel_err"] == pytest.approx(
            rms([r["tpot_error"] for r in rows]), rel=1e-6
        )
    as_tp = [replace(r, tp=r.tp * r.dp, dp=1) for r in pvr.ATTENTION_DP_ROWS]
    together = pv.comparison(VLLM_CROSS_MODEL_PROFILE, as_tp)
    errors = [r["ttft_error"] for r in together] + [r["tpot_error"] for r in together]
    assert rms(errors) == pytest.approx(0.529, abs=0.001)


def rms(values) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


def test_the_plans_decode_roofline_reads_the_experts_all_ranks_touch():
    """DeepSeek-V3 at tp 1 x DP 8 with EP: the decode roofline of one rank's batch b reads its dense weights and
    the share 1 - (1 - 8 / 256)^(8 b) of its 32 experts (every rank's tokens meet them), plus b requests' KV."""
    capacity = plan(DSV3, H200, tensor_parallel=1, data_parallel=8, expert_parallel=True, max_model_len=8192)
    b = capacity.decode_batch
    dense, experts = weight_split_per_gpu(DSV3, "auto", 1, 1, 8, True)
    read = dense + experts * (1 - (1 - 8 / 256) ** (8 * b)) + b * 8192 * 70_272
    memory_s = read / H200.memory_bandwidth
    compute_s = 2 * DSV3.num_params_active * b / H200.peak_bf16_flops
    assert capacity.decode_step_s == pytest.approx(max(memory_s, compute_s), rel=1e-9)
    assert capacity.decode_tokens_per_s == pytest.approx(8 * b / capacity.decode_step_s)
