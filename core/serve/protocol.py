"""The OpenAI-compatible requests of `core.serve`, in vLLM's shapes: the one place every request field is checked.

`completion_request` / `chat_request` take a parsed JSON body (any JSON value) and return what the engine needs,
prompts already turned into token ids; every bad field raises `RequestError` naming it (`param`, e.g. "prompt",
"messages[2].content", "stop_token_ids[0]"), which the server answers as an OpenAI-style 400 (404 for another
model's name), never a 500. Nothing that reaches the tokenizer or the engine is unchecked:
- text (prompts, message roles and contents, the model name) is valid Unicode (no lone surrogates), holds no
  control character but tab, newline and carriage return, and is at most MAX_TEXT_CHARS long;
- token ids (prompts, the tokenizer's and the chat template's ids too, stop_token_ids) are integers in
  [0, vocab_size), by the engine's one rule (`core.engine.token_ids.check_token_ids`), checked here once: the
  prompts go to the engine as `CheckedTokenIds`, which it does not check again; lists are bounded (MAX_PROMPTS
  prompts, max_model_len prompt tokens, MAX_MESSAGES messages, MAX_STOP_TOKEN_IDS stop ids);
- every number has its JSON type (an integer field refuses 1.5 and true) and its range: max_tokens >= 1 and,
  with the prompt, within max_model_len (vLLM's rule); n from 1 to max_num_seqs; temperature >= 0; top_p in
  (0, 1]; top_k -1 or >= 0; seed in [0, 2^63); nested objects only where an object is expected.
Fields vLLM accepts that this engine does not implement (stop strings, logprobs, echo, suffix, best_of > n) are
refused by name rather than silently ignored; unknown fields are ignored, as vLLM does.
"""

import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from core.common import JSON_TYPE_NAMES, json_type_name
from core.engine import SamplingParams
from core.engine.token_ids import CheckedTokenIds
from core.engine.token_ids import check_token_ids as check_ids
from core.errors import InvalidArgumentError, RequestError, TokenIdsError

MAX_PROMPTS = 64  # prompts in one completions request
MAX_MESSAGES = 1_024
MAX_TEXT_CHARS = 1_000_000  # one text field, before the tokenizer sees it (~1 s of tokenizing at most)
MAX_STOP_TOKEN_IDS = 64
MAX_SEED = 2**63 - 1
MAX_ROLE_CHARS = 64
DEFAULT_COMPLETION_TOKENS = 16  # vLLM's and OpenAI's default for /v1/completions
MAX_DEFAULT_CHAT_TOKENS = 512  # chat without max_tokens: the rest of the context, at most this many
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_UNSUPPORTED = (("stop", ([], "")), ("logprobs", (False, 0)), ("echo", (False,)), ("suffix", ("",)))


@dataclass(frozen=True)
class ModelFacts:
    """What request checks need to know of the served model: its name, vocabulary size, context length
    (`max_model_len`, prompt + output tokens), sequences per request (`max_num_seqs`) and tokenizer (None: a
    model without one takes token ids only)."""

    name: str
    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    tokenizer: Any = None


@dataclass
class ParsedRequest:
    prompts: list[CheckedTokenIds]  # token ids of each prompt, checked against the vocabulary and the context
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str
    chat: bool = False
    return_token_ids: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def check_text(value: object, param: str, *, max_chars: int = MAX_TEXT_CHARS) -> str:
    """`value` when it is a string of valid Unicode without control characters (tab, newline, carriage return
    allowed) and at most `max_chars` long; else RequestError naming `param`."""
    if not isinstance(value, str):
        raise RequestError(f"{param} must be a string, got {json_type_name(value)}", param)
    if len(value) > max_chars:
        raise RequestError(
            f"{param} is {len(value):,} characters long; at most {max_chars:,} are allowed", param
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(
            f"{param} is not valid Unicode: a lone surrogate (U+{ord(value[err.start]):04X}) at character "
            f"{err.start:,}; send text as UTF-8 or as a JSON string without unpaired \\ud800-\\udfff escapes",
            param,
        ) from None
    bad = _CONTROL.search(value)
    if bad:
        raise RequestError(
            f"{param} holds the control character U+{ord(bad.group()):04X} at character {bad.start():,}; only tab, "
            "newline and carriage return are allowed",
            param,
        )
    return value


def _optional(body: dict, name: str, kind: type, default=None):
    """body[name] when present and not null, of JSON type `kind` (int never accepts a boolean; float accepts an
    integer); `default` otherwise."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise RequestError(f"{name} must be {JSON_TYPE_NAMES[kind]}, got {json_type_name(value)}", name)
    return value


def _int(body: dict, name: str, default: int | None, minimum: int, maximum: int | None = None) -> int | None:
    value = _optional(body, name, int, default)
    if value is not None and (value < minimum or (maximum is not None and value > maximum)):
        allowed = f"from {minimum:,} to {maximum:,}" if maximum is not None else f"at least {minimum:,}"
        shown = f"{value:,}" if abs(value) < 10**30 else "a larger number"
        raise RequestError(f"{name} must be {allowed}, got {shown}", name)
    return value


def _number(
    body: dict,
    name: str,
    default: float,
    minimum: float,
    maximum: float | None = None,
    *,
    exclusive_minimum: bool = False,
) -> float:
    value = _optional(body, name, float, default)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    low_ok = number > minimum if exclusive_minimum else number >= minimum
    if not math.isfinite(number) or not low_ok or (maximum is not None and number > maximum):
        bound = f"greater than {minimum:g}" if exclusive_minimum else f"at least {minimum:g}"
        upper = f" and at most {maximum:g}" if maximum is not None else ""
        raise RequestError(f"{name} must be a finite number {bound}{upper}, got {value!r:.40}", name)
    return number


def check_token_ids(
    value: object, param: str, model: ModelFacts, *, max_len: int | None, allow_empty: bool = False
) -> CheckedTokenIds:
    """`value` checked by the engine's one rule (`core.engine.token_ids.check_token_ids`: integers in
    [0, vocab_size), at most `max_len`, at least one unless `allow_empty`), as a RequestError naming `param` or the
    bad id (`param[i]`). The engine takes the result without checking it again."""
    try:
        return check_ids(value, model.vocab_size, param=param, max_len=max_len, allow_empty=allow_empty)
    except TokenIdsError as err:
        raise RequestError(str(err), err.param) from None


def _check_body(body: Any, model: ModelFacts) -> dict:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {json_type_name(body)}")
    given = body.get("model")
    name = model.name if given is None else check_text(given, "model", max_chars=1_000)
    if name != model.name:
        raise RequestError(
            f"The model `{_shown(name)[1:-1]}` does not exist; this server serves `{model.name}`.",
            "model",
            404,
        )
    for key, allowed in _UNSUPPORTED:
        value = body.get(key)
        if value is not None and not any(value == a and type(value) is type(a) for a in allowed):
            raise RequestError(f"{key} is not supported by this server (use stop_token_ids for stops)", key)
    return body


def _encode(model: ModelFacts, text: str, param: str) -> list[int]:
    """The tokenizer's ids for checked `text`; a RequestError (never a 500) when it has none or fails."""
    if model.tokenizer is None:
        raise RequestError("this model has no tokenizer: give prompts as arrays of token ids", param)
    try:
        ids = list(model.tokenizer(text)["input_ids"])
    except Exception as err:  # text already checked: a tokenizer failure is still the request's, not ours
        raise RequestError(f"{param} cannot be tokenized ({type(err).__name__})", param) from None
    if not ids:
        raise RequestError(f"{param} has no tokens", param)
    return ids


def _prompt_ids(model: ModelFacts, prompt: object, param: str) -> CheckedTokenIds:
    """A prompt's ids, checked once (the tokenizer's too): the engine takes them as they are."""
    max_len = model.max_model_len  # ids sent: bounded before they are read; a text's: by the context below
    if isinstance(prompt, str):
        prompt, max_len = _encode(model, check_text(prompt, param), param), None
    ids = check_token_ids(prompt, param, model, max_len=max_len)
    if len(ids) >= model.max_model_len:
        raise RequestError(
            f"{param} has {len(ids):,} tokens; this model's maximum context length is {model.max_model_len:,} "
            "tokens, prompt and output together",
            param,
        )
    return ids


def _sampling(
    body: dict,
    model: ModelFacts,
    prompts: list[list[int]],
    max_tokens: int | None,
    default_tokens: int,
    tokens_name: str,
) -> tuple[SamplingParams, bool, bool]:
    n = _int(body, "n", 1, 1, model.max_num_seqs)
    if _int(body, "best_of", n, 1) != n:
        raise RequestError("best_of must equal n on this server", "best_of")
    longest = max(len(p) for p in prompts)
    tokens = default_tokens if max_tokens is None else max_tokens
    if longest + tokens > model.max_model_len:
        raise RequestError(
            f"{tokens_name} is too large: {tokens:,}. This model's maximum context length is {model.max_model_len:,} "
            f"tokens and the prompt has {longest:,}; ask for at most {model.max_model_len - longest:,}",
            tokens_name,
        )
    stop = body.get("stop_token_ids")
    stop_ids = (
        []
        if stop is None
        else check_token_ids(stop, "stop_token_ids", model, max_len=MAX_STOP_TOKEN_IDS, allow_empty=True)
    )
    top_k = _int(body, "top_k", 0, -1)
    options = _optional(body, "stream_options", dict, {})
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise RequestError(
            f"stream_options.include_usage must be a boolean, got {json_type_name(usage)}",
            "stream_options.include_usage",
        )
    fields = {
        "temperature": _number(body, "temperature", 1.0, 0.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, exclusive_minimum=True),
        "seed": _int(body, "seed", None, 0, MAX_SEED),
        "ignore_eos": _optional(body, "ignore_eos", bool, False),
    }
    try:
        params = SamplingParams(
            max_tokens=tokens,
            top_k=0 if top_k == -1 else top_k,
            n=n,
            stop_token_ids=tuple(stop_ids),
            **fields,
        )
    except InvalidArgumentError as err:  # every field was checked above: a rule of SamplingParams' own
        raise RequestError(str(err)) from None
    return params, _optional(body, "stream", bool, False), bool(usage)


def completion_request(body: Any, model: ModelFacts) -> ParsedRequest:
    """/v1/completions: `prompt` as text, token ids, or a non-empty array of either (a batch)."""
    body = _check_body(body, model)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise RequestError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompt):,}", "prompt")
        prompts = [_prompt_ids(model, p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    elif isinstance(prompt, str | list):
        prompts = [_prompt_ids(model, prompt, "prompt")]
    else:
        raise RequestError(
            f"prompt must be a string, an array of token ids, or a non-empty array of either, got "
            f"{json_type_name(prompt)}",
            "prompt",
        )
    max_tokens = _int(body, "max_tokens", None, 1)
    params, stream, usage = _sampling(
        body, model, prompts, max_tokens, DEFAULT_COMPLETION_TOKENS, "max_tokens"
    )
    with_ids = _optional(body, "return_token_ids", bool, False)
    return ParsedRequest(prompts, params, stream, usage, model.name, return_token_ids=with_ids)


def chat_request(body: Any, model: ModelFacts) -> ParsedRequest:
    """/v1/chat/completions: `messages` rendered with the model's chat template into one prompt of token ids."""
    body = _check_body(body, model)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(
            f"messages must be a non-empty array of {{role, content}} objects, got {json_type_name(messages)}",
            "messages",
        )
    if len(messages) > MAX_MESSAGES:
        raise RequestError(
            f"at most {MAX_MESSAGES:,} messages per request, got {len(messages):,}", "messages"
        )
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object, got {json_type_name(m)}", f"messages[{i}]")
        role = check_text(m.get("role"), f"messages[{i}].role", max_chars=MAX_ROLE_CHARS)
        turns.append({"role": role, "content": check_text(m.get("content"), f"messages[{i}].content")})
    if sum(len(t["content"]) for t in turns) > MAX_TEXT_CHARS:
        raise RequestError(f"the messages hold more than {MAX_TEXT_CHARS:,} characters in all", "messages")
    tokenizer = model.tokenizer
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise RequestError("this model has no chat template: use /v1/completions with token ids", "messages")
    try:
        rendered = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        if hasattr(rendered, "keys"):  # transformers 5 returns a BatchEncoding
            rendered = rendered["input_ids"]
        ids = list(rendered[0] if rendered and isinstance(rendered[0], list) else rendered)
    except Exception as err:  # the template refused these turns (e.g. roles out of order)
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__  # the template's words
        raise RequestError(f"the chat template cannot render these messages: {reason}", "messages") from None
    ids = _prompt_ids(model, ids, "messages")
    max_tokens = _int(body, "max_completion_tokens", None, 1)
    name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = _int(body, "max_tokens", None, 1), "max_tokens"
    default = max(1, min(MAX_DEFAULT_CHAT_TOKENS, model.max_model_len - len(ids)))
    params, stream, usage = _sampling(body, model, [ids], max_tokens, default, name)
    return ParsedRequest([ids], params, stream, usage, model.name, chat=True)


def tokenize_response(body: Any, model: ModelFacts) -> dict:
    """POST /tokenize in vLLM's shape: {"model"?, "prompt": text, "add_special_tokens"?: true} ->
    {"count", "max_model_len", "tokens", "token_strs"} (token_strs with "return_token_strs": true, else null).
    The ids are exactly those a completion of the same prompt gets. vLLM's chat form ("messages") is refused
    by name. Raises RequestError."""
    body = _check_body(body, model)
    if body.get("messages") is not None:
        raise RequestError("this server's /tokenize takes a prompt, not messages", "messages")
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise RequestError(f"prompt must be a string, got {json_type_name(prompt)}", "prompt")
    prompt = check_text(prompt, "prompt")
    special = _optional(body, "add_special_tokens", bool, True)
    strs = _optional(body, "return_token_strs", bool, False)
    if model.tokenizer is None:
        raise RequestError("this model has no tokenizer: /tokenize needs one", "prompt")
    try:
        ids = [int(t) for t in model.tokenizer(prompt, add_special_tokens=special)["input_ids"]]
        token_strs = model.tokenizer.convert_ids_to_tokens(ids) if strs else None
    except Exception as err:  # text already checked: a tokenizer failure is still the request's
        raise RequestError(f"prompt cannot be tokenized ({type(err).__name__})", "prompt") from None
    return {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids, "token_strs": token_strs}


def detokenize_response(body: Any, model: ModelFacts) -> dict:
    """POST /detokenize in vLLM's shape: {"model"?, "tokens": [ids]} -> {"prompt": text} (special tokens kept, as
    vLLM's renderer decodes them). Ids are checked like a prompt's (in [0, vocab_size), at most max_model_len).
    Raises RequestError."""
    body = _check_body(body, model)
    ids = check_token_ids(body.get("tokens"), "tokens", model, max_len=model.max_model_len, allow_empty=True)
    if model.tokenizer is None:
        raise RequestError("this model has no tokenizer: /detokenize needs one", "tokens")
    try:
        text = model.tokenizer.decode(list(ids))
    except Exception as err:
        raise RequestError(f"tokens cannot be decoded ({type(err).__name__})", "tokens") from None
    return {"prompt": text}
