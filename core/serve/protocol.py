"""The OpenAI-compatible request and response bodies of `core.serve`, in vLLM's shapes.

`completion_request` / `chat_request` check a parsed JSON body and return what the engine needs; every bad field
raises `RequestError` naming the parameter (the server answers an OpenAI-style 400, never a 500). Fields vLLM
accepts that this engine does not implement (stop strings, logprobs, echo, best_of > n) are refused by name
rather than silently ignored; unknown fields are ignored, as vLLM does.
"""

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from core.engine import SamplingParams
from core.engine.sequence import RequestOutput
from core.errors import InvalidArgumentError, RequestError

MAX_PROMPTS = 64  # prompts in one completions request
DEFAULT_COMPLETION_TOKENS = 16  # vLLM's and OpenAI's default for /v1/completions
MAX_DEFAULT_CHAT_TOKENS = 512  # chat without max_tokens: the rest of the context, at most this many


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass
class ParsedRequest:
    prompts: list  # each a str or a list of token ids
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str
    chat: bool = False
    return_token_ids: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


def _get(body: dict, name: str, kinds, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise RequestError(f"{name} must be {_kind_name(kinds)}, got a boolean", name)
    if not isinstance(value, kinds):
        raise RequestError(f"{name} must be {_kind_name(kinds)}, got {type(value).__name__}", name)
    return value


def _kind_name(kinds) -> str:
    names = {
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _sampling(body: dict, max_tokens: int | None, default_tokens: int) -> tuple[SamplingParams, bool, bool]:
    for name, allowed in (
        ("stop", ([], "")),
        ("logprobs", (False, 0)),
        ("echo", (False,)),
        ("suffix", ("",)),
    ):
        value = body.get(name)
        if value is not None and value not in allowed:
            raise RequestError(f"{name} is not supported by this server (use stop_token_ids for stops)", name)
    n = _get(body, "n", int, 1)
    best_of = _get(body, "best_of", int, n)
    if best_of != n:
        raise RequestError("best_of must equal n on this server", "best_of")
    top_k = _get(body, "top_k", int, 0)
    stop_ids = _get(body, "stop_token_ids", list, [])
    try:
        params = SamplingParams(
            max_tokens=default_tokens if max_tokens is None else max_tokens,
            temperature=float(_get(body, "temperature", (int, float), 1.0)),
            top_p=float(_get(body, "top_p", (int, float), 1.0)),
            top_k=0 if top_k == -1 else top_k,
            n=n,
            seed=_get(body, "seed", int),
            ignore_eos=_get(body, "ignore_eos", bool, False),
            stop_token_ids=tuple(stop_ids),
        )
    except InvalidArgumentError as err:
        raise RequestError(str(err)) from None
    options = _get(body, "stream_options", dict, {})
    return params, _get(body, "stream", bool, False), bool(options.get("include_usage", False))


def _check_model(body: dict, served: str) -> str:
    model = _get(body, "model", str, served)
    if model != served:
        raise RequestError(
            f"The model `{model}` does not exist; this server serves `{served}`.", "model", 404
        )
    return model


def completion_request(body: Any, served: str) -> ParsedRequest:
    """/v1/completions: prompt as text, token ids, or a list of either (a batch)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = _check_model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)
    ):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        prompts = list(prompt)
    else:
        raise RequestError(
            "prompt must be a string, a list of token ids, or a non-empty list of either", "prompt"
        )
    if len(prompts) > MAX_PROMPTS:
        raise RequestError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}", "prompt")
    for p in prompts:
        if isinstance(p, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            raise RequestError("a token-id prompt must be a list of integers", "prompt")
        if not p:
            raise RequestError("a prompt needs at least one token", "prompt")
    max_tokens = _get(body, "max_tokens", int)
    params, stream, usage = _sampling(body, max_tokens, DEFAULT_COMPLETION_TOKENS)
    return ParsedRequest(
        prompts, params, stream, usage, model, return_token_ids=bool(body.get("return_token_ids"))
    )


def chat_request(body: Any, served: str, tokenizer, max_model_len: int) -> ParsedRequest:
    """/v1/chat/completions: messages rendered with the model's chat template into one prompt of token ids."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = _check_model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    for m in messages:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise RequestError(
                "each message must be an object with a string role and string content", "messages"
            )
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise RequestError("this model has no chat template: use /v1/completions with token ids", "messages")
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            add_generation_prompt=True,
            tokenize=True,
        )
    except Exception as err:
        raise RequestError(f"the chat template cannot render these messages: {err}", "messages") from None
    if hasattr(rendered, "keys"):  # transformers 5 returns a BatchEncoding
        rendered = rendered["input_ids"]
    ids = list(rendered[0] if rendered and isinstance(rendered[0], list) else rendered)
    max_tokens = _get(body, "max_completion_tokens", int) or _get(body, "max_tokens", int)
    default = max(1, min(MAX_DEFAULT_CHAT_TOKENS, max_model_len - len(ids)))
    params, stream, usage = _sampling(body, max_tokens, default)
    return ParsedRequest([ids], params, stream, usage, model, chat=True)


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def response_body(req: ParsedRequest, results: list[RequestOutput], *, with_token_ids: bool) -> dict:
    """The whole (non-streamed) response for every prompt's final output, choices in prompt then sample order."""
    choices = []
    prompt_tokens = completion_tokens = 0
    for p_index, out in enumerate(results):
        prompt_tokens += len(out.prompt_token_ids)
        for o in out.outputs:
            completion_tokens += len(o.token_ids)
            index = p_index * req.params.n + o.index
            if req.chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": o.text or ""},
                                "logprobs": None, "finish_reason": o.finish_reason, "stop_reason": None})  # fmt: skip
            else:
                choice = {"index": index, "text": o.text or "", "logprobs": None, "finish_reason": o.finish_reason,
                          "stop_reason": None, "prompt_logprobs": None}  # fmt: skip
                if with_token_ids:
                    choice["token_ids"] = list(o.token_ids)
                choices.append(choice)
    return {
        "id": ("chatcmpl-" if req.chat else "cmpl-") + req.request_id,
        "object": "chat.completion" if req.chat else "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": usage_body(prompt_tokens, completion_tokens),
    }


def chunk_body(req: ParsedRequest, index: int, text: str, finish_reason: str | None, token_ids=None, *,
               role: bool = False) -> dict:  # fmt: skip
    """One streamed chunk: a text delta for choice `index` (and its finish reason on the last one)."""
    if req.chat:
        delta: dict = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
    return {
        "id": ("chatcmpl-" if req.chat else "cmpl-") + req.request_id,
        "object": "chat.completion.chunk" if req.chat else "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [choice],
    }
