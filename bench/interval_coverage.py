"""How often a steady-state estimate's 95% intervals hold the long run's percentiles; prints one JSON object.

    python -m bench.interval_coverage                           # the cross-model profile, 30 seeds
    python -m bench.interval_coverage --engine vllm             # the single-model profile

The case is issue 37's `predict`: Llama-3.1-8B on 2 x H100, 8 req/s of 4,000 / 256 tokens, a 3,500-token prefix
shared 8 ways, EAGLE 0.8, 0.6, 0.4. The truth is one long run (`--truth-requests` measured, seed 10,000). Then
`--seeds` runs (seeds 0, 1, ...) are each stopped at their first estimate of `--measured` requests
(`predict(..., decided=...)` answering at once). For every percentile key there are two intervals:
- "batch_percentiles": the estimate's own (`core.serving.steady_state`: batch means of each batch's percentile);
- "batch_indicator": batch means of the indicator 1[x <= the estimate], the fraction's interval mapped back
  through the window's own percentiles, and at least the independent samples' binomial width (`indicator_interval`
  below; docs/slo.md 2c, "The default profile", tried as the replacement).
Per key it prints the share of seeds whose interval holds the truth ("coverage") and the median half-width over
the estimate. It is a measurement, not a target. Seconds of CPU: ~70 for the truth, ~1-2 per seed.
"""

import argparse
import json
import math
import os
import platform
import time

import numpy as np

from bench.machine import machine_facts
from core.kernels.cpu_isa import cpu_description
from core.planning.cost.fits.engine_profiles import DEFAULT_ENGINE, ENGINES
from core.planning.cost.speculative import Speculation
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving import steady_state as ss
from core.serving.latency import PERCENTILES, request_latencies
from core.serving.steady_state import SteadyStateSettings

TRUTH_SEED = 10_000


def first_estimate(engine: str, seed: int, measured: int):
    """(the estimate, its measured window, its ITL samples, its batch count) of issue 37's case, stopped at its
    first estimate of `measured` requests."""
    deployment = Deployment(
        "llama-3.1-8b",
        "h100-80gb",
        replicas=2,
        engine=engine,
        speculation=Speculation(3, (0.8, 0.6, 0.4), "eagle"),
    )
    load = Load(8.0, 4000, 256, seed=seed, shared_prefix_len=3500, num_prefixes=8)
    settings = SteadyStateSettings(initial_measured=measured, max_requests=3 * measured + 1000)
    state = predict(deployment, load, settings=settings, decided=lambda estimate: True).state
    total = state.warmup_requests + state.measured_requests
    window, t0, t1 = ss._measured_window(state.result.requests, state.warmup_requests, total)
    itl = ss._itl_samples(state.result.steps, state.result.requests, t0, t1)
    return state, window, itl, settings.num_batches


def indicator_interval(
    values, weights, batch_of, batches: int, q: float, value: float
) -> tuple[float, float]:
    """The 95% interval of the q-th percentile `value` by batch means of its indicator (module docstring)."""
    p = q / 100.0
    below = (values <= value).astype(np.float64) * weights
    mass = np.bincount(batch_of, weights=weights, minlength=batches)
    fractions = np.bincount(batch_of, weights=below, minlength=batches)[mass > 0] / mass[mass > 0]
    half = ss._t95(len(fractions) - 1) * fractions.std(ddof=1) / math.sqrt(len(fractions))
    half *= math.sqrt(ss._correlation_inflation(fractions))
    effective = weights.sum() ** 2 / (weights * weights).sum()
    half = max(half, 1.96 * math.sqrt(p * (1 - p) / effective))
    ends = [100 * max(p - half, 0.0), 100 * min(p + half, 1.0)]
    if np.all(weights == 1.0):
        low, high = np.percentile(values, ends)
    else:
        low, high = np.percentile(values, ends, weights=weights, method="inverted_cdf")
    return min(float(low), value), max(float(high), value)


def indicator_intervals(window, itl, batches: int, estimate: dict) -> dict:
    """key -> `indicator_interval` for every percentile of `estimate`: requests batched by arrival as the
    estimate batches them, an ITL gap by its step's time (weighted by the tokens that waited it)."""
    bounds = np.linspace(0, len(window), batches + 1).astype(int)
    per_request = np.repeat(np.arange(batches), np.diff(bounds))
    last_arrivals = window["arrival_time"].to_numpy()[np.maximum(bounds[1:-1] - 1, 0)]
    gap_batch = np.searchsorted(last_arrivals, itl[2], side="left")
    latencies = request_latencies(window)
    out = {}
    for name in ss.STEADY_METRICS:
        if name == "itl":
            values, weights, batch_of = itl[0], itl[1].astype(np.float64), gap_batch
        else:
            ok = ~np.isnan(latencies[name])
            values, weights, batch_of = latencies[name][ok], np.ones(int(ok.sum())), per_request[ok]
        for q in PERCENTILES:
            key = f"{name}_p{q}_s"
            if key in estimate:
                out[key] = indicator_interval(values, weights, batch_of, batches, q, estimate[key])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE)
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--measured", type=int, default=2400)
    parser.add_argument("--truth-requests", type=int, default=40_000)
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    truth_state = first_estimate(args.engine, TRUTH_SEED, args.truth_requests)[0]
    truth = {k: truth_state.metrics[k] for k in ss.metric_keys() if k in truth_state.metrics}
    held = {method: {k: [] for k in truth} for method in ("batch_percentiles", "batch_indicator")}
    widths = {method: {k: [] for k in truth} for method in held}
    for seed in range(args.seeds):
        state, window, itl, batches = first_estimate(args.engine, seed, args.measured)
        for method, intervals in (
            ("batch_percentiles", state.intervals),
            ("batch_indicator", indicator_intervals(window, itl, batches, state.metrics)),
        ):
            for key, value in truth.items():
                if key in intervals:
                    low, high = intervals[key]
                    held[method][key].append(low <= value <= high)
                    widths[method][key].append((high - low) / 2 / state.metrics[key])
    print(
        json.dumps(
            {
                "cpu": cpu_description(),
                "machine": machine_facts(load_before, python=platform.python_version()),
                "case": "issue 37's predict: llama-3.1-8b, 2 x h100-80gb, 8 req/s, 4000 / 256, prefix 3500 x 8, eagle",
                "engine": args.engine,
                "seeds": args.seeds,
                "measured_requests": args.measured,
                "truth": {
                    "seed": TRUTH_SEED,
                    "measured_requests": truth_state.measured_requests,
                    "values": truth,
                },
                "coverage": {
                    m: {k: float(np.mean(v)) for k, v in keys.items() if v} for m, keys in held.items()
                },
                "median_relative_half_width": {
                    m: {k: float(np.median(v)) for k, v in keys.items() if v} for m, keys in widths.items()
                },
                "elapsed_s": time.perf_counter() - started,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
