"""Loading Llama-family directories as transformers saves them, and the typed errors for bad ones."""

import json

import pytest

from core.engine import Engine, ModelConfig, SamplingParams
from core.errors import ModelLoadError, ModelTooLargeError
from tests.engine.hf_models import (
    assert_greedy_like_transformers,
    hf_greedy,
    llama_config,
    prompts,
    save_model,
)

NEW = 8


def _same_as_transformers(path, model, lengths=(3, 11), **engine_kwargs):
    engine = Engine.from_pretrained(path, num_blocks=64, block_size=4, device="cpu", **engine_kwargs)
    assert_greedy_like_transformers(engine, model, prompts(lengths, seed=11), NEW)
    return engine


def test_sharded_checkpoint_with_llama3_rope(tmp_path):
    from transformers import LlamaForCausalLM

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    config = llama_config(rope_parameters=rope, head_dim=32, num_attention_heads=4, num_key_value_heads=1)
    model = save_model(LlamaForCausalLM, config, tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    engine = _same_as_transformers(tmp_path, model, lengths=(3, 40))  # positions past 16 use the scaled bands
    assert engine.config.rope_scaling["rope_type"] == "llama3"
    assert engine.config.head_dim * engine.config.num_heads != engine.config.hidden_size


def test_qwen2_with_qkv_bias_and_tied_embeddings(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
    )
    model = save_model(Qwen2ForCausalLM, config, tmp_path)
    engine = _same_as_transformers(tmp_path, model)
    assert engine.config.tie_word_embeddings
    assert engine.model.layers[0]["qkv_b"] is not None


def test_mistral_untied(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        sliding_window=None,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
    )
    model = save_model(MistralForCausalLM, config, tmp_path)
    _same_as_transformers(tmp_path, model)


def test_from_config_is_seeded():
    config = llama_config().to_dict()
    params = SamplingParams(6, temperature=0.0, ignore_eos=True)
    a = Engine.from_config(config, seed=5, num_blocks=32, device="cpu").generate([[1, 2, 3]], params)
    b = Engine.from_config(config, seed=5, num_blocks=32, device="cpu").generate([[1, 2, 3]], params)
    c = Engine.from_config(config, seed=6, num_blocks=32, device="cpu").generate([[1, 2, 3]], params)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids != c[0].outputs[0].token_ids


def test_num_blocks_none_sizes_the_pool_from_the_budget(monkeypatch):
    config = ModelConfig.from_dict(llama_config().to_dict())
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", str(2 * 1024**2))
    engine = Engine.from_config(config, device="cpu")
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # K+V x layers x block_size x kv_heads x head_dim x float32
    assert engine.manager.num_blocks == (2 * 1024**2 - engine.model.weight_bytes) // per_block


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("good")
    save_model(LlamaForCausalLM, llama_config(), path)
    return path


def _copy(src, dst, skip=()):
    dst.mkdir()
    for file in src.iterdir():
        if file.name not in skip:
            (dst / file.name).write_bytes(file.read_bytes())
    return dst


def test_missing_directory_and_files(tmp_path, saved):
    with pytest.raises(ModelLoadError, match="does not exist"):
        Engine.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        Engine.from_pretrained(_copy(saved, tmp_path / "a", skip=("config.json",)))
    with pytest.raises(ModelLoadError, match=r"neither model\.safetensors"):
        Engine.from_pretrained(_copy(saved, tmp_path / "b", skip=("model.safetensors",)))


def test_unsupported_architecture_and_missing_weight(tmp_path, saved):
    bad = _copy(saved, tmp_path / "gpt2")
    raw = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(
        json.dumps(raw | {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(ModelLoadError, match=r"unsupported architecture.*GPT2LMHeadModel"):
        Engine.from_pretrained(bad)
    deeper = _copy(saved, tmp_path / "deeper")
    (deeper / "config.json").write_text(json.dumps(raw | {"num_hidden_layers": 3}))
    with pytest.raises(ModelLoadError, match=r"lacks weights model\.layers\.2\."):
        Engine.from_pretrained(deeper)
    rope = _copy(saved, tmp_path / "yarn")
    (rope / "config.json").write_text(
        json.dumps(raw | {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    )
    with pytest.raises(ModelLoadError, match="'yarn' is not supported"):
        Engine.from_pretrained(rope)


def test_too_large_for_the_budget(monkeypatch, saved):
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", "10000")
    with pytest.raises(ModelTooLargeError, match="over the memory budget") as info:
        Engine.from_pretrained(saved, device="cpu")
    assert info.value.requested_bytes > info.value.allowed_bytes == 10000


def test_mistral_sliding_window_shorter_than_the_run(tmp_path):
    """A window of 6 tokens over prompts of up to 11 tokens and 8 new ones: the windowed paged kernels give
    transformers' tokens and logits (decode and chunked prefill alike)."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=6,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
    )
    model = save_model(MistralForCausalLM, config, tmp_path)
    full = MistralForCausalLM(MistralConfig(**(config.to_dict() | {"sliding_window": None}))).eval()
    full.load_state_dict(model.state_dict())
    prompt = prompts((11,), seed=11)[0]
    assert (
        hf_greedy(full, prompt, NEW)[0] != hf_greedy(model, prompt, NEW)[0]
    )  # the window changes the output
    engine = _same_as_transformers(tmp_path, model, lengths=(3, 11), max_num_batched_tokens=256)
    assert engine.config.sliding_window == 6
    chunked = _same_as_transformers(
        tmp_path, model, lengths=(3, 11), max_num_seqs=2, max_num_batched_tokens=4
    )
    assert chunked.last_run.steps["prefill_tokens"].max() <= 4


def test_mistral_window_frees_blocks_behind_it(tmp_path):
    """Window 6, blocks of 4: a sequence needs only the blocks holding its last 6 positions, at most
    ceil(6 / 4) + 1 = 3, however long it grows; full attention would hold ceil(51 / 4) = 13 for 11 + 40 tokens.
    The tokens still equal transformers' windowed model."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=6,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
    )
    model = save_model(MistralForCausalLM, config, tmp_path)
    prompt = prompts((11,), seed=5)[0]
    engine = Engine.from_pretrained(tmp_path, num_blocks=32, block_size=4, device="cpu")
    out = engine.generate([prompt], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))[0]
    assert list(out.outputs[0].token_ids) == hf_greedy(model, prompt, 40)[0]
    peak = int(engine.last_run.steps["blocks_in_use"].max())
    assert peak <= 3 < 13, peak
