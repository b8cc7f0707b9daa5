"""How often a steady-state estimate's 95% intervals hold the long run's percentiles; prints one JSON object.

    python -m bench.interval_coverage                           # the cross-model profile, 30 seeds
    python -m bench.interval_coverage --engine vllm             # the single-model profile

The case is issue 37's `predict`: Llama-3.1-8B on 2 x H100, 8 req/s of 4,000 / 256 tokens, a 3,500-token prefix
shared 8 ways, EAGLE 0.8, 0.6, 0.4. The truth is one long run (`--truth-requests` measured, seed 10,000). Then
`--seeds` runs (seeds 0, 1, ...) are each stopped at their first estimate of `--measured` requests
(`predict(..., decided=...)` answering at once). For every percentile key there are two intervals:
- "batch_indicator": the estimate's own (`core.serving.steady_state._quantile_interval`: batch means of the
  indicator 1[x <= the estimate], the fraction's interval mapped back through the window's own percentiles, and
  at least the independent samples' binomial width), the lab's intervals since issue 40's seventh stage;
- "batch_percentiles": what they replaced, batch means of each batch's own percentile
  (`batch_percentile_intervals` below; docs/slo.md 3b).
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


def batch_percentile_intervals(window, itl, batches: int, estimate: dict) -> dict:
    """key -> (low, high) by the method `core.serving.steady_state` used until issue 40's seventh stage: the
    batch means of each batch's own percentile (requests batched by arrival, an ITL gap by its step's time),
    t(0.975, batches - 1) x their standard deviation / sqrt(batches), widened for their lag-1 autocorrelation."""
    bounds = np.linspace(0, len(window), batches + 1).astype(int)
    arrivals = window["arrival_time"].to_numpy()
    per_batch = []
    for b in range(batches):
        part = window.iloc[bounds[b] : bounds[b + 1]]
        t0 = arrivals[bounds[b]] if b else -math.inf
        t1 = arrivals[bounds[b + 1] - 1] if b < batches - 1 else math.inf
        in_part = (itl[2] > t0) & (itl[2] <= t1)
        per_batch.append(ss._percentiles(part, (itl[0][in_part], itl[1][in_part])))
    t = ss._t95(batches - 1)
    out = {}
    for key in ss.metric_keys():
        if key not in estimate:
            continue
        values = np.array([p.get(key, np.nan) for p in per_batch])
        values = values[~np.isnan(values)]
        half = t * values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else math.inf
        half *= math.sqrt(ss._correlation_inflation(values))
        out[key] = (estimate[key] - half, estimate[key] + half)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.interval_coverage", description=__doc__.splitlines()[0]
    )
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
            ("batch_percentiles", batch_percentile_intervals(window, itl, batches, state.metrics)),
            ("batch_indicator", state.intervals),
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
