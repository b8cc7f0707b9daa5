"""Model and GPU presets against the published configs and datasheets (docs/figures.md)."""

import json

import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GB, GPUS, GiB, GPUSpec, get_gpu
from core.planning.catalog.models import MODELS, MODELS_JSON, ModelSpec, estimate_num_params, get_model

# docs/figures.md, "Model configurations": layers, heads, KV heads, head_dim, max positions.
PUBLISHED = {
    "llama-2-7b": (32, 32, 32, 128, 4096),
    "llama-2-13b": (40, 40, 40, 128, 4096),
    "llama-2-70b": (80, 64, 8, 128, 4096),
    "llama-3.1-8b": (32, 32, 8, 128, 131072),
    "llama-3.1-70b": (80, 64, 8, 128, 131072),
    "llama-3.1-405b": (126, 128, 8, 128, 131072),
    "mistral-7b": (32, 32, 8, 128, 32768),
    "mixtral-8x7b": (32, 32, 8, 128, 32768),
    "qwen2.5-7b": (28, 28, 4, 128, 131072),
    "qwen2.5-72b": (80, 64, 8, 128, 131072),
    "opt-13b": (40, 40, 40, 128, 2048),
    "opt-66b": (64, 72, 72, 128, 2048),
    "gemma-2-9b": (42, 16, 8, 256, 8192),
    "phi-3-mini": (32, 32, 32, 96, 4096),
}
PUBLISHED_PARAMS = {
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "llama-2-70b": 69.0e9,
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
    "llama-3.1-405b": 405.9e9,
    "mistral-7b": 7.24e9,
    "mixtral-8x7b": 46.7e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "opt-13b": 12.9e9,
    "opt-66b": 65.7e9,
    "gemma-2-9b": 9.24e9,
    "phi-3-mini": 3.82e9,
    "deepseek-v3": 671e9,
}


def test_all_issue_presets_exist():
    assert set(PUBLISHED) | {"deepseek-v3"} <= set(MODELS)
    assert {
        "a100-40gb",
        "a100-80gb",
        "h100-80gb",
        "h200-141gb",
        "l4",
        "l40s",
        "rtx-4090",
        "a10g",
        "mi300x",
        "b200",
    } <= set(GPUS)


@pytest.mark.parametrize("slug", sorted(PUBLISHED))
def test_preset_shapes_match_published_config(slug):
    model = MODELS[slug]
    shape = (
        model.num_layers,
        model.num_attention_heads,
        model.num_kv_heads,
        model.head_dim,
        model.max_position_embeddings,
    )
    assert shape == PUBLISHED[slug]


def test_deepseek_v3_is_mla_with_published_latent():
    model = MODELS["deepseek-v3"]
    assert model.is_mla and model.is_moe
    assert (model.num_layers, model.kv_lora_rank, model.qk_rope_head_dim) == (61, 512, 64)
    assert model.max_position_embeddings == 163840
    assert (model.num_params, model.num_params_active) == (671_000_000_000, 37_000_000_000)
    assert model.compute_dtype == "bfloat16" and model.quantization == "fp8"


@pytest.mark.parametrize("slug", sorted(PUBLISHED_PARAMS))
def test_parameter_estimate_from_shapes_is_within_one_percent_of_published(slug):
    raw = json.loads(MODELS_JSON.read_text())[slug]["config"]
    estimate = estimate_num_params(raw)
    assert estimate["total"] == pytest.approx(PUBLISHED_PARAMS[slug], rel=0.01)


def test_moe_active_parameter_estimate():
    raw = json.loads(MODELS_JSON.read_text())
    assert estimate_num_params(raw["mixtral-8x7b"]["config"])["active"] == pytest.approx(12.9e9, rel=0.01)
    assert estimate_num_params(raw["deepseek-v3"]["config"])["active"] == pytest.approx(37e9, rel=0.02)


def test_from_hf_config_falls_back_like_vllm():
    # No num_key_value_heads: one KV head per attention head; no head_dim: hidden / heads.
    opt = ModelSpec.from_hf_config(
        {
            "model_type": "opt",
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "num_hidden_layers": 40,
            "ffn_dim": 20480,
            "vocab_size": 50272,
        }
    )
    assert (opt.num_kv_heads, opt.head_dim) == (40, 128)
    assert opt.params_estimated and opt.num_params == pytest.approx(12.85e9, rel=0.01)
    # Explicit head_dim wins over hidden / heads (Gemma-2-9B: 256, not 3584 / 16 = 224).
    gemma = MODELS["gemma-2-9b"]
    assert gemma.head_dim == 256 and gemma.hidden_size // gemma.num_attention_heads == 224
    # float32 checkpoint: Gemma-2 is served in bf16 (fp16 overflows), others in fp16.
    assert gemma.compute_dtype == "bfloat16"
    other = ModelSpec.from_hf_config(
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "vocab_size": 100,
            "torch_dtype": "float32",
        }
    )
    assert other.compute_dtype == "float16"
    # Multimodal configs nest the language model under text_config.
    nested = ModelSpec.from_hf_config(
        {
            "model_type": "llava",
            "text_config": {
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "num_hidden_layers": 32,
                "vocab_size": 32000,
            },
        }
    )
    assert (nested.num_layers, nested.num_kv_heads) == (32, 8)


@pytest.mark.parametrize(
    "config, message",
    [
        ([1, 2], "JSON object"),
        ({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}, "number of layers"),
        (
            {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": -2, "vocab_size": 10},
            "out of range",
        ),
        (
            {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": "x", "vocab_size": 10},
            "integer",
        ),
        (
            {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 8,
                "num_hidden_layers": 2,
                "vocab_size": 10,
            },
            "exceeds",
        ),
        ({"hidden_size": 66, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10}, "head_dim"),
        (
            {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 10,
                "torch_dtype": "int3",
            },
            "torch_dtype",
        ),
        (
            {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 10,
                "kv_lora_rank": 16,
            },
            "MLA",
        ),
    ],
)
def test_from_hf_config_rejects_bad_configs(config, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ModelSpec.from_hf_config(config)


def test_unknown_slugs_list_the_known_ones():
    with pytest.raises(InvalidArgumentError, match=r"llama-3\.1-8b"):
        get_model("llama-9")
    with pytest.raises(InvalidArgumentError, match="h100-80gb"):
        get_gpu("h1000")


@pytest.mark.parametrize(
    "slug, memory_mib, bandwidth_gb_per_s, driver",
    [
        ("a100-40gb", 40_960, 1555, True),
        ("a100-80gb", 81_920, 2039, False),
        ("h100-80gb", 81_559, 3350, True),
        ("h200-141gb", 143_771, 4800, True),
        ("l4", 23_034, 300, True),
        ("l40s", 46_068, 864, True),
        ("rtx-4090", 24_564, 1008, True),
        ("a10g", 23_028, 600, True),
        ("mi300x", 192 * 1024, 5300, False),
        ("b200", 180 * 1024, 8000, False),
    ],
)
def test_gpu_presets_use_the_driver_reported_total(slug, memory_mib, bandwidth_gb_per_s, driver):
    """Memory: the total nvidia-smi / torch.cuda.mem_get_info report in public logs (docs/figures.md), or, without
    one, the HBM rule (printed GB as GiB); bandwidth from the datasheets."""
    gpu = GPUS[slug]
    assert gpu.memory_bytes == memory_mib * 1024**2
    assert gpu.memory_bandwidth == bandwidth_gb_per_s * GB
    assert gpu.peak_bf16_flops and gpu.source
    assert f"{memory_mib:,} MiB" in gpu.source
    assert ("driver-reported" in gpu.source) == driver and ("HBM rule" in gpu.source) == (not driver)


@pytest.mark.parametrize(
    "slug, link, link_gb_per_s, fp8_tflops",
    [
        ("a100-40gb", "NVLink 3", 600, None),
        ("a100-80gb", "NVLink 3", 600, None),
        ("h100-80gb", "NVLink 4", 900, 1979),
        ("h200-141gb", "NVLink 4", 900, 1979),
        ("l4", "PCIe Gen4 x16", 64, 242.5),
        ("l40s", "PCIe Gen4 x16", 64, 733),
        ("rtx-4090", "PCIe Gen4 x16", 64, None),
        ("a10g", "PCIe Gen4 x16", 64, None),
        ("mi300x", "Infinity Fabric", 896, 2614.9),
        ("b200", "NVLink 5", 1800, 4500),
    ],
)
def test_gpu_presets_carry_the_datasheet_interconnect_and_fp8_peak(slug, link, link_gb_per_s, fp8_tflops):
    """docs/figures.md, GPUs: the bidirectional GPU-to-GPU bandwidth and the dense FP8 TFLOP/s printed."""
    gpu = GPUS[slug]
    assert (gpu.interconnect, gpu.interconnect_bandwidth) == (link, link_gb_per_s * GB)
    assert gpu.peak_fp8_flops == (None if fp8_tflops is None else pytest.approx(fp8_tflops * 1e12))


def test_gb_versus_gib():
    # An H100 "80GB" reports 81,559 MiB = 79.6 GiB = 85.5e9 bytes; 80e9 bytes would be 74.5 GiB.
    assert GPUS["h100-80gb"].memory_gb == pytest.approx(85.521, abs=1e-3)
    assert GPUS["h100-80gb"].memory_gib == pytest.approx(79.647, abs=1e-3)
    assert 80 * GB / GiB == pytest.approx(74.506, abs=1e-3)
    # GDDR6 with ECC keeps 15/16 of its chips: an L4's 24 GiB x 15/16 = 22.5 GiB = 23,040 MiB, reported 23,034
    assert GPUS["l4"].memory_gib == pytest.approx(24 * 15 / 16, abs=0.01)
    assert GPUS["l40s"].memory_gib == pytest.approx(48 * 15 / 16, abs=0.02)


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 100), "positive"),
        ((-1, 100), "positive"),
        ((80, "fast"), "number"),
        ((1e9, 100), "absurd"),
        ((80, 1e9), "absurd"),
        ((80, float("nan")), "positive"),
        ((80, 100, 1e9), "absurd"),
    ],
)
def test_custom_gpu_validation(args, message):
    with pytest.raises(InvalidArgumentError, match=message):
        GPUSpec.custom("mine", *args)


def test_custom_gpu_units():
    gpu = GPUSpec.custom("mine", 64, 2000, 500)
    assert (gpu.memory_bytes, gpu.memory_bandwidth, gpu.peak_bf16_flops) == (64 * GiB, 2e12, 5e14)


NEW_PRESETS = {  # slug: (layers, KV heads, head_dim, max positions, published total parameters)
    "gpt-oss-20b": (24, 8, 64, 131072, 20.91e9),
    "gpt-oss-120b": (36, 8, 64, 131072, 116.83e9),
    "gemma-3-27b": (62, 16, 128, 131072, 27.43e9 - 0.417e9),  # the shapes count the text model only
    "llama-4-scout": (48, 8, 128, 10485760, 109e9),
    "qwen3-next-80b": (48, 2, 256, 262144, 80e9),
}


@pytest.mark.parametrize("slug", sorted(NEW_PRESETS))
def test_hybrid_presets_shapes_and_parameter_estimate(slug):
    layers, kv_heads, head_dim, positions, params = NEW_PRESETS[slug]
    model = MODELS[slug]
    assert (model.num_layers, model.num_kv_heads, model.head_dim, model.max_position_embeddings) == (
        layers,
        kv_heads,
        head_dim,
        positions,
    )
    raw = json.loads(MODELS_JSON.read_text())[slug]
    config = {**raw["config"], **raw["config"].get("text_config", {})}
    assert estimate_num_params(config)["total"] == pytest.approx(params, rel=0.015)
    assert raw["source"] and model.is_hybrid


def test_published_layer_patterns():
    from collections import Counter

    gpt = MODELS["gpt-oss-20b"]
    assert gpt.layer_kinds[:2] == ("sliding_attention", "full_attention") and gpt.sliding_window == 128
    assert gpt.quantization == "mxfp4" and (gpt.quantization_bits, gpt.quantization_group_size) == (4, 32)
    gemma2 = MODELS["gemma-2-9b"]
    assert (
        gemma2.layer_kinds[0::2] == ("sliding_attention",) * 21
        and gemma2.layer_kinds[1::2] == ("full_attention",) * 21
    )
    gemma3 = MODELS["gemma-3-27b"]
    assert Counter(gemma3.layer_kinds) == {"sliding_attention": 52, "full_attention": 10}
    assert [i for i, t in enumerate(gemma3.layer_kinds) if t == "full_attention"] == list(range(5, 62, 6))
    assert gemma3.sliding_window == 1024
    llama4 = MODELS["llama-4-scout"]
    assert [i for i, t in enumerate(llama4.layer_kinds) if t == "full_attention"] == list(range(3, 48, 4))
    assert llama4.attention_chunk_size == 8192 and llama4.sliding_window is None
    qwen = MODELS["qwen3-next-80b"]
    assert [i for i, t in enumerate(qwen.layer_kinds) if t == "full_attention"] == list(range(3, 48, 4))
    assert qwen.recurrent_state.kind == "gated_delta_net"
    assert MODELS["mistral-7b"].layer_kinds == ("sliding_attention",) * 32
    for slug in ("llama-3.1-8b", "qwen2.5-7b", "deepseek-v3", "mixtral-8x7b"):
        assert not MODELS[slug].is_hybrid and MODELS[slug].sliding_window is None
    assert get_model("mistral-7b-v0.1") is MODELS["mistral-7b"]


BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 8, "vocab_size": 100}


@pytest.mark.parametrize(
    "extra, full_layers",
    [
        ({"model_type": "qwen2", "sliding_window": 32, "use_sliding_window": False}, list(range(8))),
        (
            {"model_type": "qwen2", "sliding_window": 32, "use_sliding_window": True, "max_window_layers": 6},
            list(range(6)),
        ),
        ({"model_type": "gemma3_text", "sliding_window": 32, "sliding_window_pattern": 4}, [3, 7]),
        ({"model_type": "gemma3_text", "sliding_window": 32}, [5]),
        (
            {"model_type": "llama4_text", "attention_chunk_size": 64, "no_rope_layer_interval": 2},
            [1, 3, 5, 7],
        ),
        (
            {
                "model_type": "llama4_text",
                "attention_chunk_size": 64,
                "no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 0],
            },
            [0, 7],
        ),
        ({"model_type": "mistral", "sliding_window": 32}, []),
        (
            {
                "model_type": "llama",
                "layer_types": ["full_attention", "sliding_attention"] * 4,
                "sliding_window": 8,
            },
            [0, 2, 4, 6],
        ),
    ],
)
def test_layer_type_rules(extra, full_layers):
    model = ModelSpec.from_hf_config({**BASE, **extra})
    assert [i for i, t in enumerate(model.layer_kinds) if t == "full_attention"] == full_layers


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"layer_types": ["full_attention"] * 3}, "8 entries"),
        ({"layer_types": ["cross_attention"] * 8}, "not supported"),
        ({"layer_types": ["sliding_attention"] * 8}, "sliding_window"),
        ({"layer_types": ["chunked_attention"] * 8}, "attention_chunk_size"),
        ({"layer_types": ["linear_attention"] * 8}, "state shape"),
    ],
)
def test_bad_layer_types_are_refused(extra, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ModelSpec.from_hf_config({**BASE, **extra})


@pytest.mark.parametrize("block", [[128], "128", [128, 0], [True, 128], None])
def test_a_weight_block_size_that_is_no_block_shape_reads_as_none(block):
    config = {**BASE, "quantization_config": {"quant_method": "fp8", "weight_block_size": block}}
    expected = (128,) if block == [128] else ()
    assert ModelSpec.from_hf_config(config).quantization_block == expected
