"""The clients of the soak test (tests/serve/test_soak.py), each one raw socket to a server on 127.0.0.1, so a
client can leave at any moment the way a real one does: mid-stream, while its non-streamed answer is computed, or
before it has sent its whole body. Each returns an `Outcome`: what the client itself saw."""

import json
import socket
import time
from dataclasses import dataclass, field


@dataclass
class Outcome:
    kind: str
    status: int | None = None  # None: the client left before any answer
    prompts: list[int] = field(default_factory=list)  # tokens of each prompt sent (set by the caller)
    reasons: list[str] = field(
        default_factory=list
    )  # finish reason of choice 0 of each prompt, when finished
    prompt_tokens: int = 0  # from the usage the server reported (finished requests)
    completion_tokens: int = 0  # tokens received (finished: all; left mid-stream: those seen)
    max_new: int = 0  # the most tokens the server could have made for it (max_tokens x n x prompts)


def _request(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


def _head(reader) -> tuple[int, dict[str, str]]:
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
        key, _, value = line.decode().partition(":")
        headers[key.strip().lower()] = value.strip()
    return status, headers


def _chunks(reader):
    """The bodies of an HTTP/1.1 chunked response, one per chunk (Starlette sends one SSE event per chunk)."""
    while True:
        size = int(reader.readline().split(b";")[0], 16)
        if size == 0:
            return
        data = reader.read(size)
        reader.readline()
        yield data


def _events(reader):
    for chunk in _chunks(reader):
        for line in chunk.decode().split("\n"):
            if line.startswith("data: "):
                yield line[6:]


def complete(port: int, body: dict, n_prompts: int, kind: str = "complete") -> Outcome:
    """A non-streamed request read to its end."""
    out = Outcome(kind, max_new=body["max_tokens"] * body.get("n", 1) * n_prompts)
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(_request("/v1/completions", body))
        reader = sock.makefile("rb")
        out.status, headers = _head(reader)
        raw = (
            reader.read(int(headers["content-length"]))
            if "content-length" in headers
            else b"".join(_chunks(reader))
        )
    answer = json.loads(raw)
    if out.status == 200:
        n = body.get("n", 1)
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        out.reasons = [choices[p * n]["finish_reason"] for p in range(n_prompts)]
        out.prompt_tokens = answer["usage"]["prompt_tokens"]
        out.completion_tokens = answer["usage"]["completion_tokens"]
        assert out.completion_tokens == sum(len(c["token_ids"]) for c in choices)
    return out


def stream(port: int, body: dict, n_prompts: int, leave_after: int | None = None) -> Outcome:
    """A streamed request: read to [DONE], or (leave_after) close the socket after that many chunks."""
    kind = "stream" if leave_after is None else "left mid-stream"
    out = Outcome(kind, max_new=body["max_tokens"] * body.get("n", 1) * n_prompts)
    n = body.get("n", 1)
    finish: dict[int, str] = {}
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(_request("/v1/completions", {**body, "stream": True}))
        reader = sock.makefile("rb")
        out.status, _ = _head(reader)
        seen = 0
        for data in _events(reader):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                out.prompt_tokens = chunk["usage"]["prompt_tokens"]
                assert chunk["usage"]["completion_tokens"] == out.completion_tokens
                continue
            (choice,) = chunk["choices"]
            out.completion_tokens += len(choice.get("token_ids") or [])
            if choice["finish_reason"]:
                finish[choice["index"]] = choice["finish_reason"]
            seen += 1
            if leave_after is not None and seen >= leave_after:
                sock.shutdown(socket.SHUT_RDWR)
                return out
    out.reasons = [finish[p * n] for p in range(n_prompts)]
    return out


def leave_while_computing(port: int, body: dict, wait_s: float) -> Outcome:
    """A non-streamed request whose client closes the connection `wait_s` after sending it."""
    out = Outcome("left while computing", max_new=body["max_tokens"] * body.get("n", 1))
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(_request("/v1/completions", body))
        time.sleep(wait_s)
        sock.shutdown(socket.SHUT_RDWR)
    return out


def leave_mid_body(port: int) -> Outcome:
    """A client that announces 5,000 bytes, sends 20 and goes away."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 5000\r\n\r\n{"prompt": [1, 2, 3'
        )
        sock.shutdown(socket.SHUT_RDWR)
    return Outcome("left mid-body")
