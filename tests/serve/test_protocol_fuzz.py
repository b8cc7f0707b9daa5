"""Property: for ANY JSON value as a body, the completions and chat parsers either refuse it with a RequestError
(an OpenAI 400/404, naming a field when one is to blame) or return a request every part of which the engine
accepts: token ids inside the vocabulary, prompt + max_tokens within the context, and `add_request` raising at
most InvalidArgumentError (the pool is too small: a 400). Nothing else may escape (it would be a 500). With the
real model's tokenizer and chat template (tests/serve/conftest.py); bounded for CI: a few hundred examples."""

import itertools

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from core.errors import InvalidArgumentError, RequestError
from core.serve.protocol import chat_request, completion_request

# Strings of any code point, lone surrogates and control characters included (JSON can carry them all).
TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
TOKEN_IDS = st.lists(st.integers(min_value=-2, max_value=49_160) | JSON, max_size=12)
FIELD_VALUES = {
    "model": st.just("smollm2-135m-instruct") | JSON,
    "prompt": TEXT | TOKEN_IDS | st.lists(TEXT | TOKEN_IDS, max_size=3) | JSON,
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant"]) | JSON, "content": TEXT | JSON}
        )
        | JSON,
        max_size=3,
    )
    | JSON,
    "max_tokens": st.integers(min_value=-2, max_value=10_000) | JSON,
    "max_completion_tokens": st.integers(min_value=-2, max_value=10_000) | JSON,
    "temperature": st.floats() | st.integers() | JSON,
    "top_p": st.floats() | JSON,
    "top_k": st.integers(min_value=-3, max_value=60_000) | JSON,
    "n": st.integers(min_value=-1, max_value=10) | JSON,
    "best_of": st.integers(min_value=0, max_value=3) | JSON,
    "seed": st.integers() | JSON,
    "stop": st.just([]) | JSON,
    "stop_token_ids": TOKEN_IDS | JSON,
    "ignore_eos": st.booleans() | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | JSON}) | JSON,
    "return_token_ids": st.booleans() | JSON,
    "logprobs": st.just(0) | JSON,
    "echo": st.just(False) | JSON,
}
PLAIN = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=("Cs", "Cc")),
    min_size=1,
    max_size=30,
)
VALID = {
    "prompt": PLAIN | st.lists(st.integers(0, 49_151), min_size=1, max_size=20),
    "messages": st.lists(
        st.fixed_dictionaries({"role": st.just("user"), "content": PLAIN}), min_size=1, max_size=2
    ),
    "max_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 100),
    "n": st.integers(1, 3),
    "seed": st.integers(0, 2**63 - 1),
    "stop": st.just([]),
    "stop_token_ids": st.lists(st.integers(0, 49_151), max_size=3),
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "return_token_ids": st.booleans(),
}


@st.composite
def near_valid(draw, main: str):
    """A valid body (`main` is "prompt" or "messages") with a few valid options, then up to two fields replaced
    by hostile values: most examples reach the engine, the rest are refused one field at a time."""
    body = {main: draw(VALID[main]), "max_tokens": draw(VALID["max_tokens"])}
    options = [k for k in VALID if k not in ("prompt", "messages", "max_tokens")]
    for key in draw(st.lists(st.sampled_from(options), max_size=4, unique=True)):
        body[key] = draw(VALID[key])
    for key in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=2, unique=True)):
        body[key] = draw(FIELD_VALUES[key])
    return body


IDS = itertools.count()
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(parse, body, server) -> None:
    facts = server.served.facts
    try:
        req = parse(body, facts)
    except RequestError as err:
        assert err.status in (400, 404) and str(err)
        assert err.param is None or isinstance(err.param, str)
        event(f"refused: {(err.param or 'body').split('[')[0]}")
        return
    event("accepted")
    assert req.model == facts.name and 1 <= len(req.prompts) <= 64
    for ids in req.prompts:
        assert ids and all(type(t) is int and 0 <= t < facts.vocab_size for t in ids)
        assert len(ids) + req.params.max_tokens <= facts.max_model_len
    assert 1 <= req.params.n <= facts.max_num_seqs
    assert all(0 <= t < facts.vocab_size for t in req.params.stop_token_ids)
    engine = server.engine
    for ids in req.prompts:  # the engine takes it (or refuses it as too large for the pool), then lets it go
        rid = f"fuzz-{next(IDS)}"
        try:
            engine.add_request(ids, req.params, rid, stream=True)
        except InvalidArgumentError:
            continue
        engine.abort_request(rid)


@FUZZ
@given(body=JSON)
def test_completions_any_json_value(real_server, body):
    _check(completion_request, body, real_server)


@FUZZ
@given(body=near_valid("prompt"))
def test_completions_near_valid_bodies(real_server, body):
    _check(completion_request, body, real_server)


@FUZZ
@given(body=JSON)
def test_chat_any_json_value(real_server, body):
    _check(chat_request, body, real_server)


@FUZZ
@given(body=near_valid("messages"))
def test_chat_near_valid_bodies(real_server, body):
    _check(chat_request, body, real_server)


def test_the_server_is_idle_after_the_fuzz(real_server):
    assert real_server.wait_idle(30)
    assert real_server.engine.manager.request_ids() == []
