"""Issue 40's pieces that do not depend on the fitted values: the sample's model presets against their model
cards, the MoE and per-layer terms of the step-time model worked by hand, the rows of the cross-model sample
and their per-model errors, and `--config PATH [--num-params N]` on predict / max-rate / slo."""

import json

import numpy as np
import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS, MODELS_JSON, estimate_num_params
from core.planning.commands.predict_cli import max_rate_main, predict_main
from core.planning.cost.fits import published_vllm as pv
from core.planning.cost.fits import published_vllm_rows as pvr
from core.planning.cost.step_time import expert_weight_share, from_specs
from core.planning.memory.kv_accounting import kv_bytes_per_token, weight_bytes_per_gpu

CARDS = {  # slug: (layers, KV heads, head_dim, total, active parameters on the model card)
    "qwen3-32b": (64, 8, 128, 32.8e9, 32.8e9),
    "qwen3-235b-a22b": (94, 4, 128, 235e9, 22e9),
}


@pytest.mark.parametrize("slug", sorted(CARDS))
def test_sample_presets_match_their_model_cards(slug):
    layers, kv_heads, head_dim, total, active = CARDS[slug]
    model = MODELS[slug]
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (layers, kv_heads, head_dim)
    # the parameters the shapes imply agree with the card's rounded figures
    estimate = estimate_num_params(json.loads(MODELS_JSON.read_text())[slug]["config"])
    assert estimate["total"] == pytest.approx(total, rel=0.01)
    assert estimate["active"] == pytest.approx(active, rel=0.01)
    # bf16 K and V of every layer: 2 x layers x KV heads x head_dim x 2 bytes
    assert kv_bytes_per_token(model, "auto") == 2 * layers * kv_heads * head_dim * 2


def test_moe_step_reads_only_the_experts_its_tokens_route_to():
    model, gpu = MODELS["gpt-oss-120b"], GPUS["h100-80gb"]
    step = from_specs(model, gpu, 2, "auto", bandwidth_efficiency=1.0, overhead_s=0.0)
    per_gpu = weight_bytes_per_gpu(model, "auto", 2)
    assert step.weight_bytes + step.expert_weight_bytes == pytest.approx(per_gpu, rel=1e-12)
    # MXFP4 experts: 114.7e9 parameters x 4.25 bits of the ~65 GB checkpoint (the rest bf16)
    assert expert_weight_share(model) == pytest.approx(114.70e9 * 4.25 / 8 / 65.2e9, rel=0.01)
    assert (step.num_experts, step.experts_per_token) == (128, 4)
    # one token reads 4 of 128 experts; n tokens 1 - (124/128)^n of them (uniform routing)
    assert step.experts_touched(1) == pytest.approx(4 / 128)
    assert step.experts_touched(np.array([1.0, 64.0]))[1] == pytest.approx(1 - (124 / 128) ** 64)
    kv = step.kv_bytes_per_token
    by_hand = (step.weight_bytes + step.expert_weight_bytes * 4 / 128 + kv * (100 + 1)) / gpu.memory_bandwidth
    assert step.breakdown(1, 100, 101).memory_s == pytest.approx(by_hand, rel=1e-12)
    assert step.step_seconds(1, 100, 101) == pytest.approx(float(step.step_time(1, 100, 101)), rel=1e-12)
    # a dense model reads all its weights every step, as before
    dense = from_specs(MODELS["llama-3.1-70b"], gpu, 2, "fp8")
    assert dense.expert_weight_bytes == 0 and dense.weight_bytes == weight_bytes_per_gpu(
        MODELS["llama-3.1-70b"], "fp8", 2
    )
    assert expert_weight_share(MODELS["qwen3-235b-a22b"], "fp8") == pytest.approx(227.1 / 235.0, rel=1e-3)


def test_expert_gemms_priced_at_their_own_efficiency():
    model, gpu = MODELS["qwen3-235b-a22b"], GPUS["h200-141gb"]
    step = from_specs(model, gpu, 4, "fp8", flops_efficiency=0.5, expert_flops_efficiency=0.1)
    # routed experts of 8 of 128: 227.1e9 x 8 / 128 parameters, 2 FLOPs each, over 4 GPUs
    assert step.expert_flops_per_token == pytest.approx(2 * 227.096e9 * 8 / 128 / 4, rel=1e-4)
    n = 4096.0
    dense = (step.flops_per_token - step.expert_flops_per_token) * n / (gpu.peak_fp8_flops * 0.5)
    experts = step.expert_flops_per_token * n / (gpu.peak_fp8_flops * 0.1)
    assert step.breakdown(n, 0, 0).compute_s == pytest.approx(dense + experts, rel=1e-12)
    assert step.step_seconds(n, 0, 0) == pytest.approx(float(step.step_time(n, 0, 0)), rel=1e-12)
    with pytest.raises(InvalidArgumentError, match="expert_flops_efficiency"):
        from_specs(model, gpu, 4, "fp8", expert_flops_efficiency=1.5)


def test_expert_weights_read_at_their_own_bandwidth_efficiency():
    """The routed experts' bytes a step reads (1 - (1 - k / E)^n of them) at expert_bandwidth_efficiency of the
    datasheet bandwidth, the dense weights and K/V at bandwidth_efficiency; None leaves the experts at the dense
    efficiency (the model before this term)."""
    model, gpu = MODELS["qwen3-235b-a22b"], GPUS["h200-141gb"]
    kw = {"bandwidth_efficiency": 0.9, "overhead_s": 0.0}
    step = from_specs(model, gpu, 2, "fp8", expert_bandwidth_efficiency=0.6, **kw)
    plain = from_specs(model, gpu, 2, "fp8", **kw)
    n, kv = 16.0, 16 * 3000.0
    touched = 1 - (1 - 8 / 128) ** n
    dense = (step.weight_bytes + step.kv_bytes_per_token * (kv + n)) / (gpu.memory_bandwidth * 0.9)
    experts = step.expert_weight_bytes * touched / (gpu.memory_bandwidth * 0.6)
    assert step.breakdown(n, kv, 0).memory_s == pytest.approx(dense + experts, rel=1e-12)
    assert step.step_seconds(n, kv, 0) == pytest.approx(float(step.step_time(n, kv, 0)), rel=1e-12)
    assert plain.breakdown(n, kv, 0).memory_s == pytest.approx(
        dense + step.expert_weight_bytes * touched / (gpu.memory_bandwidth * 0.9), rel=1e-12
    )
    # a dense model has no expert bytes: the term changes nothing
    llama = MODELS["llama-3.1-70b"]
    assert from_specs(llama, gpu, 2, "fp8", expert_bandwidth_efficiency=0.5).step_seconds(n, kv, 0) == (
        from_specs(llama, gpu, 2, "fp8").step_seconds(n, kv, 0)
    )
    with pytest.raises(InvalidArgumentError, match="expert_bandwidth_efficiency"):
        from_specs(model, gpu, 2, "fp8", expert_bandwidth_efficiency=0.0)


def test_fp8_experts_read_at_their_own_bandwidth_efficiency():
    """fp8_expert_bandwidth_efficiency (and fp8_expert_flops_efficiency) replace expert_bandwidth_efficiency
    (expert_flops_efficiency) for experts stored in FP8 (MiniMax-M2.5,
    Qwen3-235B-A22B at fp8), not for gpt-oss-120b's MXFP4 experts nor a dense model: the FP8 experts' time is their
    bytes read at that share of the bandwidth, by hand."""
    gpu, n, kv = GPUS["h200-141gb"], 16.0, 16 * 3000.0
    kw = {"bandwidth_efficiency": 1.0, "overhead_s": 0.0, "expert_bandwidth_efficiency": 0.7}
    for slug, dtype, experts, per_tok in (
        ("minimax-m2.5", "fp8", 256, 8),
        ("qwen3-235b-a22b", "fp8", 128, 8),
    ):
        step = from_specs(MODELS[slug], gpu, 4, dtype, fp8_expert_bandwidth_efficiency=0.4, **kw)
        assert step.expert_bandwidth_efficiency == 0.4
        # the FLOP/s share likewise: the experts' FLOPs of a 64-token step at 0.05 of the FP8 peak, by hand
        flops = from_specs(
            MODELS[slug], gpu, 4, dtype, fp8_expert_flops_efficiency=0.05, flops_efficiency=0.5
        )
        assert flops.expert_flops_efficiency == 0.05
        dense_flops = (flops.flops_per_token - flops.expert_flops_per_token) * 64 / (flops.peak_flops * 0.5)
        expert_flops = flops.expert_flops_per_token * 64 / (flops.peak_flops * 0.05)
        assert flops.breakdown(64, 0, 0).compute_s == pytest.approx(dense_flops + expert_flops, rel=1e-12)
        touched = 1 - (1 - per_tok / experts) ** n
        dense = (step.weight_bytes + step.kv_bytes_per_token * (kv + n)) / gpu.memory_bandwidth
        by_hand = dense + step.expert_weight_bytes * touched / (gpu.memory_bandwidth * 0.4)
        assert step.breakdown(n, kv, 0).memory_s == pytest.approx(by_hand, rel=1e-12)
    for slug, dtype in (("gpt-oss-120b", "auto"), ("qwen3-235b-a22b", "bf16"), ("llama-3.1-70b", "fp8")):
        with_term = from_specs(MODELS[slug], gpu, 4, dtype, fp8_expert_bandwidth_efficiency=0.4, **kw)
        assert with_term.step_seconds(n, kv, 0) == from_specs(MODELS[slug], gpu, 4, dtype, **kw).step_seconds(
            n, kv, 0
        )
    with pytest.raises(InvalidArgumentError, match="fp8_expert_bandwidth_efficiency"):
        from_specs(MODELS["minimax-m2.5"], gpu, 4, "fp8", fp8_expert_bandwidth_efficiency=1.5)
    with pytest.raises(InvalidArgumentError, match="fp8_expert_flops_efficiency"):
        from_specs(MODELS["minimax-m2.5"], gpu, 4, "fp8", fp8_expert_flops_efficiency=0.0)
    gpt = from_specs(MODELS["gpt-oss-120b"], gpu, 4, "auto", fp8_expert_flops_efficiency=0.05)
    assert gpt.expert_flops_efficiency is None


def test_layer_overhead_counts_every_layer():
    gpu = GPUS["h100-80gb"]
    for slug, layers in (("llama-3.1-8b", 32), ("llama-3.1-70b", 80)):
        step = from_specs(MODELS[slug], gpu, 1, "fp8", overhead_s=0.001, layer_overhead_s=5e-5)
        assert step.overhead_s == pytest.approx(0.001 + layers * 5e-5)
    with pytest.raises(InvalidArgumentError, match="layer_overhead_s"):
        from_specs(MODELS["llama-3.1-8b"], gpu, 1, layer_overhead_s=-1.0)


def test_sample_rows_and_their_split():
    models = {r.model for r in pvr.ROWS}
    assert models == set(pvr.TRAINING_MODELS) | set(pvr.HELD_OUT_MODELS)
    assert (
        len(pvr.ROWS) + len(pvr.ATTENTION_DP_ROWS) + len(pvr.MINIMAX_ATTENTION_DP_ROWS)
        == 105 + 306 + 114 + 45
    )
    assert (
        all(r.model == "qwen3-235b-a22b" for r in pvr.ATTENTION_DP_ROWS) and len(pvr.ATTENTION_DP_ROWS) == 19
    )
    assert len(pvr.MINIMAX_ATTENTION_DP_ROWS) == 15 and {
        (r.gpu, r.tp, r.dp, r.ep) for r in pvr.MINIMAX_ATTENTION_DP_ROWS
    } == {("h100-80gb", 4, 4, 16)}
    minimax = [r for r in pvr.ROWS if r.model == "minimax-m2.5"]  # the file's 99 others, FP8, held out
    assert (
        len(minimax) == 99
        and {r.weight_dtype for r in minimax} == {"fp8"}
        and "minimax-m2.5" in pvr.MOE_MODELS
    )
    assert {(r.gpu, r.tp, r.ep) for r in minimax} == {
        ("h100-80gb", 4, 4),
        ("h200-141gb", 4, 1),
        ("h200-141gb", 8, 1),
    }
    first = minimax[0]  # the file's first MiniMax-M2.5 vLLM agg row (H200, vLLM 0.16.0, config 606)
    assert (first.tp, first.isl, first.osl, first.concurrency, first.ttft_s, first.tpot_s) == (
        4,
        8192,
        1024,
        8,
        pytest.approx(0.41589451),
        pytest.approx(0.015605238),
    )
    assert {pvr.row_set(r) for r in pvr.ROWS if r.model in pvr.HELD_OUT_MODELS} <= {"held out", "kv-limited"}
    assert any(m in pvr.MOE_MODELS for m in pvr.HELD_OUT_MODELS)
    # MiniMax-M2.5 is held out (97 rows, 2 KV-limited); the fourth stage (tried, not adopted) trains on it and
    # holds out the other two, and its training rows are the adopted split's plus MiniMax-M2.5's
    fourth = pvr.FOURTH_STAGE_TRAINING_MODELS
    assert [pvr.row_set(r) for r in minimax].count("held out") == 97
    assert [pvr.row_set(r, fourth) for r in minimax].count("training") == 97
    assert {pvr.row_set(r, fourth) for r in pvr.ROWS if r.model in ("llama-3.1-8b", "qwen3-235b-a22b")} <= {
        "held out",
        "kv-limited",
    }
    assert sorted(r.id for r in pvr.training_rows(fourth)) == sorted(
        [r.id for r in pvr.training_rows()] + [r.id for r in minimax if pvr.row_set(r) == "held out"]
    )
    gpt = [r for r in pvr.ROWS if r.model == "gpt-oss-120b"]
    assert len(gpt) == 144 and {r.weight_dtype for r in gpt} == {"auto"}
    first = next(r for r in pvr.ROWS if r.model == "llama-3.1-8b")  # the file's first 8B row
    assert (first.tp, first.isl, first.osl, first.concurrency, first.ttft_s, first.tpot_s) == (
        1,
        1000,
        100,
        112,
        pytest.approx(0.07191),
        pytest.approx(0.01125),
    )
    # Kimi-K2.5 int4 (MLA attention, int4 experts): the file's 45 vLLM agg rows on H200, TP 8, no attention DP,
    # every one held out (none KV-limited: 64 x (8,192 + 512) tokens against the planner's 859,360)
    kimi = [r for r in pvr.ROWS if r.model == "kimi-k2.5"]
    assert len(kimi) == 45 and "kimi-k2.5" in pvr.MOE_MODELS and "kimi-k2.5" in pvr.HELD_OUT_MODELS
    assert {(r.gpu, r.weight_dtype, r.tp, r.dp, r.ep) for r in kimi} == {("h200-141gb", "int4", 8, 1, 1)}
    assert [pvr.row_set(r) for r in kimi].count("held out") == 45 and pvr.kv_tokens(kimi[0]) == 859_360
    assert [pvr.row_set(r, pvr.FOURTH_STAGE_TRAINING_MODELS) for r in kimi].count("held out") == 45
    first = kimi[0]  # the file's first Kimi-K2.5 vLLM agg row on H200 (vLLM 0.16.0, measured 2026-03-02)
    assert (first.isl, first.osl, first.concurrency, first.ttft_s, first.tpot_s) == (
        8192,
        1024,
        4,
        pytest.approx(0.5044941308558919),
        pytest.approx(0.011731443304604047),
    )


def test_errors_by_model_by_hand():
    a = pvr.VllmRow("a", "llama-3.1-8b", "h200-141gb", 1, 10, 10, 1, 1.0, 1.0)
    b = pvr.VllmRow("b", "llama-3.1-8b", "h100-80gb", 1, 10, 10, 1, 1.0, 1.0)
    rows = [
        {"row": a, "ttft_error": 0.3, "tpot_error": -0.4, "set": "held out"},
        {"row": b, "ttft_error": 0.0, "tpot_error": 0.0, "set": "held out"},
        {"row": a, "ttft_error": 9.0, "tpot_error": 9.0, "set": "training"},
    ]
    out = pv.errors_by_model(rows, "held out")["llama-3.1-8b"]
    assert out["rows"] == 2
    assert out["ttft_rms_rel_err"] == pytest.approx(np.sqrt(0.09 / 2))
    assert out["tpot_rms_rel_err"] == pytest.approx(np.sqrt(0.16 / 2))
    assert out["rms_rel_err"] == pytest.approx(np.sqrt(0.25 / 4))
    assert out["by_gpu"]["h200-141gb"]["rms_rel_err"] == pytest.approx(np.sqrt(0.25 / 2))


LOAD = ["--gpu", "h100-80gb", "--tp", "2", "--prompt-len", "256", "--output-len", "16"]


def _answer(main, argv, capsys):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "main, load", [(predict_main, ["--concurrency", "4"]), (max_rate_main, ["--ttft-p95", "1"])]
)
def test_config_answers_as_the_preset(tmp_path, capsys, main, load):
    """A config.json with the preset's fields and its parameter count answers exactly as the preset, same keys."""
    raw = json.loads(MODELS_JSON.read_text())["qwen3-32b"]
    path = tmp_path / "my-qwen.json"
    path.write_text(json.dumps(raw["config"]))
    preset = _answer(main, ["--model", "qwen3-32b", *LOAD, *load], capsys)
    custom = _answer(
        main, ["--config", str(path), "--num-params", str(raw["num_params"]), *LOAD, *load], capsys
    )
    assert custom.keys() == preset.keys()
    name = custom["deployment"]["model"] if "deployment" in custom else None
    if name is not None:
        assert name == "my-qwen" and preset["deployment"]["model"] == "Qwen3-32B"
        custom["deployment"]["model"] = preset["deployment"]["model"]
    if "vllm_bench_command" in custom:  # max-rate's command names the model as vLLM would serve it
        mine, theirs = custom["vllm_bench_command"], preset["vllm_bench_command"]
        assert "--model my-qwen " in mine and "--model Qwen/Qwen3-32B " in theirs
        custom["vllm_bench_command"] = mine.replace("--model my-qwen ", "--model Qwen/Qwen3-32B ")
    assert custom == preset


def test_config_flag_errors(tmp_path, capsys):
    assert predict_main(["--model", "qwen3-32b", "--num-params", "1e9", *LOAD, "--concurrency", "1"]) == 2
    assert "--num-params goes with --config" in capsys.readouterr().err
    assert predict_main(["--config", str(tmp_path / "none.json"), *LOAD, "--concurrency", "1"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_sliding_window_layers_read_only_their_window():
    """gpt-oss-120b: 18 of its 36 layers slide over 128 tokens, so a decode at a 9,000-token context reads 9,000
    tokens in 18 layers and 128 in the other 18. Mistral-7B slides every layer over 4,096: shorter contexts read
    in full, longer ones the window. A dense model reads every layer."""
    model = MODELS["gpt-oss-120b"]
    assert model.layer_kinds.count("full_attention") == 18 and model.sliding_window == 128
    step = from_specs(model, GPUS["h200-141gb"], 1, "auto", bandwidth_efficiency=1.0)
    assert step.kv_bytes_per_token == 2 * 36 * 8 * 64 * 2  # written to every layer
    assert (step.sliding_layer_fraction, step.sliding_window) == (0.5, 128)
    assert step.attention_flops_per_pair == 4 * 36 * 64 * 64
    ctx = 9000.0
    dense_bytes = step.weight_bytes + step.expert_weight_bytes * 4 / 128
    by_hand = (dense_bytes + step.kv_bytes_per_token * (ctx / 2 + 128 / 2 + 1)) / 4.8e12
    assert step.breakdown(1, ctx, ctx + 1).memory_s == pytest.approx(by_hand, rel=1e-12)
    assert step.step_seconds(3, 3 * ctx, 3 * ctx) == pytest.approx(float(step.step_time(3, 3 * ctx, 3 * ctx)))
    mistral = from_specs(MODELS["mistral-7b"], GPUS["h200-141gb"])
    assert (mistral.sliding_layer_fraction, mistral.sliding_window) == (1.0, 4096)
    assert (
        mistral.windowed(4 * 2000.0, 4) == 4 * 2000.0
    )  # four sequences at 2,000 tokens: all within the window
    assert mistral.windowed(4 * 8000.0, 4) == 4 * 4096.0  # at 8,000: the window each
    assert from_specs(MODELS["llama-3.1-8b"], GPUS["h200-141gb"]).sliding_layer_fraction == 0


def test_slo_takes_a_config_too(tmp_path, capsys):
    from core.planning.commands.slo_cli import main as slo_main

    raw = json.loads(MODELS_JSON.read_text())["llama-3.1-8b"]
    path = tmp_path / "eight.json"
    path.write_text(json.dumps(raw["config"]))
    common = [
        "--rate",
        "1",
        "--prompt-len",
        "256",
        "--output-len",
        "16",
        "--ttft-p95",
        "2",
        "--gpus",
        "h100-80gb",
        "--max-gpus",
        "1",
        "--tp",
        "1",
        "--max-num-seqs",
        "32",
        "--kv-dtypes",
        "auto",
        "--weight-dtypes",
        "auto",
    ]
    preset = _answer(slo_main, ["--model", "llama-3.1-8b", *common], capsys)
    custom = _answer(
        slo_main, ["--config", str(path), "--num-params", str(raw["num_params"]), *common], capsys
    )
    assert custom.keys() == preset.keys() and custom["configs"] and custom["best"] is not None
    strip = lambda rows: [{k: v for k, v in r.items() if k != "model"} for r in rows]  # noqa: E731
    assert strip(custom["configs"]) == strip(preset["configs"])


def test_pool_draws_shuffle_the_pool_again_each_time_it_is_used_up():
    draws = pv.pool_draws(25, 10, seed=3)
    assert len(draws) == 25 and draws == pv.pool_draws(25, 10, seed=3)
    assert sorted(draws[:10]) == sorted(draws[10:20]) == list(range(10))  # two whole orders, then a part
    assert draws[:10] != draws[10:20] and len(set(draws[20:])) == 5


def test_prefill_fraction_of_peak_by_hand():
    row = next(r for r in pvr.ROWS if r.model == "llama-3.1-8b")  # 1,000 / 100 tokens, 112 clients, TP 1, FP8
    rate = 112 / (0.07191 + 99 * 0.01125)  # requests a second: 94.46
    flops = rate * 1000 * 2 * MODELS["llama-3.1-8b"].num_params_active
    assert pv.prefill_fraction_of_peak(row) == pytest.approx(
        flops / GPUS["h200-141gb"].peak_fp8_flops, rel=1e-4
    )
    assert 0.75 < pv.prefill_fraction_of_peak(row) < 0.78


def test_a_prompt_pool_larger_than_the_run_is_unique_prompts_and_a_small_one_skips_prefills():
    row = pvr.VllmRow("pool", "llama-3.1-8b", "h200-141gb", 1, 2048, 8, 4, 1.0, 1.0)
    fitted = {"flops_efficiency": 0.3, "layer_overhead_s": 7e-5, "expert_flops_efficiency": 0.08} | pv.FIXED
    unique = pv.predict_row(row, fitted)
    # the prefix-caching KV core with prompts that never repeat prices what the counted policy does
    assert pv.predict_row(row, fitted, prompt_pool=10_000) == pytest.approx(unique, rel=1e-9)
    one = pv.predict_row(
        row, fitted, prompt_pool=1
    )  # every prompt the same: all but the first are cache hits
    assert one[0] < 0.5 * unique[0] and one[1] <= unique[1]


def test_request_term_adds_its_fixed_time_and_the_step_in_flight_by_hand():
    """One client, 16 prompt / 4 output tokens: each request is a 16-token prefill step and 3 decodes at contexts
    16, 17, 18. With the request term its TTFT gains the fixed time and, once a previous request has finished,
    the step in flight when it arrives (the previous request's last decode, at context 18); the first round's
    only request reaches an idle engine. The TPOT does not move; the replay re-prices it exactly."""
    row = pvr.VllmRow("tiny", "llama-3.1-70b", "h100-80gb", 8, 16, 4, 1, 1.0, 1.0)
    steps = {"flops_efficiency": 0.35, "layer_overhead_s": 7e-5} | pv.FIXED
    with_term = steps | {pv.REQUEST_TERM: 0.03}
    step = pv.step_model(row, with_term)
    assert step == pv.step_model(row, steps)  # not a step-time parameter
    prefill = step.step_seconds(16, 0, 16 * 17 / 2)
    last_decode = step.step_seconds(1, 18, 19)
    first_round, steady = prefill + 0.03, prefill + 0.03 + last_decode
    ttft = (first_round + (pv.BENCHMARK_ROUNDS - 1) * steady) / pv.BENCHMARK_ROUNDS
    without = pv.predict_row(row, steps)
    predicted = pv.predict_row(row, with_term)
    assert predicted == pytest.approx((ttft, without[1]), rel=1e-9)
    assert without[0] == pytest.approx(prefill, rel=1e-9)
    assert pv.RowReplay(row).latencies(with_term) == pytest.approx(predicted, rel=1e-9)


def _row(model, gpu, tp, isl, osl, clients):
    key = (model, gpu, tp, isl, osl, clients)
    return next(r for r in pvr.ROWS if (r.model, r.gpu, r.tp, r.isl, r.osl, r.concurrency) == key)


def test_qwen3_32b_rows_prefill_slower_at_low_load_than_their_high_load_throughput_allows():
    """docs/slo.md 2c: at 8 clients Qwen3-32B's TTFT grows 194 us per prompt token on 2 x H100 (0.17 of the bf16
    peak for 3.3e10 FLOP per token per GPU), while its 64-client 4,096 / 128 row needs >= 0.45 of that peak for its
    prompts alone; Llama-3.1-70B's rows agree with themselves (0.41 of FP8 peak at low load, <= 0.13 needed)."""
    short, long = (_row("qwen3-32b", "h100-80gb", 2, isl, 1024, 8) for isl in (1024, 4096))
    slope = (long.ttft_s - short.ttft_s) / (4096 - 1024)
    assert slope == pytest.approx((0.7489 - 0.1543) / 3072, rel=1e-3)
    per_token = 2 * MODELS["qwen3-32b"].num_params_active / 2  # FLOP per prompt token per GPU at TP 2
    bf16 = GPUS["h100-80gb"].peak_bf16_flops
    assert 0.16 < per_token / slope / bf16 < 0.18
    assert pv.prefill_fraction_of_peak(_row("qwen3-32b", "h100-80gb", 2, 4096, 128, 64)) > 0.44
    short, long = (_row("llama-3.1-70b", "h100-80gb", 2, isl, 1024, 4) for isl in (1024, 8192))
    slope = (long.ttft_s - short.ttft_s) / (8192 - 1024)
    fp8 = GPUS["h100-80gb"].peak_fp8_flops
    assert 0.40 < 2 * MODELS["llama-3.1-70b"].num_params_active / 2 / slope / fp8 < 0.42
    llama = [r for r in pvr.ROWS if (r.model, r.gpu, r.tp) == ("llama-3.1-70b", "h100-80gb", 2)]
    assert max(pv.prefill_fraction_of_peak(r) for r in llama if pvr.row_set(r) != "kv-limited") < 0.14


def test_held_out_gpu_rows_are_the_samples_b200_rows_and_no_fit_sees_them():
    """The B200 rows (a GPU no fit sees): the sample's vLLM agg rows of the four models in the formats their
    H100 / H200 rows have (the NVFP4 checkpoints' rows left out), MiniMax-M2.5's attention-DP rows apart."""
    rows = pvr.HELD_OUT_GPU_ROWS
    assert pvr.HELD_OUT_GPU == "b200" and {r.gpu for r in rows} == {"b200"}
    counts = {m: sum(r.model == m for r in rows) for m in dict.fromkeys(r.model for r in rows)}
    assert counts == {"llama-3.1-70b": 60, "gpt-oss-120b": 84, "minimax-m2.5": 172, "kimi-k2.5": 45}
    assert {(r.model, r.weight_dtype) for r in rows} == {
        ("llama-3.1-70b", "fp8"),
        ("gpt-oss-120b", "auto"),
        ("minimax-m2.5", "fp8"),
        ("kimi-k2.5", "int4"),
    }
    apart = pvr.HELD_OUT_GPU_ATTENTION_DP_ROWS
    assert len(apart) == 23 and {(r.model, r.tp, r.dp, r.ep) for r in apart} == {
        ("minimax-m2.5", 2, 2, 4),
        ("minimax-m2.5", 4, 4, 16),
    }
    # no fit's rows: neither the split's rows nor any training set
    assert not {r.id for r in rows} & {r.id for r in pvr.ROWS}
    assert all(r.gpu != "b200" for r in pvr.training_rows(pvr.FOURTH_STAGE_TRAINING_MODELS))
    first = next(
        r for r in rows if r.model == "llama-3.1-70b"
    )  # the file's first such row (measured 2025-10-29)
    assert (first.tp, first.isl, first.osl, first.concurrency) == (4, 1024, 1024, 8)
    assert (first.ttft_s, first.tpot_s) == (pytest.approx(0.1089045), pytest.approx(0.00817938))


def test_held_out_gpu_comparison_is_predict_row_on_those_rows():
    """What the bench reports for the held-out GPU is each row's own prediction (`predict_row`, the simulation the
    replay re-prices), in its own set; a KV-limited row stays "kv-limited"."""
    profile = dict(pv.FIXED) | {
        "flops_efficiency": 0.47,
        "kernel_overhead_s": 6.4e-6,
        "expert_flops_efficiency": 0.17,
        "expert_bandwidth_efficiency": 0.77,
        pv.REQUEST_TERM: 0.025,
    }
    llama = [r for r in pvr.HELD_OUT_GPU_ROWS if r.model == "llama-3.1-70b"]
    # 1 x B200 at 8,192 / 1,024 x 64: 64 x 8,704 KV tokens held on average, the planner's cache 306,576
    limited = next(r for r in llama if (r.tp, r.isl, r.concurrency) == (1, 8192, 64))
    assert pvr.kv_limited(limited) and pvr.kv_tokens(limited) == 306_576
    rows = [*llama[:2], limited]
    out = pv.held_out_gpu_comparison(profile, rows=rows)
    assert [r["set"] for r in out] == [pv.HELD_OUT_GPU_SET, pv.HELD_OUT_GPU_SET, "kv-limited"]
    for r, row in zip(out[:2], rows, strict=False):
        ttft, tpot = pv.predict_row(row, profile)
        assert (r["ttft_s"], r["tpot_s"]) == (pytest.approx(ttft, rel=1e-9), pytest.approx(tpot, rel=1e-9))
        assert r["ttft_error"] == pytest.approx(ttft / row.ttft_s - 1)
    errors = pv.errors_by_model(out, pv.HELD_OUT_GPU_SET)["llama-3.1-70b"]
    assert errors["rows"] == 2 and errors["by_gpu"].keys() == {"b200"}


def test_docs_held_out_gpu_table_is_the_saved_run():
    """docs/slo.md 2c's B200 table: each model's TTFT / TPOT (both) RMS under the three profiles, from the saved
    run of `python -m bench.slo_published`."""
    root = pvr.DATA_PATH.parents[5]
    saved = json.loads((root / "bench" / "results" / "slo-published.json").read_text())["held_out_gpu"]
    docs = (root / "docs" / "slo.md").read_text()
    section = docs[docs.index("**A GPU no fit sees: B200**") :]
    section = section[: section.index("All ")]

    def cell(e: dict) -> str:
        return f"{e['ttft_rms_rel_err']:.3f} / {e['tpot_rms_rel_err']:.3f} ({e['rms_rel_err']:.3f})"

    for model, fitted in saved["by_model"].items():
        row = next(line for line in section.splitlines() if line.startswith(f"| {MODELS[model].name} |"))
        assert f"| {fitted['rows']} |" in row, row
        stored, trtllm = saved["stored_profile_by_model"][model], saved["trtllm_profile_by_model"][model]
        bold = cell(fitted).replace(" (", "** (", 1)
        assert f"| **{bold} | {cell(stored)} | {cell(trtllm)} |" in row, row
    assert f"All {saved['rows']} rows: **{saved['rms_rel_err']:.3f}**" in docs


def test_a_configs_fp8_blocks_select_the_release_kernel(tmp_path, capsys):
    """`predict --config` reads a checkpoint's `weight_block_size` as the preset does: Qwen/Qwen3-235B-A22B-FP8's
    config.json at `--vllm-version 0.12.0` on 2 x H200 decodes at vLLM 0.12's padded kernel's price (its TPOT above
    today's), while the 16-bit config served with --weight-dtype fp8 (per-tensor, no blocks) is priced alike at
    either release."""
    presets = json.loads(MODELS_JSON.read_text())
    tpots = {}
    for slug, extra in (("qwen3-235b-a22b-fp8", []), ("qwen3-235b-a22b", ["--weight-dtype", "fp8"])):
        path = tmp_path / f"{slug}.json"
        path.write_text(json.dumps(presets[slug]["config"]))
        argv = ["--config", str(path), "--num-params", "235e9", "--gpu", "h200-141gb", "--tp", "2", *extra]
        argv += ["--prompt-len", "1000", "--output-len", "100", "--concurrency", "8"]
        for release in ([], ["--vllm-version", "0.12.0"]):
            tpots[slug, bool(release)] = _answer(predict_main, [*argv, *release], capsys)["mean_tpot_s"]
    assert tpots["qwen3-235b-a22b-fp8", True] > 1.2 * tpots["qwen3-235b-a22b-fp8", False]
    assert tpots["qwen3-235b-a22b", True] == tpots["qwen3-235b-a22b", False]
