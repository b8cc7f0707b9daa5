"""The step-time model's MLA attention (decodes on the absorbed latent, prefill chunks on the up-projected heads)
and int4 (W4A16, groups of 32) routed experts, worked by hand on a tiny Kimi-K2-shaped model and on the
`kimi-k2.5` preset (docs/slo.md 2c; core/planning/cost/step_model.py, module docstring: MLA).

The tiny model (`TINY`): 2 layers, 4 query heads, kv_lora_rank L = 8, qk_rope_head_dim R = 4, qk_nope_head_dim P = 6,
v_head_dim V = 5, hidden 64, 4 routed experts of width 32 (2 per token, no shared expert, no dense layer), int4
compressed-tensors weights in groups of 32 (attention kept 16-bit), on H200 at tp 2 (h = 2 query heads a GPU).

Per GPU, by hand:
- KV bytes per token: one latent of L + R = 12 bf16 values per layer, whole on every TP rank: 2 x 12 x 2 = 48 B
  (the capacity planner's rule, `kv_bytes_per_token`; the same at tp 1).
- a decode's (query, key) pair, the absorbed path: QK^T over the latent and the rope part 2 h (L + R) = 48, PV
  over the latent 2 h L = 32, per layer 80, over 2 layers 160 FLOPs.
- a prefill chunk's pair, the up-projected heads: QK^T 2 h (P + R) = 40, PV 2 h V = 20, per layer 60, so 120.
- a prefill chunk's prior-context token, its latent up-projected to K and V: 2 L h (P + V) = 352 a layer, 704.
- routed experts: 2 layers x 4 experts x 3 x 64 x 32 = 49,152 parameters, stored at 4 bits plus one 16-bit
  scale per 32 (4.5 bits: 0.5 byte + 1/16 byte a parameter) = 27,648 B, 13,824 B a GPU; FLOPs 2 x 2 / 4 x
  49,152 / 2 = 24,576 a token a GPU; W4A16 runs its GEMMs in bf16: H200's bf16 peak, 989 TFLOP/s.
- the rest of the weights (`checkpoint_weight_bytes` less the experts): 57,268 - 27,648 = 29,620 B, 14,810 a GPU.

One step (efficiencies 1, no overhead): 2 decodes at contexts 10 and 20 and a chunk of 3 prompt tokens starting
at 5, n = 5 new tokens. Pairs: decodes 11 + 21 = 32, chunk 3 x 5 + 3 x 4 / 2 = 21, 53 in all; keys read 30 + 5 = 35.
- bytes: 14,810 + 13,824 x (1 - (1 - 2/4)^5) = 13,824 x 31/32 = 13,392, + 48 x (35 + 5) = 1,920: 30,122;
- FLOPs: 39,984 x 5 = 199,920 (2 x the 39,984 active parameters a token, over tp 2) + 32 x 160 + 21 x 120
  + 5 x 704 = 5,120 + 2,520 + 3,520: 211,080 (priced as before, every pair at 4 x 12 x 4 x 2 / 2 = 192: 210,096).
"""

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS, ModelSpec
from core.planning.catalog.weights import checkpoint_weight_bytes
from core.planning.cost.fits import published_vllm as pv
from core.planning.cost.fits import published_vllm_rows as pvr
from core.planning.cost.fits.engine_profiles import VLLM_CROSS_MODEL_PROFILE, VLLM_STEP_DEFAULTS
from core.planning.cost.step_model import PrefillLoad, StepTimeModel
from core.planning.cost.step_time import from_specs, mla_attention_flops
from core.planning.memory.kv_accounting import kv_bytes_per_token
from core.sched.step_load import StepLoad

INT4 = {
    "config_groups": {
        "group_0": {"weights": {"group_size": 32, "num_bits": 4, "symmetric": True, "type": "int"}}
    },
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
    "quant_method": "compressed-tensors",
}
TINY = ModelSpec.from_hf_config(
    {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 0,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 0,
        "moe_intermediate_size": 32,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 8,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 4,
        "qk_nope_head_dim": 6,
        "v_head_dim": 5,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
        "quantization_config": INT4,
    },
    name="tiny-kimi",
)
H200 = GPUS["h200-141gb"]
UNIT = {"bandwidth_efficiency": 1.0, "flops_efficiency": 1.0, "overhead_s": 0.0}


def test_tiny_mla_int4_fields_by_hand():
    step = from_specs(TINY, H200, 2, **UNIT)
    assert (TINY.kv_lora_rank, TINY.qk_rope_head_dim, TINY.qk_nope_head_dim, TINY.v_head_dim) == (8, 4, 6, 5)
    assert step.kv_bytes_per_token == 48 == kv_bytes_per_token(TINY, "auto", 1)  # the planner's, unsplit
    assert (
        step.attention_flops_per_pair,
        step.prefill_attention_flops_per_pair,
        step.prefill_context_flops_per_token,
    ) == (160, 120, 704)
    assert TINY.expert_params == 49_152 and step.expert_weight_bytes == pytest.approx(13_824)
    assert step.expert_flops_per_token == 24_576 and step.peak_flops == H200.peak_bf16_flops
    assert checkpoint_weight_bytes(TINY)[0] == 57_268 and step.weight_bytes == pytest.approx(14_810)
    assert step.flops_per_token == 39_984 == 2 * TINY.num_params_active / 2


def test_tiny_step_bytes_and_flops_by_hand():
    step = from_specs(TINY, H200, 2, **UNIT)
    prefill = PrefillLoad(21, 5)
    parts = step.breakdown(5, 35, 53, prefill=prefill)
    assert parts.memory_s * H200.memory_bandwidth == pytest.approx(30_122, rel=1e-12)
    assert parts.compute_s * H200.peak_bf16_flops == pytest.approx(211_080, rel=1e-12)
    # without the split every pair is a decode's; with the ablation every pair is priced as before (192)
    assert step.breakdown(5, 35, 53).compute_s * H200.peak_bf16_flops == pytest.approx(199_920 + 53 * 160)
    before = from_specs(TINY, H200, 2, mla_one_attention=True, **UNIT)
    assert before.prefill_attention_flops_per_pair is None and before.attention_flops_per_pair == 192
    assert before.breakdown(5, 35, 53, prefill=prefill).compute_s * H200.peak_bf16_flops == pytest.approx(
        210_096
    )
    # the same step from its StepLoad (the simulator's hook), as a float and through step_time's arrays
    load = StepLoad(
        decode_tokens=2, prefill_tokens=3, kv_tokens_read=35, attention_pairs=53, decode_context_tokens=30
    )
    seconds = step.step_seconds(5, 35, 53, prefill=prefill)
    assert step.step_load_seconds(load) == seconds
    arrays = PrefillLoad(np.array([21.0]), np.array([5.0]))
    assert step.step_time(np.array([5.0]), np.array([35.0]), np.array([53.0]), prefill=arrays)[
        0
    ] == pytest.approx(seconds, rel=1e-12)
    # a lone prefill of 16 tokens in chunks of 8: the second chunk reads the first as prior context
    first = step.step_seconds(8, 0, 36, prefill=PrefillLoad(36, 0))
    second = step.step_seconds(8, 8, 8 * 8 + 36, prefill=PrefillLoad(100, 8))
    assert step.prefill_seconds(16, 8) == pytest.approx(first + second, rel=1e-12)


def _attention_flops(
    path: str, keys: int, h: int = 2, latent: int = 8, rope: int = 4, nope: int = 6, v: int = 5
):
    """FLOPs torch counts for one query attending to `keys` keys on one layer's h heads, by vLLM's two MLA paths
    as its mla_attention.py docstring writes them (the up-projections of the query and output left out)."""
    q = torch.zeros(h, 1, latent + rope if path == "decode" else nope + rope)
    with FlopCounterMode(display=False) as counter:
        if path == "decode":  # MQA over the latent: K = [kv_c, k_pe], V = kv_c, shared by the heads
            kv = torch.zeros(1, keys, latent + rope)
            torch.matmul(torch.softmax(torch.matmul(q, kv.transpose(1, 2)), -1), kv[..., :latent])
        else:  # MHA over the up-projected heads: K = [k_nope, k_pe] (P + R), V (V wide)
            k, val = torch.zeros(h, keys, nope + rope), torch.zeros(h, keys, v)
            torch.matmul(torch.softmax(torch.matmul(q, k.transpose(1, 2)), -1), val)
    return counter.get_total_flops()


def test_per_pair_flops_match_torchs_count_of_both_paths():
    """Independent of the formula: torch's FLOP counter on the two attentions, per key (one layer, 2 heads)."""
    fields = mla_attention_flops(TINY, 2)
    for path, name in (
        ("decode", "attention_flops_per_pair"),
        ("prefill", "prefill_attention_flops_per_pair"),
    ):
        per_key = _attention_flops(path, 17) - _attention_flops(path, 16)
        assert per_key * TINY.num_layers == fields[name], path
    # the up-projection of one context token's latent to K_nope and V over the 2 heads (kv_b_proj)
    with FlopCounterMode(display=False) as counter:
        torch.matmul(torch.zeros(1, 8), torch.zeros(8, 2 * (6 + 5)))
    assert counter.get_total_flops() * TINY.num_layers == fields["prefill_context_flops_per_token"]


def test_kimi_preset_int4_experts_and_mla_by_hand():
    """kimi-k2.5 on 8 x H200: 60 MoE layers x 384 experts x 3 x 7,168 x 2,048 = 1,014,686,023,680 expert parameters
    at 4.5 bits = 570,760,888,320 B, 71,345,111,040 a GPU, of which a one-token decode reads 8 / 384 =
    1,486,356,480; KV 61 x 576 x 2 = 70,272 B a token on every GPU; per pair 61 x 8 heads x 2,176 = 1,061,888
    FLOPs (decode) and 61 x 8 x 640 = 312,320 (prefill)."""
    kimi = MODELS["kimi-k2.5"]
    step = from_specs(kimi, H200, 8, "int4", **UNIT)
    assert kimi.expert_params == 60 * 384 * 3 * 7168 * 2048 == 1_014_686_023_680
    assert step.expert_weight_bytes == pytest.approx(1_014_686_023_680 * 4.5 / 8 / 8, rel=1e-12)
    assert step.expert_weight_bytes * step.experts_touched(1) == pytest.approx(1_486_356_480, rel=1e-12)
    assert step.kv_bytes_per_token == 70_272 and step.peak_flops == H200.peak_bf16_flops
    assert (step.attention_flops_per_pair, step.prefill_attention_flops_per_pair) == (1_061_888, 312_320)
    assert step.expert_flops_per_token == pytest.approx(2 * 8 / 384 * 1_014_686_023_680 / 8, rel=1e-12)


def test_other_models_keep_one_attention_and_no_hook():
    for slug, dtype in (("llama-3.1-70b", "fp8"), ("gpt-oss-120b", "auto"), ("qwen3-235b-a22b", "fp8")):
        model = MODELS[slug]
        step = from_specs(model, H200, 4, dtype)
        assert step.prefill_attention_flops_per_pair is None and step.step_load_seconds is None
        assert (
            step.attention_flops_per_pair
            == 4.0 * model.num_layers * model.num_attention_heads * model.head_dim / 4
        )
        assert from_specs(model, H200, 4, dtype, mla_one_attention=True) == step
        # a prefill split given to a model without MLA changes nothing
        assert step.step_seconds(9, 100, 145, prefill=PrefillLoad(45, 0)) == step.step_seconds(9, 100, 145)


def test_bad_prefill_fields_are_refused():
    base = {
        "weight_bytes": 1.0,
        "kv_bytes_per_token": 1.0,
        "flops_per_token": 1.0,
        "attention_flops_per_pair": 1.0,
    }
    base |= {"memory_bandwidth": 1.0, "peak_flops": 1.0}
    with pytest.raises(InvalidArgumentError, match="prefill_attention_flops_per_pair"):
        StepTimeModel(**base, prefill_attention_flops_per_pair=-1.0)
    with pytest.raises(InvalidArgumentError, match="prefill_context_flops_per_token"):
        StepTimeModel(**base, prefill_context_flops_per_token=-1.0)
    with pytest.raises(InvalidArgumentError, match="sliding-window"):
        StepTimeModel(
            **base, prefill_attention_flops_per_pair=1.0, sliding_layer_fraction=0.5, sliding_window=8
        )


def test_simulated_mla_prefill_is_priced_as_a_prefill():
    """One client, 4,096 prompt / 4 output tokens on kimi-k2.5 (TP 8, int4): each request's TTFT is one
    4,096-token prefill step (compute-bound) priced on the prefill path (4,096 x 4,097 / 2 pairs, no prior
    context), its TPOT the mean of 3 decode steps; the replay (recorded loads with their prefill split) gives
    the same."""
    row = pvr.VllmRow("one", "kimi-k2.5", "h200-141gb", 8, 4096, 4, 1, 1.0, 1.0, weight_dtype="int4")
    step = pv.step_model(row, VLLM_STEP_DEFAULTS)
    pairs = 4096 * 4097 / 2
    ttft = step.step_seconds(4096, 0, pairs, prefill=PrefillLoad(pairs, 0))
    assert ttft < step.step_seconds(4096, 0, pairs)  # priced as decodes' pairs it would take longer
    tpot = np.mean([step.step_seconds(1, ctx, ctx + 1) for ctx in (4096, 4097, 4098)])
    assert pv.predict_row(row, VLLM_STEP_DEFAULTS) == pytest.approx((ttft, tpot), rel=1e-9)
    assert pv.RowReplay(row).latencies(VLLM_CROSS_MODEL_PROFILE) == pytest.approx(
        pv.predict_row(row, VLLM_CROSS_MODEL_PROFILE), rel=1e-9
    )


def test_kimi_row_replay_equals_simulating_again():
    row = next(
        r for r in pvr.ROWS if r.model == "kimi-k2.5" and (r.isl, r.osl, r.concurrency) == (8192, 1024, 4)
    )
    assert pv.replay(row).latencies(VLLM_CROSS_MODEL_PROFILE) == pytest.approx(
        pv.predict_row(row, VLLM_CROSS_MODEL_PROFILE), rel=1e-9
    )
