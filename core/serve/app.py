"""The HTTP side of `core.serve`: a FastAPI app with vLLM's OpenAI-compatible routes over one `EngineLoop`.

Routes: POST /v1/completions and /v1/chat/completions (JSON, or SSE with `stream`: `data: {chunk}` lines and a
final `data: [DONE]`), GET /health, /v1/models, /metrics (Prometheus text, vLLM's names). A bad request is an
OpenAI-style JSON error with status 400 (404 for another model's name), raised before anything is queued; a
request that can never fit the KV pool is refused that way too. A streamed request whose client goes away is
aborted, so its blocks return to the pool.
"""

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from core.engine import Engine
from core.errors import InvalidArgumentError
from core.serve.exporter import ServerMetrics
from core.serve.loop import EngineLoop
from core.serve.protocol import (
    ParsedRequest,
    RequestError,
    chat_request,
    chunk_body,
    completion_request,
    error_body,
    response_body,
    usage_body,
)


@dataclass
class ServedModel:
    name: str
    engine: Engine
    loop: EngineLoop
    metrics: ServerMetrics
    max_model_len: int


def build_app(served: ServedModel) -> FastAPI:
    app = FastAPI(title="PagedAttention Lab server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestError)
    async def _bad_request(_request: Request, err: RequestError):
        return JSONResponse(error_body(str(err), err.status, err.param), status_code=err.status)

    @app.exception_handler(Exception)
    async def _internal(
        _request: Request, err: Exception
    ):  # a bug, never bad input: still an OpenAI error body
        return JSONResponse(error_body(f"internal error: {type(err).__name__}: {err}", 500), status_code=500)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        card = {"id": served.name, "object": "model", "created": int(time.time()), "owned_by": "paged-attention-lab",
                "root": served.name, "parent": None, "max_model_len": served.max_model_len}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics():
        return Response(served.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(served, completion_request(await _json(request), served.name))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        tokenizer = served.engine.tokenizer
        return await _serve(
            served, chat_request(await _json(request), served.name, tokenizer, served.max_model_len)
        )

    return app


async def _json(request: Request):
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError(f"the request body is not JSON: {err}") from None


async def _serve(served: ServedModel, req: ParsedRequest):
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue = asyncio.Queue()
    ids = [f"{req.request_id}-{i}" for i in range(len(req.prompts))]
    for i, (rid, prompt) in enumerate(zip(ids, req.prompts, strict=True)):

        def callback(out, err, i=i):
            with contextlib.suppress(RuntimeError):  # the server's event loop is closing
                loop.call_soon_threadsafe(updates.put_nowait, (i, out, err))

        try:
            served.loop.submit(rid, prompt, req.params, callback)
        except InvalidArgumentError as err:
            for earlier in ids[:i]:
                served.loop.abort(earlier)
            raise RequestError(str(err), "prompt") from None
    with_ids = req.return_token_ids or served.engine.tokenizer is None
    if req.stream:
        return StreamingResponse(_stream(served, req, ids, updates, with_ids), media_type="text/event-stream")
    finals: dict[int, object] = {}
    try:
        while len(finals) < len(ids):
            i, out, err = await updates.get()
            if err is not None:
                return JSONResponse(error_body(err, 500), status_code=500)
            if out.finished:
                finals[i] = out
    except asyncio.CancelledError:
        for i, rid in enumerate(ids):
            if i not in finals:
                served.loop.abort(rid)
        raise
    return response_body(req, [finals[i] for i in range(len(ids))], with_token_ids=with_ids)


async def _stream(
    served: ServedModel, req: ParsedRequest, ids: list[str], updates: asyncio.Queue, with_ids: bool
):
    """SSE chunks: per choice, the text (and token ids) new since the last chunk; its finish reason at its end."""
    sent_text: dict[int, str] = {}
    sent_tokens: dict[int, int] = {}
    ended: set[int] = set()  # choices whose finish reason was sent
    done: set[int] = set()
    prompt_tokens = completion_tokens = 0
    n = req.params.n
    try:
        if req.chat:
            for index in range(len(ids) * n):
                yield _sse(chunk_body(req, index, "", None, role=True))
        while len(done) < len(ids):
            i, out, err = await updates.get()
            if err is not None:
                yield _sse(error_body(err, 500))
                return
            for o in out.outputs:
                index = i * n + o.index
                if index in ended:
                    continue
                text = o.text or ""
                if text.endswith("\ufffd") and o.finish_reason is None:
                    text = text.rstrip("\ufffd")  # an incomplete character: wait for its other bytes
                start = sent_tokens.get(index, 0)
                delta_ids = list(o.token_ids[start:])
                delta = text[len(sent_text.get(index, "")) :]
                if delta or delta_ids or o.finish_reason:
                    yield _sse(
                        chunk_body(req, index, delta, o.finish_reason, delta_ids if with_ids else None)
                    )
                sent_text[index] = text
                sent_tokens[index] = len(o.token_ids)
                if o.finish_reason:
                    ended.add(index)
            if out.finished:
                done.add(i)
                prompt_tokens += len(out.prompt_token_ids)
                completion_tokens += sum(len(o.token_ids) for o in out.outputs)
        if req.include_usage:
            final = chunk_body(req, 0, "", None)
            final["choices"] = []
            final["usage"] = usage_body(prompt_tokens, completion_tokens)
            yield _sse(final)
        yield "data: [DONE]\n\n"
    finally:  # the client went away (or we finished): unfinished requests give their blocks back
        for i, rid in enumerate(ids):
            if i not in done:
                served.loop.abort(rid)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"
