"""What limits `bench.slo --server vllm` (docs/slo.md 5b): the figures each rate reports beside its errors, to say
where a miss comes from.

- `tpot_by_batch`: request by request, the measured TPOT over the replay's, and its slope on the running batch;
- `prediction_band`: the fit's own uncertainty, from resampled sweeps, carried to the replay's percentiles;
- `engine_steps`: what vLLM itself counted and timed between two scrapes of /metrics (its engine steps, its
  output processor's TPOT / ITL / TTFT, before the HTTP stream) and its model worker's CPU seconds.
"""

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from bench.slo import METRICS, fit
from core.live.metrics import parse_vllm_metrics
from core.serve.vllm_server import VLLMServer
from core.serving.latency import latency_summary, request_latencies
from core.serving.sim_result import SimulationResult

BAND_DRAWS, BAND_SEED = 40, 0  # the prediction band's resampled fits
WORKER = "VLLM::Worker"  # the model worker's process name (`VLLMServer.cpu_seconds`)


def mean_tpot(requests: pd.DataFrame) -> float:
    """The mean TPOT (`core.serving.latency`) over the requests of more than one output token."""
    return float(np.nanmean(request_latencies(requests)["tpot"]))


def tpot_by_batch(measured: pd.DataFrame, predicted: SimulationResult) -> dict:
    """Request by request, the measured TPOT over the predicted one (the same request, replayed): its median, and
    its least-squares slope on the mean running batch of the request's predicted decode window (sequences). A
    slope near 0 is a step-time error that does not depend on the load; a positive one, decode steps that slow
    down with the sequences running beside them more than the sweep's steps did."""
    requests, steps = predicted.requests, predicted.steps
    decoding = (measured["output_len"] > 1).to_numpy()
    ratio = (request_latencies(measured)["tpot"] / request_latencies(requests)["tpot"])[decoding]
    times, running = steps["time_s"].to_numpy(), steps["running_seqs"].to_numpy()
    first, last = (
        requests["first_token_time"].to_numpy()[decoding],
        requests["finish_time"].to_numpy()[decoding],
    )
    batch = np.array([running[(times > a) & (times <= b)].mean() for a, b in zip(first, last, strict=True)])
    slope = float(np.polyfit(batch, ratio, 1)[0]) if len(ratio) > 2 and np.ptp(batch) > 0 else None
    return {
        "median_measured_over_predicted": float(np.median(ratio)),
        "slope_per_running_seq": slope,
        "mean_running_batch": float(batch.mean()),
    }


def prediction_band(sweep: tuple, measured: pd.DataFrame, replay: Callable[..., pd.DataFrame]) -> dict:
    """The fit's own uncertainty carried to the replay. sweep: (the sweep's step rows, the base model); replay:
    step-time model -> the predicted requests of `measured`'s arrivals. The rows are resampled with replacement
    (BAND_DRAWS times, seeded), each resample fitted as the bench fits and replayed; per metric of METRICS the
    2.5th and 97.5th percentiles of the predicted values (seconds) and whether the measured value lies between
    them. A miss inside the band is one the sweep cannot resolve (its steps' own scatter allows it); outside it,
    the model or the machine differs between the sweep and the load."""
    rows, base = sweep
    rng = np.random.default_rng(BAND_SEED)
    draws: dict[str, list[float]] = {name: [] for name in METRICS}
    for _ in range(BAND_DRAWS):
        resampled = rows.iloc[rng.integers(0, len(rows), len(rows))].reset_index(drop=True)
        summary = latency_summary(replay(fit(resampled, base, False).model))
        for name in METRICS:
            draws[name].append(summary[f"{name}_s"])
    observed = latency_summary(measured)
    band = {}
    for name, values in draws.items():
        low, high = np.percentile(values, [2.5, 97.5])
        value = observed[f"{name}_s"]
        band[name] = {
            "low_s": float(low),
            "high_s": float(high),
            "measured_within": bool(low <= value <= high),
        }
    return band


def scrape(server: VLLMServer):
    """The server's /metrics, parsed (`core.live.metrics.VllmMetrics`)."""
    return parse_vllm_metrics(server.get("/metrics").decode())


def _mean_since(then, now) -> float | None:
    """The mean of a histogram's observations between two scrapes (None when none, or not exported)."""
    if then is None or now is None or now.count <= then.count:
        return None
    return (now.sum - then.sum) / (now.count - then.count)


def engine_steps(server: VLLMServer, cpu_then: dict[str, float], then) -> dict:
    """Since `cpu_then` and the scrape `then`: the engine steps vLLM counted (`vllm:iteration_tokens_total`, one
    observation a step), the tokens they scheduled and the model worker's CPU seconds (its one OpenMP thread: the
    step's compute; it sleeps between steps), so the worker's CPU a step; and vLLM's own means of what its output
    processor timed (`vllm:inter_token_latency_seconds`, `vllm:request_time_per_output_token_seconds`,
    `vllm:time_to_first_token_seconds`: engine-side, before the HTTP stream the client reads)."""
    now = scrape(server)
    worker = server.cpu_seconds().get(WORKER, math.nan) - cpu_then.get(WORKER, math.nan)
    counted = then.iteration_tokens is not None and now.iteration_tokens is not None
    steps = now.iteration_tokens.count - then.iteration_tokens.count if counted else math.nan
    return {
        "steps": steps,
        "tokens": now.iteration_tokens.sum - then.iteration_tokens.sum if counted else math.nan,
        "worker_cpu_s": worker,
        "worker_cpu_s_per_step": worker / steps if steps else None,
        "server_mean_itl_s": _mean_since(then.itl, now.itl),
        "server_mean_tpot_s": _mean_since(then.request_tpot, now.request_tpot),
        "server_mean_ttft_s": _mean_since(then.ttft, now.ttft),
    }
