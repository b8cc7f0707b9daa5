"""The highest Poisson rate a deployment holds within latency targets (`max_rate`, MLPerf's Server figure):
bisection on the rate, each point a steady-state prediction (`core.planning.predict`).

A rate holds when its steady state is stable (the load is served) and every target {metric}_p{q}_s is met by
the prediction. The bracket starts at the rate one replica's batch could sustain at its idle speed and is
widened by halving / doubling until one end holds and the other does not; then bisected to `rel_tol`.
"""

from dataclasses import dataclass, replace

from core.common import check_float
from core.errors import InvalidArgumentError
from core.planning.load import Load
from core.planning.predict import Deployment, Prediction, idle_lifetime, predict
from core.serving.steady_state import SteadyStateSettings, metric_keys

# The searches' estimates (max_rate's bisection, the SLO search): 10% intervals over batches of 3 lifetimes
SEARCH_SETTINGS = SteadyStateSettings(
    tolerance=0.1, initial_measured=300, max_requests=3000, batch_lifetimes=3.0
)


def check_targets(targets: dict) -> dict[str, float]:
    """`targets` (key -> seconds) with every key a percentile key and every value positive and finite."""
    if not targets:
        raise InvalidArgumentError("give at least one latency target (e.g. --ttft-p99 or --tpot-p99)")
    out = {}
    for key, value in targets.items():
        if key not in metric_keys():
            raise InvalidArgumentError(f"unknown target {key!r}; targets are {', '.join(metric_keys())}")
        out[key] = check_float(value, key, minimum=0.0, exclusive_minimum=True, maximum=3600.0)
    return out


def meets(prediction: Prediction, targets: dict[str, float]) -> bool:
    m = prediction.metrics
    return prediction.stable and all(m.get(k) is not None and m[k] <= t for k, t in targets.items())


def limiting(prediction: Prediction, targets: dict[str, float]) -> str:
    """The target with the largest predicted / target ratio, or "rate" when the load is not served."""
    if not prediction.stable:
        return "rate"
    m = prediction.metrics
    return max(targets, key=lambda k: (m.get(k) or float("inf")) / targets[k])


@dataclass(frozen=True, eq=False)
class MaxRate:
    """max_req_per_s: the highest rate found to hold (0 when even the lowest tried misses); at: the prediction
    there (None when none holds); binding: the target (or "rate") that the next higher rate missed on."""

    max_req_per_s: float
    at: Prediction | None
    binding: str
    evaluations: int


def max_rate(
    deployment: Deployment, load: Load, targets: dict, rel_tol: float = 0.03, step_time=None
) -> MaxRate:
    """The highest rate of `load`'s lengths that `deployment` serves within `targets` (module docstring)."""
    targets = check_targets(targets)
    step = deployment.step_model(step_time)
    base = replace(load, rate=1.0, concurrency=None)
    guess = (
        deployment.replicas
        * deployment.max_num_seqs
        / idle_lifetime(step, base, deployment.max_num_batched_tokens)
    )
    evaluations = 0

    def at(rate: float) -> Prediction:
        nonlocal evaluations
        evaluations += 1
        return predict(deployment, replace(base, rate=rate), step_time, SEARCH_SETTINGS)

    lo, lo_pred, hi, hi_pred = None, None, guess, at(guess)
    while meets(hi_pred, targets) and hi < 1e6:
        lo, lo_pred, hi = hi, hi_pred, hi * 2
        hi_pred = at(hi)
    while lo is None:
        low = hi / 4
        pred = at(low)
        if meets(pred, targets):
            lo, lo_pred = low, pred
        else:
            hi, hi_pred = low, pred
            if low < 1e-4:
                return MaxRate(0.0, None, limiting(pred, targets), evaluations)
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        pred = at(mid)
        if meets(pred, targets):
            lo, lo_pred = mid, pred
        else:
            hi, hi_pred = mid, pred
    return MaxRate(lo, lo_pred, limiting(hi_pred, targets), evaluations)
