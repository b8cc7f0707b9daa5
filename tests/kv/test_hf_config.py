"""The one config reader (`core.kv.hf_config`): per-layer specs from a Hugging Face config, the same for the
planner's ModelSpec, the engine's ModelConfig and a raw dict; page sizes worked by hand."""

import pytest

from core.engine.config import ModelConfig
from core.errors import InvalidArgumentError, ModelLoadError
from core.kv.hf_config import layer_specs, read_kv_layers
from core.kv.layout import kv_cache_groups, kv_cache_layout
from core.kv.specs import FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec
from core.planning.catalog.models import MODELS, ModelSpec

QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "sliding_window": 8,
    "use_sliding_window": True,
    "max_window_layers": 2,
}


def test_one_reader_for_planner_engine_and_dicts():
    """Qwen2 with max_window_layers 2 of 4: layers 2 and 3 slide; planner, engine and dict give equal specs."""
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="fp32")
    window = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="fp32", sliding_window=8)
    expected = [full, full, window, window]
    for source in (QWEN2, ModelSpec.from_hf_config(QWEN2), ModelConfig.from_dict(QWEN2)):
        assert layer_specs(source, block_size=16, kv_dtype="fp32") == expected
    assert ModelConfig.from_dict(QWEN2).kv_layers.sliding_windows == (None, None, 8, 8)
    # transformers' default for Qwen2 is use_sliding_window=False: a missing flag means every layer is full.
    no_flag = {k: v for k, v in QWEN2.items() if k != "use_sliding_window"}
    assert ModelConfig.from_dict(no_flag).kv_layers.sliding_windows == (None,) * 4
    assert set(layer_specs(no_flag, block_size=16, kv_dtype="fp32")) == {full}
    # Mistral: one window on every layer, one group (what lets the engine's block manager free blocks).
    mistral = {**QWEN2, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    groups, padding = kv_cache_groups(
        layer_specs(ModelConfig.from_dict(mistral), block_size=4, kv_dtype="fp32")
    )
    assert [(g.kind, g.window, g.layers) for g in groups] == [
        ("sliding_window", 8, (0, 1, 2, 3))
    ] and padding == 0


def test_page_sizes_by_hand():
    """Llama-3.1-8B: 8 KV heads x 128 x bf16, 16 tokens, K and V: 2 x 16 x 8 x 128 x 2 = 65,536 B per layer;
    over TP 8 one head per rank: 8,192 B. DeepSeek-V3's latent (512 + 64) x 2 B x 16 = 18,432 B."""
    llama = layer_specs(MODELS["llama-3.1-8b"], block_size=16)
    assert len(llama) == 32 and llama[0].page_size_bytes == 65_536
    assert layer_specs(MODELS["llama-3.1-8b"], block_size=16, tensor_parallel=8)[0].page_size_bytes == 8_192
    mla = layer_specs(MODELS["deepseek-v3"], block_size=16)[0]
    assert isinstance(mla, MLAAttentionSpec) and mla.page_size_bytes == 18_432


def test_mamba_state_per_tensor_dtypes():
    """A Mamba2 layer (granite-4.0-h-like): conv (3, 8192 + 2 x 1 x 128) in bf16 and SSM (128, 64, 128) in
    fp32: 3 x 8,448 x 2 + 128 x 64 x 128 x 4 = 4,244,992 B."""
    config = {
        "model_type": "granitemoehybrid",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        "torch_dtype": "bfloat16",
        "layer_types": ["mamba", "attention"],
        "mamba_n_heads": 128,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_n_groups": 1,
        "mamba_expand": 2,
        "mamba_ssm_dtype": "float32",
    }
    mamba, attention = layer_specs(config, block_size=16, max_model_len=4096)
    assert isinstance(mamba, MambaSpec) and mamba.dtypes == ("bf16", "fp32")
    assert mamba.page_size_bytes == 3 * 8448 * 2 + 128 * 64 * 128 * 4 == 4_244_992
    assert mamba.block_size == 4096 and isinstance(attention, FullAttentionSpec)
    layout = kv_cache_layout(config, 1 << 30, max_model_len=4096)
    # The attention block grows to the smallest multiple of 16 whose page (16 x 2 x 8 x 128 x 2 B per 16
    # tokens = 65,536 B) holds the state: cdiv(4,244,992, 65,536) = 65 -> 1,040 tokens.
    assert layout.block_size == 1040 and layout.page_bytes == 65 * 65_536
    assert {g.kind: g.page_bytes for g in layout.groups} == {"mamba": 65 * 65_536, "full": 65 * 65_536}


def test_bad_sources_and_types_are_refused():
    with pytest.raises(InvalidArgumentError, match="kv_layers"):
        layer_specs(42, block_size=16)
    with pytest.raises(InvalidArgumentError, match="kv_dtype"):
        layer_specs(QWEN2, block_size=16, kv_dtype="int3")
    with pytest.raises(InvalidArgumentError, match="tensor_parallel=3"):
        layer_specs(QWEN2, block_size=16, tensor_parallel=3)
    for bad in ({"tensor_parallel": 0}, {"block_size": 0}, {"block_size": [16]}, {"max_model_len": -1}):
        with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
            layer_specs(QWEN2, **{"block_size": 16, **bad})
    with pytest.raises(InvalidArgumentError, match="sliding_window"):
        read_kv_layers({**QWEN2, "layer_types": ["sliding_attention"] * 4, "sliding_window": None})
    # The engine runs full and sliding layers only; the reader's other types are refused with ModelLoadError.
    with pytest.raises(ModelLoadError, match="layer_types must name one of"):
        ModelConfig.from_dict({**QWEN2, "layer_types": ["chunked_attention"] * 4, "attention_chunk_size": 4})
