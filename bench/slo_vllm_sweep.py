"""The sweep of `bench.slo --server vllm` (docs/slo.md 5b, step 2): vLLM's steps measured from outside, as for any
vLLM (no engine access): streaming /v1/completions with token-id prompts and `continuous_usage_stats` (each chunk
says how many tokens the request has produced).

Decode steps: for each level c of SWEEP_LEVELS, c requests (SWEEP_PROMPT random tokens, SWEEP_OUTPUT outputs)
sent together; while all c are decoding, each request's time per token over that window is a step of c decodes
reading c x context KV tokens (single gaps seen from outside are bursty: some ~0, some two steps). Prefill steps:
one request alone of each of PREFILL_LENGTHS prompt tokens and one output token, its time to the first chunk (its
HTTP entry included, as in the TTFT `vllm bench serve` measures).
"""

import json
import threading
import time
import urllib.request

import numpy as np
import pandas as pd

SWEEP_LEVELS = (1, 1, 1, 1, 2, 2, 3, 4, 6, 8, 12, 16)  # one row per request: a lone decode four times
SWEEP_PROMPT, SWEEP_OUTPUT = 48, 24
SEGMENT_TOKENS = 8  # a request's window must span this many tokens to give a row
PREFILL_LENGTHS = (16, 32, 48, 64, 96, 128, 192, 256)
PREFILL_REPEATS = 2
TOKEN_LOW = 1000  # random prompt ids from here up: no special tokens


class StreamRecord:
    """One streamed request: (perf_counter, completion tokens so far) per chunk."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, int]] = []
        self.error: str | None = None


def stream(url: str, model: str, prompt: list[int], max_tokens: int, record: StreamRecord) -> None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                usage = json.loads(line[6:]).get("usage") or {}
                if usage.get("completion_tokens"):
                    record.chunks.append((time.perf_counter(), int(usage["completion_tokens"])))
    except OSError as error:
        record.error = str(error)


def _send_together(url: str, model: str, prompts: list[list[int]], max_tokens: int) -> list[StreamRecord]:
    records = [StreamRecord() for _ in prompts]
    threads = [
        threading.Thread(target=stream, args=(url, model, p, max_tokens, r))
        for p, r in zip(prompts, records, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [r.error for r in records if r.error]
    if failed:
        raise RuntimeError(f"a sweep request failed: {failed[0]}")
    return records


def decode_rows(records: list[StreamRecord], prompt_len: int) -> list[dict]:
    """Steps of len(records) decodes, one row per request: its time per token over the window in which every
    request decodes (first to last chunk inside it). Seen from outside, chunks arrive in bursts (the API server
    forwards several steps' tokens at once when it falls behind), so single gaps and short segments can be ~0 or
    several steps long; over the whole window the bursts cancel."""
    c = len(records)
    start = max(r.chunks[0][0] for r in records)
    end = min(r.chunks[-1][0] for r in records)
    rows = []
    for record in records:
        inside = [(t, n) for t, n in record.chunks if start <= t <= end]
        if len(inside) < 2 or inside[-1][1] - inside[0][1] < SEGMENT_TOKENS:
            continue
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        kv = c * (prompt_len + (n0 + n1) / 2)
        rows.append(
            {
                "new_tokens": c,
                "kv_tokens_read": kv,
                "attention_pairs": kv + c,
                "output_tokens": c,
                "seconds": (t1 - t0) / (n1 - n0),
                "kind": "decode",
            }
        )
    return rows


def sweep(url: str, model: str, rng: np.random.Generator, vocab: int) -> pd.DataFrame:
    rows = []
    for level in SWEEP_LEVELS:
        prompts = [rng.integers(TOKEN_LOW, vocab, SWEEP_PROMPT).tolist() for _ in range(level)]
        rows += decode_rows(_send_together(url, model, prompts, SWEEP_OUTPUT), SWEEP_PROMPT)
    for _ in range(PREFILL_REPEATS):
        for n in PREFILL_LENGTHS:
            record = StreamRecord()
            sent = time.perf_counter()
            stream(url, model, rng.integers(TOKEN_LOW, vocab, n).tolist(), 1, record)
            if record.error or not record.chunks:
                raise RuntimeError(f"a prefill request failed: {record.error}")
            rows.append(
                {
                    "new_tokens": n,
                    "kv_tokens_read": 0,
                    "attention_pairs": n * (n + 1) / 2,
                    "output_tokens": 1,
                    "seconds": record.chunks[0][0] - sent,
                    "kind": "prefill",
                }
            )
    return pd.DataFrame(rows)
