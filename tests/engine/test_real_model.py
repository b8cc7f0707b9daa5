"""SmolLM2-135M-Instruct (the fetched GGUF, float32) through the paged engine against transformers loading the
same file: greedy chat answers equal up to EOS, beam width 2 equals transformers' best beam, seeded samples are
reproducible and distinct, and the model knows the capital of France.

transformers' reference decodes each conversation alone (no padding); the engine runs them batched through the
paged cache. transformers stops at EOS (its generation config's eos_token_id 2, `<|im_end|>`); so does the engine.
"""

import pytest
import torch

from core.engine import Engine, SamplingParams
from tests.real_model import real_model_path

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Write a haiku about the sea.",
]
MAX_TOKENS = 32


def _conversation(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def models():
    """(engine, transformers model, transformers tokenizer), loaded once for the module (~30 s on 2 cores)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = real_model_path()
    engine = Engine.from_pretrained(path, num_blocks=256, block_size=16, device="cpu", dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return engine, model.eval(), tokenizer


def _hf_ids(tokenizer, question: str) -> list[int]:
    encoded = tokenizer.apply_chat_template(_conversation(question), add_generation_prompt=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def _hf_generate(model, prompt: list[int], max_new_tokens: int = MAX_TOKENS, **kwargs) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            **kwargs,
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_chat_answers_equal_transformers_up_to_eos(models):
    engine, model, tokenizer = models
    with torch.inference_mode():
        outs = engine.chat([_conversation(q) for q in QUESTIONS], SamplingParams(MAX_TOKENS, temperature=0.0))
    for question, out in zip(QUESTIONS, outs, strict=True):
        prompt = _hf_ids(tokenizer, question)
        assert out.prompt_token_ids == prompt  # the same chat template, the same tokens
        expected = _hf_generate(model, prompt, do_sample=False)
        answer = out.outputs[0]
        assert answer.token_ids == expected, question
        assert answer.text == tokenizer.decode(expected, skip_special_tokens=True)
        assert answer.finish_reason == ("stop" if expected[-1] == tokenizer.eos_token_id else "length")
    assert "Paris" in outs[0].outputs[0].text
    assert outs[0].outputs[0].finish_reason == "stop"  # a short answer that ends at <|im_end|>


def test_beam_width_two_equals_transformers_best_beam(models):
    engine, model, tokenizer = models
    question = QUESTIONS[2]
    with torch.inference_mode():
        out = engine.chat(_conversation(question), SamplingParams(16, beam_width=2))[0]
    expected = _hf_generate(
        model,
        _hf_ids(tokenizer, question),
        do_sample=False,
        num_beams=2,
        length_penalty=1.0,
        early_stopping=False,
        max_new_tokens=16,
    )
    assert out.outputs[0].token_ids == expected


def test_seeded_samples_are_reproducible_and_distinct(models):
    engine = models[0]
    params = SamplingParams(8, temperature=1.0, n=4, seed=7)
    with torch.inference_mode():
        first = engine.chat(_conversation(QUESTIONS[1]), params)[0].outputs
        again = engine.chat(_conversation(QUESTIONS[1]), params)[0].outputs
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert len({tuple(o.token_ids) for o in first}) == 4
    assert all(o.text for o in first)


def test_the_hugging_face_export_is_the_model_transformers_reads_from_the_gguf(models, tmp_path):
    """`python -m core.engine.fetch ... --hf DIR` (what vLLM serves): transformers loading the folder gives the
    logits transformers gives loading the GGUF itself, and the same tokenizer and chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.engine.fetch import main as fetch_main

    _, reference, reference_tokenizer = models
    folder = tmp_path / "smollm2-hf"
    assert fetch_main(["smollm2-135m-instruct", "--hf", str(folder)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompt = _hf_ids(reference_tokenizer, QUESTIONS[0])
    assert _hf_ids(tokenizer, QUESTIONS[0]) == prompt
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        torch.testing.assert_close(exported(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert fetch_main(["smollm2-135m-instruct", "--hf", str(folder)]) == 0  # found, not written again
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
