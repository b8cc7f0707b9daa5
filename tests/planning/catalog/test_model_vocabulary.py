"""One model vocabulary: the engine's `ModelConfig` and the planner's `ModelSpec` read the facts they share with one
function (`core.kv.model_shape.read_model_shape`) and agree on every one of them (`.shape`), for the shipped real
model (its GGUF header beside its published config.json) and for synthetic Hugging Face configs with GQA, an
explicit head size, sliding windows on every layer or on some, and no tie_word_embeddings key. Each expected
shape is written out by hand from the config it comes from, and an engine model planned by the planner
(`ModelSpec.from_model_config`) counts exactly the parameters the engine loads."""

import math

import pytest

from core.engine.config import TINY_LLAMA, ModelConfig
from core.engine.weights import expected_shapes
from core.kv.hf_config import FULL, SLIDING
from core.kv.model_shape import ModelShape, read_model_shape
from core.planning.catalog.models import ModelSpec
from tests.real_model import real_model_path

# SmolLM2-135M-Instruct's published config.json (the fields both views read).
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rope_theta": 100000,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "bfloat16",
}
SMOLLM2_SHAPE = ModelShape(30, 9, 3, 64, 576, 1536, 49152, 8192, True, (FULL,) * 30)
# Embedding 49,152 x 576; per layer q and o 576 x 576, k and v 192 x 576, gate/up/down 3 x 1,536 x 576, two
# norms of 576; the final norm; the LM head tied: 28,311,552 + 30 x 3,540,096 + 576 = 134,515,008 (~134.5M).
SMOLLM2_PARAMS = 134_515_008

GQA = {  # an explicit head_dim (32 x 128 = 4,096 != hidden 3,072), 4 KV heads; no tie key: Llama's default
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 3,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 4096,
}
MISTRAL = {  # every layer slides; no max_position_embeddings: the 2,048 both assume
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "sliding_window": 24,
    "tie_word_embeddings": False,
}
QWEN2 = {  # layers >= max_window_layers slide, only because use_sliding_window is set
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "sliding_window": 16,
    "use_sliding_window": True,
    "max_window_layers": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}
CASES = {
    "tiny": (TINY_LLAMA, ModelShape(2, 4, 2, 16, 64, 176, 512, 512, False, (FULL,) * 2)),
    "gqa": (GQA, ModelShape(3, 32, 4, 128, 3072, 8192, 1000, 4096, False, (FULL,) * 3)),
    "mistral": (MISTRAL, ModelShape(2, 4, 1, 16, 64, 128, 320, 2048, False, (SLIDING,) * 2, 24)),
    "qwen2": (QWEN2, ModelShape(4, 4, 2, 16, 64, 96, 256, 256, True, (FULL, FULL, SLIDING, SLIDING), 16)),
    "smollm2": (SMOLLM2_CONFIG, SMOLLM2_SHAPE),
}


def _engine_params(config: ModelConfig) -> int:
    """Every weight the engine loads, biases included (Qwen2's q/k/v)."""
    weights = sum(math.prod(s) for s in expected_shapes(config).values())
    bias = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim * config.num_layers
    return weights + (bias if config.attention_bias else 0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_views_of_a_config_agree_on_every_shared_fact(name):
    raw, expected = CASES[name]
    engine = ModelConfig.from_dict(raw)
    planner = ModelSpec.from_hf_config(raw)
    assert read_model_shape(raw) == engine.shape == planner.shape == expected
    planned = ModelSpec.from_model_config(engine)
    assert planned.shape == expected and planned.name == raw["architectures"][0]
    assert ModelConfig.from_dict(engine.to_hf_config()) == engine  # the engine's config round-trips
    assert planned.num_params == _engine_params(engine)  # the planner counts what the engine loads
    assert planner.kv_layers.sliding_windows == engine.kv_layers.sliding_windows


def test_the_shipped_real_model_agrees_with_its_published_config():
    from core.engine.gguf_file import gguf_config

    engine = gguf_config(real_model_path())  # skips when the model cannot be fetched here
    assert engine.shape == SMOLLM2_SHAPE == ModelSpec.from_hf_config(SMOLLM2_CONFIG).shape
    planned = ModelSpec.from_model_config(engine, name="smollm2")
    assert planned.shape == SMOLLM2_SHAPE and planned.num_params == _engine_params(engine) == SMOLLM2_PARAMS


def test_tie_word_embeddings_defaults_like_the_family():
    """Without the key, a Llama/Mistral/Qwen2 config is untied (transformers' LlamaConfig etc.), so both views
    count an LM head; a family without such a default (OPT) takes PretrainedConfig's tied."""
    untied = {k: v for k, v in QWEN2.items() if k != "tie_word_embeddings"}
    assert not ModelConfig.from_dict(untied).tie_word_embeddings
    spec = ModelSpec.from_hf_config(untied)
    assert not spec.tie_word_embeddings and spec.lm_head_params == 256 * 64
    opt = {
        "model_type": "opt",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "ffn_dim": 256,
        "vocab_size": 100,
    }
    tied = ModelSpec.from_hf_config(opt)
    assert tied.tie_word_embeddings and tied.lm_head_params == 0
