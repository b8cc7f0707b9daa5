"""Per-request latency under load and its percentiles: what a client of the server sees, from the request times
that the simulator records (and that `bench/slo.py` records for the engine, in the same columns).

Per finished request (seconds):
    ttft  = first_token_time - arrival_time                      time to first token (queueing + prefill)
    tpot  = (finish_time - first_token_time) / (output_len - 1)  time per output token after the first; requests
                                                                 of one output token have none (left out)
    e2e   = finish_time - arrival_time                           end-to-end latency
    queue = admit_time - arrival_time                            time waiting before the scheduler first admits it
                                                                 (vLLM's request_queue_time; a preempted request
                                                                 keeps its first admission)
Percentiles p50 / p90 / p95 / p99 are numpy's default (linear interpolation between the closest ranks: for n sorted
values v, the q-th percentile is v[h] + (h - floor(h)) (v[floor(h) + 1] - v[floor(h)]) at h = (n - 1) q / 100).
Throughput over the requests' span (the first arrival to the last finish): output tokens (output_len x n) per
second, and requests per second, as a client-side benchmark counts them.
"""

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue")
REQUEST_TIME_COLUMNS = ("arrival_time", "admit_time", "first_token_time", "finish_time", "output_len")


def request_latencies(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    """metric name -> float64 [requests] for LATENCY_METRICS (NaN where undefined: unfinished, or tpot of a
    one-token output, or queue without an admit_time column). `requests` has REQUEST_TIME_COLUMNS."""
    arrival = requests["arrival_time"].to_numpy(np.float64)
    first = requests["first_token_time"].to_numpy(np.float64)
    finish = requests["finish_time"].to_numpy(np.float64)
    output = requests["output_len"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output > 1, (finish - first) / (output - 1), np.nan)
    admit = (
        requests["admit_time"].to_numpy(np.float64)
        if "admit_time" in requests
        else np.full_like(arrival, np.nan)
    )
    return {"ttft": first - arrival, "tpot": tpot, "e2e": finish - arrival, "queue": admit - arrival}


def latency_summary(requests: pd.DataFrame) -> dict:
    """Over the finished requests (finish_time not NaN): `{metric}_p{50,90,95,99}_s` and `mean_{metric}_s` for each
    of LATENCY_METRICS (absent when no request defines it, e.g. tpot when every output is one token),
    output_throughput_tokens_per_s and request_throughput_per_s over the requests' span, and
    latency_requests (how many requests the figures are over). {} when none finished."""
    done = requests[requests["finish_time"].notna()]
    if done.empty:
        return {}
    out: dict = {"latency_requests": len(done)}
    for name, values in request_latencies(done).items():
        values = values[~np.isnan(values)]
        if len(values) == 0:
            continue
        for q, v in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
            out[f"{name}_p{q}_s"] = float(v)
        out[f"mean_{name}_s"] = float(values.mean())
    span = float(done["finish_time"].max() - done["arrival_time"].min())
    samples = done["n"].to_numpy() if "n" in done else 1
    tokens = float((done["output_len"].to_numpy() * samples).sum())
    out["output_throughput_tokens_per_s"] = tokens / span if span > 0 else 0.0
    out["request_throughput_per_s"] = len(done) / span if span > 0 else 0.0
    return out
