"""A simulated server whose truth is known (SmolLM2-135M's roofline with overhead_s 30 ms and flops_efficiency
0.4 on fixed roofs), and the window its /metrics would show: its requests counted into vLLM's buckets as
core.serve's exporter counts them (per-token ITLs are not in the simulator's frame: their sum and count are
exact, the buckets per request)."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from core.live.histogram import Histogram
from core.live.window import ObservedWindow, bucketed
from core.metric_names import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS, request_token_buckets
from core.planning.cost.cpu_roofline import engine_step_model
from core.planning.observed.planned import ServerLimits, _simulate
from core.serving.workload import Request, poisson_arrivals

SMOLLM2_135M = SimpleNamespace(  # the shapes of SmolLM2-135M's config (`ModelShape`'s names)
    num_layers=30, num_attention_heads=9, num_kv_heads=3, head_dim=64, hidden_size=576, vocab_size=49152
)
BASE = replace(
    engine_step_model(
        SMOLLM2_135M,
        weight_bytes=134.5e6 * 4,
        dtype_bytes=4,
        roofs={"memory_bandwidth": 26e9, "peak_flops": 80e9},
    ),
    bandwidth_efficiency=0.8,
)
LIMITS = ServerLimits(
    kv_capacity_tokens=64 * 16, block_size=16, max_num_seqs=8, max_num_batched_tokens=2048, max_seq_len=2048
)
TRUTH = replace(BASE, overhead_s=0.03, flops_efficiency=0.4)


def simulated_server(n: int = 60, rate: float = 0.7, seed: int = 5):
    """(requests, the window a /metrics of a server with TRUTH serving them would show)."""
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(n, rate, rng)
    requests = [
        Request(i, float(arrivals[i]), int(rng.integers(16, 97)), int(rng.integers(8, 41))) for i in range(n)
    ]
    f = _simulate([requests], TRUTH, LIMITS)
    decode, out = f["finish_time"] - f["first_token_time"], f["output_len"]
    tpot = decode / (out - 1)
    itl = bucketed(tpot, ITL_BUCKETS)  # per-token ITLs are not in the frame; their sum and count are exact
    itl = Histogram(itl.bounds, itl.cumulative, float(decode.sum()), float((out - 1).sum()))
    span = float(f["finish_time"].max() - f["arrival_time"].min())
    tokens = request_token_buckets(2048)
    window = ObservedWindow(
        seconds=span,
        requests=n,
        request_rate=n / span,
        mean_prompt_tokens=float(f["prompt_len"].mean()),
        mean_output_tokens=float(out.mean()),
        ttft=bucketed(f["first_token_time"] - f["arrival_time"], TTFT_BUCKETS),
        itl=itl,
        e2e=bucketed(f["finish_time"] - f["arrival_time"], REQUEST_LATENCY_BUCKETS),
        prefill_time=bucketed(f["first_token_time"] - f["admit_time"], REQUEST_LATENCY_BUCKETS),
        prompt_tokens=bucketed(f["prompt_len"], tokens),
        output_tokens=bucketed(out, tokens),
        tpot=bucketed(tpot, ITL_BUCKETS),
        tpot_source="request_tpot",
    )
    return requests, window
