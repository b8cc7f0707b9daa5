"""The presets of the published vLLM runs' models (issue 40): each held to the config.json it cites, field by field,
and to its published parameter counts. MiniMax-M2.5, Kimi-K2.5 and the FP8 checkpoint of Qwen3-235B-A22B."""

import dataclasses
import json

import pytest

from core.planning.catalog.models import MODELS, MODELS_JSON, estimate_num_params


def test_minimax_m2_5_preset_counts_230b_and_10b_active():
    """MiniMax-M2.5 (MiniMax-M2's shapes): 62 layers x 256 experts x 3 x 3,072 x 1,536 = 224.7B expert
    parameters; the shapes total 228.7B against the published 230B (-0.6 %). "10B activated" counts the decoder
    without the embedding and LM head (2 x 200,064 x 3,072 = 1.23B): 9.80B (-2.0 %; 11.03B with them)."""
    raw = json.loads(MODELS_JSON.read_text())["minimax-m2.5"]["config"]
    estimate = estimate_num_params(raw)
    assert estimate["experts"] == 62 * 256 * 3 * 3072 * 1536
    assert estimate["total"] == pytest.approx(230e9, rel=0.01)
    outside = estimate["embedding"] + estimate["lm_head"]
    assert outside == 2 * 200_064 * 3072
    assert estimate["active"] - outside == pytest.approx(10e9, rel=0.025)
    model = MODELS["minimax-m2.5"]
    assert (
        model.num_layers,
        model.num_kv_heads,
        model.head_dim,
        model.num_experts,
        model.num_experts_per_tok,
    ) == (62, 8, 128, 256, 8)
    assert model.quantization == "fp8" and not model.is_mla and model.compute_dtype == "bfloat16"


# The config.json of MiniMaxAI/MiniMax-M2.5 as ai-dynamo/aiconfigurator stores it (Apache-2.0): file
# aic-core/src/aiconfigurator_core/model_configs/MiniMaxAI--MiniMax-M2.5_config.json at commit
# 095f58a51c4ca8e61b66ec108d86f223f8d559ce, the commit whose vLLM rows the cross-model fit uses (docs/slo.md 2c):
# every field of it the planner or the step-time model reads, with the file's values.
MINIMAX_M2_5_AIC_CONFIG = {
    "architectures": ["MiniMaxM2ForCausalLM"],
    "model_type": "minimax_m2",
    "num_hidden_layers": 62,
    "hidden_size": 3072,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 1536,
    "vocab_size": 200064,
    "num_experts_per_tok": 8,
    "num_local_experts": 256,
    "max_position_embeddings": 196608,
    "rotary_dim": 64,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "use_qk_norm": True,
    "use_routing_bias": True,
    "shared_intermediate_size": 0,
    "scoring_func": "sigmoid",
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "float8_e4m3fn",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"],
    },
}


def test_minimax_m2_5_preset_is_the_cited_config():
    """The preset's config fields are the cited file's (every field above, same value), and the ModelSpec read
    from it has those shapes: no dense layer and no shared expert, so every one of the 62 layers is an MoE layer
    of 256 experts of 3 x 3,072 x 1,536."""
    preset = json.loads(MODELS_JSON.read_text())["minimax-m2.5"]["config"]
    for key, value in MINIMAX_M2_5_AIC_CONFIG.items():
        assert preset[key] == value, key
    model = MODELS["minimax-m2.5"]
    assert (
        model.num_layers,
        model.num_attention_heads,
        model.num_kv_heads,
        model.head_dim,
        model.hidden_size,
        model.vocab_size,
        model.max_position_embeddings,
        model.num_experts,
        model.num_experts_per_tok,
    ) == (62, 48, 8, 128, 3072, 200064, 196608, 256, 8)
    assert model.expert_params == 62 * 256 * 3 * 3072 * 1536
    # total from the shapes: the experts, the attention (q, k, v, o), routers, norms, embedding and LM head
    attention = 62 * (3072 * 48 * 128 * 2 + 2 * 3072 * 8 * 128)
    assert model.attention_params == attention
    assert estimate_num_params(MINIMAX_M2_5_AIC_CONFIG)["total"] == pytest.approx(228.69e9, rel=1e-4)


def test_kimi_k2_5_preset_counts_1_04t_and_32b_active():
    """Kimi-K2.5 (DeepSeek-V3's architecture under text_config): 60 MoE layers x 384 experts x 3 x 7,168 x 2,048
    = 1,014.7B expert parameters; the shapes total 1.026T against the published ~1.04T (-1.3 %; the model card
    rounds to 1T) and 32.9B active against 32B (+2.7 %, embedding and LM head counted, as DeepSeek-V3's 37B).
    MLA: one latent of 512 + 64 per layer, whole on every TP rank; int4 experts in groups of 32."""
    raw = json.loads(MODELS_JSON.read_text())["kimi-k2.5"]["config"]
    estimate = estimate_num_params(raw)
    assert estimate["experts"] == 60 * 384 * 3 * 7168 * 2048
    assert estimate["total"] == pytest.approx(1.04e12, rel=0.015)
    assert estimate["active"] == pytest.approx(32e9, rel=0.03)
    model = MODELS["kimi-k2.5"]
    assert model.is_mla and (model.kv_lora_rank, model.qk_rope_head_dim, model.num_layers) == (512, 64, 61)
    assert (model.num_experts, model.num_experts_per_tok, model.max_position_embeddings) == (384, 8, 262_144)
    assert (model.quantization, model.quantization_bits, model.quantization_group_size) == (
        "compressed-tensors",
        4,
        32,
    )
    assert model.num_params == round(estimate["total"]) and model.params_estimated
    assert model.num_params_active == 32e9


# The config.json of Qwen/Qwen3-235B-A22B-FP8 as ai-dynamo/aiconfigurator stores it (Apache-2.0): file
# aic-core/src/aiconfigurator_core/model_configs/Qwen--Qwen3-235B-A22B-FP8_config.json at the commit above: the
# fields of Qwen/Qwen3-235B-A22B's config.json and a quantization_config of block-scaled FP8.
QWEN3_235B_FP8_QUANTIZATION = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def test_qwen3_235b_a22b_fp8_preset_is_the_16_bit_one_stored_in_fp8_blocks():
    """The FP8 checkpoint's preset: every config field the 16-bit preset has, with the file's quantization_config
    (128 x 128 blocks, read as `quantization_block`); the ModelSpecs differ in name, repository and quantization
    only, and the 16-bit preset has no blocks (served with --weight-dtype fp8, vLLM quantizes it per tensor)."""
    presets = json.loads(MODELS_JSON.read_text())
    fp8, bf16 = presets["qwen3-235b-a22b-fp8"]["config"], presets["qwen3-235b-a22b"]["config"]
    assert {k: v for k, v in fp8.items() if k != "quantization_config"} == bf16
    for key, value in QWEN3_235B_FP8_QUANTIZATION.items():
        assert fp8["quantization_config"][key] == value, key
    model, base = MODELS["qwen3-235b-a22b-fp8"], MODELS["qwen3-235b-a22b"]
    assert (model.quantization, model.quantization_bits, model.quantization_block) == ("fp8", 8, (128, 128))
    assert base.quantization_block == () and MODELS["minimax-m2.5"].quantization_block == (128, 128)
    differ = {f.name for f in dataclasses.fields(model) if getattr(model, f.name) != getattr(base, f.name)}
    assert differ == {
        "name",
        "hf_repo",
        "quantization",
        "quantization_bits",
        "quantization_skips",
        "quantization_block",
    }
