"""core.planner against the published figures in reference.md."""

import pytest

from core.errors import InvalidArgumentError
from core.models import MODELS, ModelSpec
from core.planner import kv_bytes_per_token, resolve_kv_dtype

KiB = 1024

# reference.md "KV bytes/token, bf16" column (fp16 for the fp16 checkpoints: same 2 bytes).
PUBLISHED_KV_BYTES = {
    "llama-2-7b": 524_288, "llama-2-13b": 819_200, "llama-2-70b": 327_680, "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 327_680, "llama-3.1-405b": 516_096, "mistral-7b": 131_072, "mixtral-8x7b": 131_072,
    "qwen2.5-7b": 57_344, "qwen2.5-72b": 327_680, "opt-13b": 819_200, "opt-66b": 2_359_296,
    "gemma-2-9b": 344_064, "phi-3-mini": 393_216, "deepseek-v3": 70_272,
}  # fmt: skip


@pytest.mark.parametrize("slug", sorted(PUBLISHED_KV_BYTES))
def test_kv_bytes_per_token_matches_reference_table(slug):
    assert kv_bytes_per_token(MODELS[slug]) == PUBLISHED_KV_BYTES[slug]


def test_opt_13b_is_800_kib_per_token_in_fp16():
    # PagedAttention paper section 3: 2 x 5120 x 40 x 2 bytes = 800 KiB; 2048 tokens need ~1.6 GB.
    assert resolve_kv_dtype(MODELS["opt-13b"]) == "fp16"
    assert kv_bytes_per_token(MODELS["opt-13b"], "fp16") == 800 * KiB
    assert 2048 * 800 * KiB == pytest.approx(1.68e9, rel=0.01)


def test_llama_3_1_8b_is_128_kib():
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], "bf16") == 128 * KiB
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], "fp8") == 64 * KiB


def test_gemma_2_uses_published_head_dim():
    # 2 x 42 layers x 8 KV heads x 256 x 2 bytes; hidden/heads (224) would give 301,056.
    assert kv_bytes_per_token(MODELS["gemma-2-9b"]) == 2 * 42 * 8 * 256 * 2 == 344_064


def test_deepseek_v3_mla_latent_no_factor_two_replicated_on_tp():
    model = MODELS["deepseek-v3"]
    assert kv_bytes_per_token(model) == 61 * (512 + 64) * 2 == 70_272
    # Replicated on every TP rank: TP does not shrink it.
    assert kv_bytes_per_token(model, tensor_parallel=8) == 70_272
    assert kv_bytes_per_token(model, "fp8", tensor_parallel=8) == 35_136
    # PP splits layers: ceil(61 / 4) = 16 layers on the largest stage.
    assert kv_bytes_per_token(model, pipeline_parallel=4) == 16 * 576 * 2


def test_llama_3_1_70b_per_gpu_at_tp4_and_tp16():
    model = MODELS["llama-3.1-70b"]
    # tp 4: 8 KV heads / 4 = 2 per GPU.
    assert kv_bytes_per_token(model, "bf16", tensor_parallel=4) == 2 * 80 * 2 * 128 * 2 == 81_920
    # tp 16 > 8 KV heads: each head replicated on 2 GPUs, still 1 head per GPU (not 0.5).
    assert kv_bytes_per_token(model, "bf16", tensor_parallel=16) == 2 * 80 * 1 * 128 * 2 == 40_960
    assert kv_bytes_per_token(model, "bf16", tensor_parallel=8) == 40_960
    assert kv_bytes_per_token(model, "fp8", tensor_parallel=4) == 40_960


def test_pipeline_parallel_uses_largest_stage():
    model = MODELS["llama-3.1-405b"]  # 126 layers
    assert kv_bytes_per_token(model, "bf16", pipeline_parallel=4) == 2 * 32 * 8 * 128 * 2  # ceil(126/4) = 32


@pytest.mark.parametrize("kv_dtype, expected", [("fp16", 131_072), ("bf16", 131_072), ("fp8", 65_536),
                                                ("int8", 65_536), ("fp4", 32_768)])  # fmt: skip
def test_kv_dtypes(kv_dtype, expected):
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], kv_dtype) == expected


def test_auto_dtype_follows_vllm():
    assert resolve_kv_dtype(MODELS["llama-2-7b"]) == "fp16"  # float16 checkpoint
    assert resolve_kv_dtype(MODELS["llama-3.1-8b"]) == "bf16"
    assert resolve_kv_dtype(MODELS["gemma-2-9b"]) == "bf16"  # float32 checkpoint, fp16-unsafe family
    assert resolve_kv_dtype(MODELS["deepseek-v3"]) == "bf16"  # FP8 weights, bf16 compute and cache


@pytest.mark.parametrize(
    "kwargs, message",
    [({"kv_dtype": "fp3"}, "allowed"), ({"tensor_parallel": 0}, ">= 1"), ({"tensor_parallel": 3}, "divisible"),
     ({"pipeline_parallel": 81}, "exceeds"), ({"tensor_parallel": 2.0}, "integer")],
)  # fmt: skip
def test_bad_arguments(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        kv_bytes_per_token(MODELS["llama-3.1-70b"], **kwargs)


def test_kv_heads_neither_dividing_nor_multiple_is_refused():
    model = ModelSpec.from_hf_config({"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 4,
                                      "num_hidden_layers": 2, "vocab_size": 100})  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="KV heads"):
        kv_bytes_per_token(model, tensor_parallel=6)
    assert kv_bytes_per_token(model, "fp16", tensor_parallel=2) == 2 * 2 * 2 * 64 * 2
