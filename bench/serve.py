"""core.serve under a bounded concurrent load on loopback, against the same requests through `Engine.generate`
offline. Prints one JSON object.

    python bench/serve.py                 # the real model (SmolLM2-135M), 32 requests, 8 at a time, 32 tokens
    python bench/serve.py --quick         # 8 requests, 4 at a time, 16 tokens
    python bench/serve.py --model tiny    # the tiny random Llama (no files)

Requests: token-id prompts of 16-256 random tokens (seeded), greedy, exactly `max_tokens` new tokens each
(ignore_eos), streamed (SSE). Client-side, per request: TTFT = request sent -> first chunk with tokens; ITL = the
gaps between later chunks (one chunk per engine step that gave the request tokens). requests_per_s and
output_tokens_per_s are over the wall time of the whole load. offline_tokens_per_s: the same prompts through
`Engine.generate` in this process (same model, pool, prefix caching and settings; the cache reset before each
run, as the server's is fresh), best of 2, on a thread as the server's loop, measured before the server starts
so the two do not share the CPU; serving_overhead = 1 - online / offline output tokens per second (HTTP, JSON,
SSE, the loop thread, and requests arriving C at a time instead of all at once). The server's own TTFT / ITL
histograms are read back from its /metrics with our parser (bucketed estimates).
"""

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.device import default_device, device_label
from core.engine import SamplingParams
from core.kernels.cpu_isa import cpu_description
from core.live.metrics import parse_vllm_metrics
from core.serve.launcher import LoopbackServer
from core.serve.server import ServeConfig, build_engine

WORKLOADS = {
    "full": {"requests": 32, "concurrency": 8, "max_tokens": 32},
    "quick": {"requests": 8, "concurrency": 4, "max_tokens": 16},
}
NUM_BLOCKS = 1024
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(16, 256))] for _ in range(n)]


def offline(model: str, prompts, max_tokens: int) -> float:
    """Best of 2 output tokens per second of `Engine.generate` on all prompts, run on a thread of its own as the
    server's engine loop runs (torch's intra-op threads behave differently off the main thread on a loaded
    machine, so the two sides run alike)."""
    config = ServeConfig(
        model, block_size=16, num_blocks=NUM_BLOCKS, prefix_caching=True, seed=0, max_num_seqs=64
    )
    engine, _ = build_engine(config)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    rates: list[float] = []

    def run():
        engine.generate(
            prompts[:2], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        )  # warm-up
        for _ in range(2):
            engine.reset_prefix_cache() if hasattr(
                engine, "reset_prefix_cache"
            ) else engine.manager.reset_prefix_cache()
            start = time.perf_counter()
            outs = engine.generate(prompts, params)
            rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return max(rates)


def one_request(url: str, prompt, max_tokens: int) -> tuple[float, list[float], int]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    sent = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    with OPENER.open(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            got = sum(len(c.get("token_ids") or []) for c in chunk["choices"])
            if not got:
                continue
            now = time.perf_counter()
            if first is None:
                first = now - sent
            else:
                gaps.append(now - last)
            last, tokens = now, tokens + got
    return first, gaps, tokens


def online(server: LoopbackServer, prompts, max_tokens: int, concurrency: int) -> dict:
    url = server.url + "/v1/completions"
    one_request(url, prompts[0][:8], 2)  # warm-up
    queue = list(enumerate(prompts))
    lock = threading.Lock()
    results: list = [None] * len(prompts)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                i, prompt = queue.pop(0)
            results[i] = one_request(url, prompt, max_tokens)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ttft = sorted(r[0] for r in results)
    itl = sorted(g for r in results for g in r[1])
    tokens = sum(r[2] for r in results)
    return {
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(prompts) / wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2),
        "ttft_ms": {
            "p50": _ms(_pct(ttft, 0.5)),
            "p99": _ms(_pct(ttft, 0.99)),
            "spread_ms": _ms(ttft[-1] - ttft[0]),
        },
        "itl_ms": {
            "p50": _ms(_pct(itl, 0.5)),
            "p99": _ms(_pct(itl, 0.99)),
            "stdev_ms": _ms(statistics.pstdev(itl)),
        },
        "output_tokens": tokens,
    }


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))]


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    w = WORKLOADS["quick" if args.quick else "full"]
    vocab = 512 if args.model == "tiny" else 49_152
    prompts = make_prompts(w["requests"], vocab)
    offline_tps = offline(args.model, prompts, w["max_tokens"])
    server = LoopbackServer(
        args.model, num_blocks=NUM_BLOCKS, events=False, extra_args=("--max-num-seqs", "64"), startup_s=600
    )
    try:
        result = online(server, prompts, w["max_tokens"], w["concurrency"])
        metrics = parse_vllm_metrics(server.get("/metrics")[1].decode())
    finally:
        server.stop()
    print(
        json.dumps(
            {
                "benchmark": "serve",
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, {device_label(default_device())}",
                "cpu": cpu_description(),
                "model": args.model,
                **w,
                **result,
                "offline_tokens_per_s": round(offline_tps, 2),
                "online_vs_offline": round(result["output_tokens_per_s"] / offline_tps, 3),
                "serving_overhead": round(1 - result["output_tokens_per_s"] / offline_tps, 3),
                "server_ttft_ms_p50": _ms(metrics.ttft.quantile(0.5)),
                "server_itl_ms_p50": _ms(metrics.itl.quantile(0.5)),
                "server_generation_tokens": metrics.generation_tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
