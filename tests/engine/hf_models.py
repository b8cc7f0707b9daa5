"""Tiny random transformers models saved to disk, and transformers' own decoding as the reference."""

import torch

VOCAB = 128


def llama_config(**overrides):
    from transformers import LlamaConfig

    kwargs = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "eos_token_id": None,
        "bos_token_id": None,
        "pad_token_id": None,
    }
    return LlamaConfig(**(kwargs | overrides))


def save_model(model_cls, config, path, seed: int = 0, **save_kwargs):
    """A seeded random float32 model of `model_cls` saved with save_pretrained to `path`; returns it (eval)."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # norms away from 1 and non-zero biases, so every weight matters
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path, **save_kwargs)
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy decoding of one prompt alone: (new tokens, [new tokens, vocab] logits)."""
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits).float()


def hf_beam(model, prompt: list[int], max_new_tokens: int, num_beams: int) -> list[int]:
    """transformers' best beam (length_penalty 1.0) for one prompt."""
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        num_beams=num_beams,
        length_penalty=1.0,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        early_stopping=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def prompts(lengths, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def assert_greedy_like_transformers(engine, model, batch: list[list[int]], new: int):
    """Greedy generation of `batch` through `engine` (EOS ignored) gives transformers' tokens for each prompt
    alone, with logits within 1e-4; returns the outputs."""
    from core.engine import SamplingParams

    params = SamplingParams(new, temperature=0.0, ignore_eos=True)
    outs = engine.generate(batch, params, return_logits=True)
    for prompt, out in zip(batch, outs, strict=True):
        tokens, logits = hf_greedy(model, prompt, new)
        assert out.outputs[0].token_ids == tokens
        assert torch.allclose(out.outputs[0].logits, logits, atol=1e-4, rtol=0)
    return outs
