"""core.serve with the real model (SmolLM2-135M-Instruct): a greedy chat completion over HTTP equals
`Engine.generate` on the same chat-template token ids offline, and its text decodes those tokens. Slow (two model
loads); skipped when the model file is not in the cache (fetch it with `python -m core.engine.fetch
smollm2-135m-instruct`)."""

import pytest

from core.engine import Engine, SamplingParams
from core.engine.fetch import cached_model
from core.serve.launcher import LoopbackServer

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.slow
def test_chat_equals_offline_greedy():
    path = cached_model(MODEL)
    if path is None:
        pytest.skip(f"{MODEL} is not in the model cache")
    engine = Engine.from_pretrained(path, num_blocks=256)
    ids = engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    (offline,) = engine.generate([ids], SamplingParams(max_tokens=24, temperature=0.0))
    del engine
    server = LoopbackServer(MODEL, num_blocks=256, events=False, startup_s=300)
    try:
        status, body = server.post(
            "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 24, "temperature": 0}
        )
        assert status == 200, body
        (choice,) = body["choices"]
        assert choice["message"]["role"] == "assistant"
        assert choice["message"]["content"] == offline.outputs[0].text
        assert body["usage"]["prompt_tokens"] == len(ids)
        assert body["usage"]["completion_tokens"] == len(offline.outputs[0].token_ids)
        assert choice["finish_reason"] == offline.outputs[0].finish_reason
    finally:
        server.stop()
