"""A request's token ids are checked once, at the edge where they enter: the server's parser checks them (an
OpenAI 400 naming the id) and the engine takes them as they are; a Python caller of the engine gets the same
check there, as a typed error. The one validator (`core.engine.token_ids.check_token_ids`) is spied on wherever
a module of core holds it, so a second call anywhere on the path (the engine's request intake, the KV core's own
guard) shows up in the count."""

import sys

import numpy as np
import pytest

import core.engine.token_ids as token_ids
import core.kv.request as kv_request
from core.engine import Engine, SamplingParams
from core.engine.config import TINY_LLAMA
from core.engine.token_ids import CheckedTokenIds, check_token_ids
from core.errors import InvalidArgumentError, TokenIdsError
from tests.serve.inproc import InProcessServer

VOCAB = TINY_LLAMA["vocab_size"]  # 512


def _spy(monkeypatch, module, name: str) -> list[str]:
    """Replace `module.name` wherever a loaded module of core holds it (under any name); the params of every
    call, in order."""
    real = getattr(module, name)
    calls: list[str] = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("param", args[0] if module is kv_request else "prompt"))
        return real(*args, **kwargs)

    holders = [
        (m, attr)
        for n, m in list(sys.modules.items())
        if n.startswith("core.")
        for attr, value in list(vars(m).items())
        if value is real
    ]
    assert (module, name) in holders
    for holder, attr in holders:
        monkeypatch.setattr(holder, attr, spy)
    return calls


@pytest.fixture(scope="module")
def server():
    s = InProcessServer("tiny", num_blocks=64)
    yield s
    s.stop()


@pytest.fixture
def calls(monkeypatch):
    """(the one validator's calls, the KV core guard's calls) from now on."""
    return _spy(monkeypatch, token_ids, "check_token_ids"), _spy(
        monkeypatch, kv_request, "check_kv_token_ids"
    )


def test_a_server_request_checks_each_id_list_once(server, calls):
    checked, kv_checked = calls
    body = {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3, "n": 2, "stop_token_ids": [7], "ignore_eos": True}
    body["temperature"] = 0.0  # greedy: a random sample may draw the stop id (7) and end a sequence early
    status, answer = server.post("/v1/completions", body)
    assert status == 200, answer
    assert [len(c["token_ids"]) for c in answer["choices"]] == [3, 3, 3, 3]  # it ran, to every sequence's end
    assert server.wait_idle()
    assert checked == ["prompt[0]", "prompt[1]", "stop_token_ids"]  # the parser's calls; the engine made none
    assert kv_checked == []


def test_a_bad_id_is_an_openai_400_naming_it_checked_once(server, calls):
    checked, _ = calls
    status, answer = server.post("/v1/completions", {"prompt": [[1, 2], [3, VOCAB, 4]], "max_tokens": 2})
    assert status == 400
    assert answer["error"]["param"] == "prompt[1][1]"
    assert answer["error"]["message"] == "prompt[1][1] is 512, outside the vocabulary (token ids 0 to 511)"
    assert checked == ["prompt[0]", "prompt[1]"]
    assert not server.engine.has_unfinished_requests()  # nothing was queued


@pytest.fixture(scope="module")
def engine():
    return Engine.from_config(TINY_LLAMA, num_blocks=32, device="cpu")


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([1, VOCAB], r"prompt\[1\] is 512, outside the vocabulary \(token ids 0 to 511\)"),
        ([3, -1], r"prompt\[1\] is -1, outside the vocabulary"),
        ([1, 2.0], r"prompt\[1\] must be an integer token id, got a number"),
        ([True], r"prompt\[0\] must be an integer token id, got a boolean"),
        ([], "prompt needs at least one token"),
        (7, "prompt must be an array of token ids, got an integer"),
        ({"ids": [1]}, "prompt must be an array of token ids, got an object"),
        (CheckedTokenIds([600], 1_000), r"prompt\[0\] is 600, outside the vocabulary"),  # another vocabulary
    ],
)
def test_the_library_edge_still_rejects_bad_ids(engine, calls, prompt, message):
    checked, _ = calls
    with pytest.raises(TokenIdsError, match=message) as info:
        engine.add_request(prompt, SamplingParams(max_tokens=2))
    assert isinstance(info.value, InvalidArgumentError)
    with pytest.raises(TokenIdsError, match=message):
        engine.generate([[1, 2], prompt], SamplingParams(max_tokens=2))
    assert checked == ["prompt", "prompt", "prompt"]  # add_request's, then generate's two prompts
    assert not engine.has_unfinished_requests() and engine.manager.request_ids() == []


def test_the_library_edge_checks_once_and_trusts_its_own_vocabulary(engine, calls):
    checked, kv_checked = calls
    params = SamplingParams(max_tokens=2, temperature=0.0)
    plain = engine.generate([[5, 6, 7], np.array([5, 6, 7])], params)
    assert checked == ["prompt", "prompt"] and kv_checked == []
    trusted = engine.generate(check_token_ids([5, 6, 7], VOCAB), params)  # checked here, outside the spy
    assert checked == ["prompt", "prompt"]  # the engine took it as it is
    assert plain[0].outputs[0].token_ids == plain[1].outputs[0].token_ids == trusted[0].outputs[0].token_ids
    assert plain[1].prompt_token_ids == [5, 6, 7] and all(type(t) is int for t in plain[1].prompt_token_ids)


def test_checked_ids_pickle_with_their_vocabulary():
    import pickle

    ids = check_token_ids(np.array([0, VOCAB - 1]), VOCAB)
    copy = pickle.loads(pickle.dumps(ids))
    assert copy == (0, VOCAB - 1) and copy.vocab_size == VOCAB and type(copy) is CheckedTokenIds
