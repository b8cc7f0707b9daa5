"""The OpenAI-compatible response bodies of `core.serve`, in vLLM's shapes: errors, whole responses, stream chunks."""

import time
from http import HTTPStatus

from core.engine.sequence import RequestOutput
from core.serve.protocol import ParsedRequest

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    kind = (
        _ERROR_TYPES.get(status)
        or HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "") + "Error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


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
                choices.append(
                    {
                        "index": index,
                        "message": {"role": "assistant", "content": o.text or ""},
                        "logprobs": None,
                        "finish_reason": o.finish_reason,
                        "stop_reason": None,
                    }
                )
            else:
                choice = {
                    "index": index,
                    "text": o.text or "",
                    "logprobs": None,
                    "finish_reason": o.finish_reason,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
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


def chunk_body(
    req: ParsedRequest,
    index: int,
    text: str,
    finish_reason: str | None,
    token_ids=None,
    *,
    role: bool = False,
) -> dict:
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
