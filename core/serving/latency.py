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
With a request-side time (column REQUEST_SIDE_COLUMN, `request_side_seconds`: what a request spends outside the
simulated steps before its first token reaches its client) ttft and e2e gain it; tpot and queue do not move.

Percentiles p50 / p90 / p95 / p99 are numpy's default (linear interpolation between the closest ranks: for n sorted
values v, the q-th percentile is v[h] + (h - floor(h)) (v[floor(h) + 1] - v[floor(h)]) at h = (n - 1) q / 100).
Throughput over the requests' span (the first arrival to the last finish): output tokens (output_len x n) per
second, and requests per second, as a client-side benchmark counts them.
"""

import numpy as np
import pandas as pd

from core.errors import InvalidArgumentError

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue")
REQUEST_TIME_COLUMNS = ("arrival_time", "admit_time", "first_token_time", "finish_time", "output_len")
REQUEST_SIDE_COLUMN = "request_side_s"  # optional: seconds outside the steps added to ttft and e2e


def steps_ended_before(step_ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """How many steps had ended at each time (int64 [times]): step_ends float64 [steps], ascending; a time equal
    to a step's end counts that step as ended (a closed-loop request arrives at the end of the step that finished
    its client's previous request)."""
    return np.searchsorted(np.asarray(step_ends, np.float64), np.asarray(times, np.float64), side="right")


def request_side_seconds(
    fixed_s: float, step_durations: np.ndarray, arrival_steps: np.ndarray, closed_loop: bool = True
) -> np.ndarray:
    """What each request spends outside the simulated steps before its first token reaches its client
    (docs/slo.md 2c, the request-side term of the vLLM profile): fixed_s, the serving front end's time (HTTP,
    tokenization, the hand-off to the engine, the first token's way back), plus, in a closed loop, the step in
    flight when the request reaches the engine: its client sends it when the previous request's last token
    reaches it, by which time the engine has scheduled the next step without it, where the simulator admits it
    at once. That step is taken as long as the one whose end the simulated request arrived at,
    step_durations[arrival_steps - 1]; nothing for a request that arrived before any step ended (an idle
    engine). An open-loop arrival already waits for the step in flight in the simulator: fixed_s alone.
    step_durations: float64 [steps]; arrival_steps: int64 [requests], steps ended when each arrived
    (`steps_ended_before`). Returns float64 [requests]."""
    arrival_steps = np.asarray(arrival_steps, np.int64)
    if not closed_loop or len(step_durations) == 0:
        return np.full(arrival_steps.shape, float(fixed_s))
    durations = np.asarray(step_durations, np.float64)
    in_flight = np.where(arrival_steps > 0, durations[np.clip(arrival_steps - 1, 0, len(durations) - 1)], 0.0)
    return fixed_s + in_flight


def benchmark_mean(first_round: float, steady: float, rounds: float) -> float:
    """The mean a closed-loop benchmark of `rounds` x C requests at concurrency C reports (aiperf's
    --request-count at --concurrency C, fixed lengths): its first round starts synchronized, all C clients sending
    at once (aiperf starts its measured phase when every warm-up response is in), with mean `first_round`; the
    other rounds - 1 run in the steady state, mean `steady`. rounds >= 1.

        benchmark_mean(2.0, 0.5, 10) == (2.0 + 9 x 0.5) / 10 == 0.65"""
    if not rounds >= 1:
        raise InvalidArgumentError(f"a benchmark has at least one round of C requests, got {rounds}")
    return (first_round + (rounds - 1) * steady) / rounds


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
    side = requests[REQUEST_SIDE_COLUMN].to_numpy(np.float64) if REQUEST_SIDE_COLUMN in requests else 0.0
    return {
        "ttft": first - arrival + side,
        "tpot": tpot,
        "e2e": finish - arrival + side,
        "queue": admit - arrival,
    }


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
