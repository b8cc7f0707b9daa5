"""Steady-state latency of a served load: the simulator run long enough that its percentiles describe the load,
not the empty system it starts from nor the drain at its end.

A replay of N requests from an empty system measures a ramp-up: at the rates that matter a request lives longer
than the arrival window, so the batch never reaches the concurrency the rate implies (Little's law: mean requests
in the system = rate x mean lifetime), and the last requests finish alone. `steady_state` instead
1. sizes the warm-up from the load: `warmup_lifetimes` mean request lifetimes (the idle lifetime first, then the
   one measured under load) of arrivals, or `warmup_lifetimes` requests per client in a closed loop; the
   requests that arrive in it are simulated but not measured;
2. measures the next `measured` requests while later arrivals keep the load on (`simulate(until_finished=)`:
   the simulation stops once every measured request finished, so nothing drains);
3. splits the measured requests into `num_batches` consecutive batches (by arrival) and gives each percentile a
   95% confidence interval by batch means (Law & Kelton ch. 9) of its indicator (`_quantile_interval`): the
   fraction of samples at or below the estimate is a mean, its interval t(0.975, batches - 1) x the batches'
   standard deviation / sqrt(batches), and the percentile's interval the samples' own percentiles at its two
   ends. Requests that run together share their steps, so a batch spans at least `batch_lifetimes` mean lifetimes
   of arrivals (shorter batches are correlated and their spread understates the interval: a 300-request window
   at 6 req/s with 10 s lifetimes put Llama-3.1-8B's TPOT p95 on 2 x H200 at 41 ms [38, 44], where 12,000
   requests give 60 ms);
4. grows the measured requests (by the factor the widest interval asks, 2x to `MAX_GROWTH`, and at least to the
   batches' shortest length) until every percentile's half-width is within `tolerance` of its value with batches long
   enough (`converged`), or `decided(estimate)` says the question asked is already answered (an SLO met or
   missed with the interval clear of the target), or `max_requests` is reached (`converged` False).
Overload has no steady state: when the measured window's arrivals bring more output tokens than the window served
(beyond `OVERLOAD_SLACK`) or its queue grew by more than `OVERLOAD_SLACK` of its arrivals, the estimate is
`stable` False and its latencies grow with the horizon (they are the horizon's, not the load's).

Metrics, per finished measured request (`core.serving.latency`): ttft, tpot, e2e, queue; and itl, the gaps
between consecutive tokens of one sequence, pooled over every token as `vllm bench serve` pools them: a decode
step of d seconds that emits a token for m running sequences contributes m gaps of d (a sequence's first token
is its TTFT, not a gap; a recomputed sequence's gap after preemption is counted as the step that resumed it).
Throughput is measured in the window (output tokens of the steps that ended in it / its length): below capacity
it equals the arrival rate x the mean output length.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from core.common import check_float, check_int
from core.errors import InvalidArgumentError
from core.serving.latency import PERCENTILES, request_latencies
from core.serving.sim_result import SimulationResult
from core.serving.workload import Request

STEADY_METRICS = (
    "ttft",
    "tpot",
    "itl",
    "e2e",
)  # the latencies a steady-state estimate reports at PERCENTILES
OVERLOAD_SLACK = 0.05
# The most one growth multiplies the measured requests by. A first window's intervals (600 requests, batches of
# 60) overstate what a percentile needs: on the issue-37 case the p99's asked for 42x, 4x was enough. Growth
# continues the simulation (`core.serving.resume`), so a smaller step costs only one more estimate.
MAX_GROWTH = 4.0
KV_FULL = 0.9  # a step that leaves requests waiting with the cache this full is KV-limited
# two-sided 95% Student t quantiles by degrees of freedom (batches - 1)
_T95 = {
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    14: 2.145,
    15: 2.131,
    19: 2.093,
    24: 2.064,
    29: 2.045,
}


def metric_keys() -> tuple[str, ...]:
    """Every percentile key of an estimate: ttft_p50_s, ttft_p90_s, ..., e2e_p99_s."""
    return tuple(f"{m}_p{q}_s" for m in STEADY_METRICS for q in PERCENTILES)


@dataclass(frozen=True)
class SteadyStateSettings:
    """How long to simulate. tolerance: the relative half-width every percentile's 95% interval must reach (10%:
    a p99 within 5% took over 12,000 requests, 3x what the p95s needed, for Llama-3.1-8B on one H100 at 4 req/s);
    num_batches: batches of the batch-means interval (5 to 30); initial_measured / max_requests: measured
    requests of the first run and simulated requests at most; warmup_lifetimes: warm-up length in mean request
    lifetimes (open loop) or requests per client (closed loop); batch_lifetimes: the shortest batch, in mean
    lifetimes of arrivals (requests per client in a closed loop), so that batches are nearly independent."""

    tolerance: float = 0.1
    num_batches: int = 10
    initial_measured: int = 600
    max_requests: int = 10_000  # the operator limit PAGED_LAB_MAX_REQUESTS defaults to the same
    warmup_lifetimes: float = 3.0
    batch_lifetimes: float = 2.0

    def __post_init__(self):
        check_float(self.tolerance, "tolerance", minimum=0.001, maximum=1.0)
        check_int(self.num_batches, "num_batches", minimum=5, maximum=30)
        check_int(self.initial_measured, "initial_measured", minimum=5 * self.num_batches)
        check_int(self.max_requests, "max_requests", minimum=self.initial_measured)
        check_float(self.warmup_lifetimes, "warmup_lifetimes", minimum=0.0, maximum=100.0)
        check_float(self.batch_lifetimes, "batch_lifetimes", minimum=0.0, maximum=100.0)


@dataclass(frozen=True, eq=False)
class SteadyState:
    """A steady-state estimate of one replica.

    metrics: `metric_keys()` percentiles (seconds; tpot absent when every output is one token) and
    mean_{ttft,tpot,itl,e2e,queue}_s, queue_p{..}_s, throughput_tokens_per_s (output tokens/s in the window),
    request_throughput_per_s, mean_running_batch (sequences, time-weighted), mean_waiting, preemptions
    (in the window), preemptions_per_s, prefix_hit_rate (prompt tokens the prefix cache served at the measured
    requests' first admission / their prompt tokens; 0 without prefix caching), gpu_hit_rate and host_hit_rate
    (its HBM and host-tier parts, `SimulatorConfig.offload`). intervals: key -> (low, high), the 95% batch-means interval of each
    percentile. converged: every interval within the tolerance (or the question decided, see `decided`).
    decided: the caller's `decided` answered True. stable: the load is served (module docstring). kv_limited:
    the KV cache held requests back in the window (a preemption, or a step that left requests waiting with
    fewer than max_num_seqs running and the cache >= 90% full). simulated / measured / warmup_requests:
    counts; window_s: the measured window's length (first to last measured arrival); result: the last run;
    long_enough: its batches span `batch_lifetimes` lifetimes each (no estimate converges before)."""

    metrics: dict
    intervals: dict
    converged: bool
    decided: bool
    stable: bool
    kv_limited: bool
    simulated_requests: int
    measured_requests: int
    warmup_requests: int
    window_s: float
    result: SimulationResult = field(repr=False)
    long_enough: bool = True

    def relative_half_widths(self) -> dict[str, float]:
        """key -> half-width / value of each interval (0 for a zero value)."""
        out = {}
        for key, (low, high) in self.intervals.items():
            value = self.metrics[key]
            out[key] = (high - low) / 2 / value if value > 0 else 0.0
        return out


def _t95(dof: int) -> float:
    known = max(d for d in _T95 if d <= dof)
    return _T95[known]


def _measured_window(requests: pd.DataFrame, first: int, stop: int) -> tuple[pd.DataFrame, float, float]:
    window = requests.iloc[first:stop]
    arrivals = window["arrival_time"].to_numpy()
    return window, float(arrivals.min()), float(arrivals.max())


def _itl_samples(steps: pd.DataFrame, requests: pd.DataFrame, t0: float, t1: float):
    """(gap seconds, tokens) of the decode steps that ended in (t0, t1]: each step's duration weighted by the
    tokens it emitted for sequences past their first token."""
    sel = steps[(steps["time_s"] > t0) & (steps["time_s"] <= t1)]
    times = sel["time_s"].to_numpy()
    first = requests["first_token_time"].to_numpy()
    seqs = requests["n"].to_numpy() if "n" in requests else np.ones(len(requests))
    ok = ~np.isnan(first)
    order = np.argsort(first[ok], kind="stable")
    sorted_first, sorted_n = first[ok][order], np.cumsum(seqs[ok][order])
    lo = np.searchsorted(sorted_first, times, side="left")
    hi = np.searchsorted(sorted_first, times, side="right")
    csum = np.concatenate(([0], sorted_n))
    first_tokens = csum[hi] - csum[lo]  # sequences whose first token this step emitted
    tokens = sel["tokens_generated"].to_numpy() - first_tokens
    return sel["step_time_ms"].to_numpy() / 1000.0, np.maximum(tokens, 0), times


def _weighted_percentiles(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    if weights.sum() <= 0:
        return np.full(len(PERCENTILES), np.nan)
    return np.percentile(values, PERCENTILES, weights=weights, method="inverted_cdf")


def _percentiles(window: pd.DataFrame, itl: tuple) -> dict[str, float]:
    out = {}
    latencies = request_latencies(window)
    for name in ("ttft", "tpot", "e2e", "queue"):
        values = latencies[name][~np.isnan(latencies[name])]
        if len(values):
            for q, v in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
                out[f"{name}_p{q}_s"] = float(v)
            out[f"mean_{name}_s"] = float(values.mean())
    gaps, tokens = itl[0], itl[1]
    if tokens.sum() > 0:
        for q, v in zip(PERCENTILES, _weighted_percentiles(gaps, tokens), strict=True):
            out[f"itl_p{q}_s"] = float(v)
        out["mean_itl_s"] = float((gaps * tokens).sum() / tokens.sum())
    return out


def _batch_intervals(window: pd.DataFrame, itl: tuple, batches: int, estimate: dict) -> dict:
    """key -> (low, high): the 95% interval of each percentile in `estimate` (`_quantile_interval`), the samples
    split into `batches` consecutive batches by arrival (an ITL gap by the time of its step)."""
    if not len(window):
        return {}
    bounds = np.linspace(0, len(window), batches + 1).astype(int)
    per_request = np.repeat(np.arange(batches), np.diff(bounds))
    # a gap belongs to the first batch whose last arrival its step did not follow (the last batch: any later)
    last_arrivals = window["arrival_time"].to_numpy()[np.maximum(bounds[1:-1] - 1, 0)]
    gap_batch = np.searchsorted(last_arrivals, itl[2], side="left")
    latencies = request_latencies(window)
    out = {}
    for name in STEADY_METRICS:
        if name == "itl":
            values, weights, batch_of = itl[0], itl[1].astype(np.float64), gap_batch
        else:
            raw = latencies[name]
            ok = ~np.isnan(raw)
            values, weights, batch_of = raw[ok], np.ones(int(ok.sum())), per_request[ok]
        for q in PERCENTILES:
            key = f"{name}_p{q}_s"
            if key in estimate:
                out[key] = _quantile_interval(values, weights, batch_of, batches, q, estimate[key])
    return out


def _quantile_interval(values, weights, batch_of, batches: int, q: float, value: float):
    """(low, high): the 95% interval of the q-th percentile `value` of the weighted samples, by batching its
    indicator: F, the weighted fraction of samples at or below `value`, is a mean, so its batch means give its
    interval, p +- t(0.975, batches - 1) x sd(batch fractions) / sqrt(batches), widened by their lag-1 autocorrelation and at least
    the independent samples' 1.96 x sqrt(p (1 - p) / n) (n the weights' effective count); the interval of the
    percentile is the samples' own percentiles at those two fractions. Before, each batch's own q-th percentile
    made the interval: measured over 30 seeds of issue 37's case at 2,400 requests against a 40,000-request run
    (docs/slo.md 3b), those intervals held the long run's ITL p50 / p99 in 27 % / 73 % of the seeds and its TPOT
    p99 in 87 %, and the TTFT p99's was 0.43 of its value wide (a batch's p99 stands on two or three samples);
    these hold every percentile in 90-100 % of them, the TTFT p99's 0.12 wide."""
    p = q / 100.0
    below = np.where(values <= value, weights, 0.0)
    mass = np.bincount(batch_of, weights=weights, minlength=batches)
    fractions = np.bincount(batch_of, weights=below, minlength=batches)[mass > 0] / mass[mass > 0]
    if len(fractions) > 1:
        half = _t95(batches - 1) * fractions.std(ddof=1) / math.sqrt(len(fractions))
        half *= math.sqrt(_correlation_inflation(fractions))
    else:
        half = math.inf
    effective = weights.sum() ** 2 / max((weights * weights).sum(), 1e-300)
    half = max(half, 1.96 * math.sqrt(p * (1 - p) / max(effective, 1.0)))
    lo_q, hi_q = 100.0 * max(p - half, 0.0), 100.0 * min(p + half, 1.0)
    if np.all(weights == 1.0):
        low, high = np.percentile(values, [lo_q, hi_q])
    else:
        low, high = np.percentile(values, [lo_q, hi_q], weights=weights, method="inverted_cdf")
    return (min(float(low), value), max(float(high), value))


def _correlation_inflation(values: np.ndarray) -> float:
    """(1 + r) / (1 - r), r the lag-1 autocorrelation of consecutive batch values clipped to [0, 0.9]: the
    factor by which correlated batches' variance of the mean exceeds independent ones' (an AR(1) process).
    Near capacity the batch and the queue drift for many lifetimes, and consecutive batches move together."""
    if len(values) < 4 or values.std() == 0:
        return 1.0
    centred = values - values.mean()
    r = float((centred[:-1] * centred[1:]).sum() / (centred * centred).sum())
    r = min(max(r, 0.0), 0.9)
    return (1 + r) / (1 - r)


def _window_load(
    steps: pd.DataFrame, window: pd.DataFrame, t0: float, t1: float, max_num_seqs: int, capacity
):
    """Throughput, batch, queue growth and the KV verdict of the steps that ended in (t0, t1]."""
    sel = steps[(steps["time_s"] > t0) & (steps["time_s"] <= t1)]
    span = t1 - t0
    dt = sel["step_time_ms"].to_numpy() / 1000.0
    busy = dt.sum()
    waiting = sel["waiting"].to_numpy()
    full = 1.0 - sel["free_slots"].to_numpy() / capacity >= KV_FULL
    held = (waiting > 0) & (sel["running_seqs"].to_numpy() < max_num_seqs) & full
    samples = window["n"].to_numpy() if "n" in window else 1
    offered = float((window["output_len"].to_numpy() * samples).sum())
    served = float(sel["tokens_generated"].sum())
    return {
        "throughput_tokens_per_s": served / span if span > 0 else 0.0,
        "offered_tokens_per_s": offered / span if span > 0 else 0.0,
        "request_throughput_per_s": len(window) / span if span > 0 else 0.0,
        "mean_running_batch": float((sel["running_seqs"].to_numpy() * dt).sum() / busy) if busy else 0.0,
        "mean_waiting": float((waiting * dt).sum() / busy) if busy else 0.0,
        "queue_growth": _growth(waiting, dt),
        "preemptions": int(sel["preemptions"].sum()),
        "preemptions_per_s": float(sel["preemptions"].sum() / span) if span > 0 else 0.0,
        "kv_limited": bool(sel["preemptions"].sum() > 0 or held.any()),
    }


def _growth(waiting: np.ndarray, dt: np.ndarray) -> float:
    """Mean queue length over the last fifth of the window's time minus that over its first fifth."""
    if len(waiting) < 10:
        return 0.0
    t = np.cumsum(dt)
    head, tail = t <= 0.2 * t[-1], t >= 0.8 * t[-1]
    head[0] = True  # a first step longer than a fifth of the window is the head alone
    return float(np.average(waiting[tail], weights=dt[tail]) - np.average(waiting[head], weights=dt[head]))


def steady_state(
    requests: Callable[[int], list[Request]],
    run: Callable[[list[Request], int], SimulationResult],
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    lifetime_s: float,
    max_num_seqs: int,
    settings: SteadyStateSettings | None = None,
    decided: Callable[["SteadyState"], bool] | None = None,
    focus: tuple[str, ...] | None = None,
) -> SteadyState:
    """The steady-state estimate of one replica (module docstring).

    requests(n): n requests (the same seeded draw's first ones for any n is not required); run(requests, until):
    the simulation stopping once the first `until` finished (`simulate(..., until_finished=until)`, with
    `concurrency=` for a closed loop). Exactly one of rate (requests/s, open loop) and concurrency (clients,
    closed loop). lifetime_s: a first guess of a request's lifetime (its idle latency). decided(estimate): True
    once the caller's question is answered, which ends the growth early (asked of stable estimates; the
    estimate's long_enough says whether its batches are long enough to trust its intervals). focus: the keys
    whose intervals must reach the tolerance (and size the growth); None: every percentile."""
    settings = settings or SteadyStateSettings()
    if (rate is None) == (concurrency is None):
        raise InvalidArgumentError("a steady state needs exactly one of rate (requests/s) and concurrency")
    measured, lifetime = settings.initial_measured, max(lifetime_s, 1e-9)
    while True:
        extra = _tail_requests(rate, concurrency, lifetime)
        warmup = min(_warmup_requests(settings, rate, concurrency, lifetime), settings.max_requests // 3)
        room = settings.max_requests - warmup - extra
        measured = max(settings.initial_measured, min(measured, room))
        total = warmup + measured
        result = run(requests(total + extra), total)
        estimate = _estimate(result, warmup, total, settings, max_num_seqs)
        measured_life = estimate.metrics.get("mean_e2e_s", lifetime)
        if estimate.stable and measured_life > 1.5 * lifetime and warmup < total // 2:
            lifetime = measured_life  # the warm-up was sized on too short a lifetime: size it again
            continue
        floor = _batch_floor(settings, rate, concurrency, max(lifetime, measured_life))
        estimate = replace(estimate, long_enough=measured >= floor)
        widths = estimate.relative_half_widths()
        if focus is not None:
            widths = {key: width for key, width in widths.items() if key in focus}
        narrow = bool(widths) and max(widths.values()) <= settings.tolerance
        converged = estimate.long_enough and narrow
        is_decided = decided is not None and estimate.stable and decided(estimate)
        worst = max(widths.values()) if widths else math.inf  # half-widths shrink as 1 / sqrt(requests)
        grown = math.ceil(measured * min(max((worst / settings.tolerance) ** 2, 2.0), MAX_GROWTH))
        grown = min(max(grown, floor), room)
        if converged or is_decided or not estimate.stable or grown <= measured:
            return replace(
                estimate,
                converged=bool(converged and estimate.stable),
                decided=is_decided,
                simulated_requests=total + extra,
            )
        measured, lifetime = grown, max(lifetime, measured_life)


def _warmup_requests(settings, rate, concurrency, lifetime) -> int:
    if concurrency is not None:
        return math.ceil(settings.warmup_lifetimes * concurrency)
    return max(10, math.ceil(settings.warmup_lifetimes * rate * lifetime))


def _batch_floor(settings, rate, concurrency, lifetime) -> int:
    """Measured requests enough for every batch to span `batch_lifetimes` mean lifetimes of arrivals: requests
    that run together share their steps, so batches shorter than a lifetime are correlated and their spread
    understates the interval."""
    per_lifetime = concurrency if concurrency is not None else rate * lifetime
    return math.ceil(settings.num_batches * settings.batch_lifetimes * per_lifetime)


def _tail_requests(rate, concurrency, lifetime) -> int:
    """Arrivals after the measured ones, enough to keep the load on until the last measured one finishes."""
    if concurrency is not None:
        return concurrency + 1
    return 20 + math.ceil(3 * rate * lifetime)


def _estimate(result: SimulationResult, warmup: int, total: int, settings, max_num_seqs) -> SteadyState:
    window, t0, t1 = _measured_window(result.requests, warmup, total)
    itl = _itl_samples(result.steps, result.requests, t0, t1)
    metrics = _percentiles(window, itl)
    capacity = result.capacity_slots or result.config.kv_capacity_tokens
    load = _window_load(result.steps, window, t0, t1, max_num_seqs, capacity)
    metrics |= {k: v for k, v in load.items() if k not in ("kv_limited", "queue_growth")}
    if (
        "prefix_hit_tokens" in window
    ):  # prompt tokens the prefix cache served, of the measured requests' prompts
        metrics["prefix_hit_rate"] = float(window["prefix_hit_tokens"].sum() / window["prompt_len"].sum())
        if "host_hit_tokens" in window:  # of those, HBM's and the host tier's (SimulatorConfig.offload)
            host = float(window["host_hit_tokens"].sum() / window["prompt_len"].sum())
            metrics["host_hit_rate"] = host
            metrics["gpu_hit_rate"] = metrics["prefix_hit_rate"] - host
    deficit = 1.0 - load["throughput_tokens_per_s"] / max(load["offered_tokens_per_s"], 1e-30)
    overloaded = deficit > 3 * OVERLOAD_SLACK or (
        deficit > OVERLOAD_SLACK and load["queue_growth"] > OVERLOAD_SLACK / 2 * len(window)
    )
    intervals = _batch_intervals(window, itl, settings.num_batches, metrics)
    return SteadyState(
        metrics,
        intervals,
        False,
        False,
        not overloaded,
        load["kv_limited"],
        total,
        len(window),
        warmup,
        t1 - t0,
        result,
    )
