"""The HTTP side of `core.serve`: a FastAPI app with vLLM's OpenAI-compatible routes over one `EngineLoop`.

Routes: POST /v1/completions and /v1/chat/completions (JSON, or SSE with `stream`: `data: {chunk}` lines and a
final `data: [DONE]`), POST /tokenize and /detokenize (vLLM's shapes), GET /health, /v1/models, /metrics
(Prometheus text, vLLM's names). Every request body is
read up to MAX_BODY_BYTES (413 past it), parsed as JSON (400 when it is not, however deep or broken) and checked
field by field in `core.serve.protocol` before anything is queued: a bad request is an OpenAI-style JSON error
with status 400 (404 for another model's name), as are unknown routes (404) and wrong methods (405); a request
that can never fit the KV pool is refused that way too. No request can make the server answer 500: the catch-all
handler is only for the server's own bugs.

A client that goes away is aborted, streamed or not (a non-streamed request watches for the disconnect while it
waits), so its blocks return to the pool at once.
"""

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from core.engine import Engine
from core.errors import InvalidArgumentError
from core.serve.exporter import ServerMetrics
from core.serve.loop import EngineLoop
from core.serve.protocol import (
    ModelFacts,
    ParsedRequest,
    RequestError,
    chat_request,
    completion_request,
    detokenize_response,
    tokenize_response,
)
from core.serve.responses import chunk_body, error_body, response_body, usage_body

MAX_BODY_BYTES = 16 * 1024 * 1024  # a MAX_TEXT_CHARS prompt escaped as JSON, with room to spare
CLIENT_GONE = 499  # nginx's "client closed request": logged, never seen by the client


@dataclass
class ServedModel:
    name: str
    engine: Engine
    loop: EngineLoop
    metrics: ServerMetrics
    max_model_len: int

    @property
    def facts(self) -> ModelFacts:
        return ModelFacts(
            self.name,
            self.engine.config.vocab_size,
            self.max_model_len,
            self.engine.max_num_seqs,
            self.engine.tokenizer,
        )


def build_app(served: ServedModel) -> FastAPI:
    app = FastAPI(title="PagedAttention Lab server", docs_url=None, redoc_url=None, openapi_url=None)
    facts = served.facts

    @app.exception_handler(RequestError)
    async def _bad_request(_request: Request, err: RequestError):
        return JSONResponse(error_body(str(err), err.status, err.param), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):  # unknown route, wrong method
        message = {
            404: f"no route {request.url.path[:100]!r}; this server has /v1/completions, "
            "/v1/chat/completions, /tokenize, /detokenize, /v1/models, /health and /metrics",
            405: f"{request.method[:20]} is not allowed on {request.url.path[:100]!r}",
        }.get(err.status_code, str(err.detail))
        return JSONResponse(error_body(message, err.status_code), err.status_code, headers=err.headers)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, err: Exception):  # a bug, never bad input: still an OpenAI body
        return JSONResponse(error_body(f"internal error: {type(err).__name__}", 500), status_code=500)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        card = {
            "id": served.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "paged-attention-lab",
            "root": served.name,
            "parent": None,
            "max_model_len": served.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics():
        return Response(served.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(served, completion_request(await read_json(request), facts), request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _serve(served, chat_request(await read_json(request), facts), request)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return tokenize_response(await read_json(request), facts)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return detokenize_response(await read_json(request), facts)

    return app


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES):
    """The request body parsed as JSON. Raises RequestError: 413 past `max_bytes` (read no further), 400 for a
    body that is not JSON (broken, not UTF-8, nested too deep, an integer too long) or a client that left."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(f"the request body is {int(declared):,} bytes; at most {max_bytes:,}", None, 413)
    raw = bytearray()
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_bytes:
                raise RequestError(f"the request body is over {max_bytes:,} bytes", None, 413)
    except ClientDisconnect:
        raise RequestError("the client went away before sending the whole body") from None
    try:
        return json.loads(bytes(raw))
    except RecursionError:
        raise RequestError("the request body is not JSON: it is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's digit limit
        reason = err.msg if isinstance(err, json.JSONDecodeError) else type(err).__name__
        raise RequestError(f"the request body is not JSON: {reason}") from None


async def _until_disconnected(request: Request) -> None:
    """Returns when the client closes its connection (the body has been read: only a disconnect can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _serve(served: ServedModel, req: ParsedRequest, request: Request):
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue = asyncio.Queue()
    ids = [f"{req.request_id}-{i}" for i in range(len(req.prompts))]
    for i, (rid, prompt) in enumerate(zip(ids, req.prompts, strict=True)):

        def callback(out, err, i=i):
            with contextlib.suppress(RuntimeError):  # the server's event loop is closing
                loop.call_soon_threadsafe(updates.put_nowait, (i, out, err))

        try:
            served.loop.submit(rid, prompt, req.params, callback)
        except InvalidArgumentError as err:  # the one check left to the engine: the pool is too small for it
            for earlier in ids[:i]:
                served.loop.abort(earlier)
            raise RequestError(str(err), "prompt") from None
    with_ids = req.return_token_ids or served.engine.tokenizer is None
    if req.stream:
        return StreamingResponse(_stream(served, req, ids, updates, with_ids), media_type="text/event-stream")
    finals: dict[int, object] = {}
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        while len(finals) < len(ids):
            update = asyncio.ensure_future(updates.get())
            await asyncio.wait({update, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not update.done():
                update.cancel()
                return Response(status_code=CLIENT_GONE)  # nobody reads it; `finally` aborts what is left
            i, out, err = update.result()
            if err is not None:
                return JSONResponse(error_body(err, 500), status_code=500)
            if out.finished:
                finals[i] = out
    finally:
        gone.cancel()
        for i, rid in enumerate(ids):
            if i not in finals:
                served.loop.abort(rid)
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
