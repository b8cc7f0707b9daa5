"""GGUF files: a tiny Llama written as llama.cpp's converter writes it loads into the engine and decodes as
transformers does from the original weights; other architectures and oversized models are refused."""

import numpy as np
import pytest
import torch

from core.engine import Engine, SamplingParams
from core.engine.gguf_file import gguf_config, gguf_weights, hf_name
from core.errors import ModelLoadError, ModelTooLargeError
from tests.engine.hf_models import hf_greedy, llama_config, prompts

NEW = 8


def _llama_cpp_permute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `permute`: per head, interleave the two rotary halves of the rows."""
    return (
        rows.reshape(num_heads, 2, rows.shape[0] // num_heads // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def _write_gguf(model, path, arch: str = "llama", tied: bool = False, fp16_matrices: bool = False):
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    inverse = {}
    for i in range(config.num_hidden_layers):
        for short in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output"):
            inverse[hf_name(f"blk.{i}.{short}.weight")] = f"blk.{i}.{short}.weight"
        for short in ("ffn_gate", "ffn_up", "ffn_down"):
            inverse[hf_name(f"blk.{i}.{short}.weight")] = f"blk.{i}.{short}.weight"
    inverse |= {hf_name(n): n for n in ("token_embd.weight", "output_norm.weight", "output.weight")}
    for name, param in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        array = param.detach().float().numpy().copy()
        if ".q_proj." in name:
            array = _llama_cpp_permute(array, config.num_attention_heads)
        elif ".k_proj." in name:
            array = _llama_cpp_permute(array, config.num_key_value_heads)
        if fp16_matrices and array.ndim == 2:
            array = array.astype(np.float16)
        writer.add_tensor(inverse[name], array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _model(seed=0, **overrides):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(**overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_a_float32_gguf_decodes_as_transformers_does(tmp_path, tied):
    model = _model(tie_word_embeddings=tied, num_attention_heads=4, num_key_value_heads=2)
    path = _write_gguf(model, tmp_path / "tiny.gguf", tied=tied)
    engine = Engine.from_pretrained(path, num_blocks=64, block_size=4, device="cpu")
    assert engine.tokenizer is None and engine.config.tie_word_embeddings is tied
    batch = prompts((3, 13), seed=5)
    outs = engine.generate(batch, SamplingParams(NEW, temperature=0.0, ignore_eos=True), return_logits=True)
    for prompt, out in zip(batch, outs, strict=True):
        tokens, logits = hf_greedy(model, prompt, NEW)
        assert out.outputs[0].token_ids == tokens
        assert torch.allclose(out.outputs[0].logits, logits, atol=1e-4, rtol=0)


def test_float16_tensors_are_cast_to_the_engine_dtype(tmp_path):
    model = _model(seed=1)
    path = _write_gguf(model, tmp_path / "half.gguf", fp16_matrices=True)
    config = gguf_config(path)
    weights = gguf_weights(path, config, torch.bfloat16, torch.device("cpu"), 1 << 30)
    expected = model.model.layers[0].self_attn.k_proj.weight.detach().half().to(torch.bfloat16)
    assert weights["model.layers.0.self_attn.k_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(weights["model.layers.0.self_attn.k_proj.weight"], expected)  # un-permuted, cast


def test_another_architecture_is_refused(tmp_path):
    path = _write_gguf(_model(), tmp_path / "other.gguf", arch="qwen2")
    with pytest.raises(ModelLoadError, match="only Llama-architecture GGUF"):
        gguf_config(path)


def test_weights_over_the_budget_are_refused_before_dequantizing(tmp_path, monkeypatch):
    path = _write_gguf(_model(), tmp_path / "tiny.gguf")
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", "1000")
    with pytest.raises(ModelTooLargeError, match="PAGED_LAB_MAX_BYTES"):
        Engine.from_pretrained(path, num_blocks=4, device="cpu")


def test_a_missing_or_broken_file_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        Engine.from_pretrained(tmp_path / "none.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF but not really")
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        Engine.from_pretrained(tmp_path / "bad.gguf")
