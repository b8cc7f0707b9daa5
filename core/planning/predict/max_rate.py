"""The highest Poisson rate a deployment holds within latency targets (`max_rate`, MLPerf's Server figure):
bisection on the rate, each point a steady-state prediction (`core.planning.predict.prediction`).

A rate holds when its steady state is stable (the load is served) and every target {metric}_p{q}_s is met by
the prediction, each prediction simulated until its verdict on the targets is clear (`core.planning.predict.early_stop`).
Rates are searched on a fixed geometric grid, (1 + rel_tol)^k req/s, so the answer does not depend on where the
bracket starts: it starts at a rate known to hold (`holds_at`, checked) and twice it, or at the rate one
replica's batch could sustain at its idle speed, and is widened by halving / doubling until one end holds and
the other does not; then bisected to adjacent grid rates.

`MaxRate.to_dict` is the JSON object `python -m core.planning max-rate` prints (and the SLO page shows): the rate,
the target the next rate misses, the steady state at the rate, and the `vllm bench serve` command that replays
the load at that rate, so the claim can be checked on the GPU it is for.
"""

import math
from dataclasses import dataclass, replace

from core.common import check_float
from core.errors import InvalidArgumentError
from core.planning.predict.deployment import Deployment
from core.planning.predict.early_stop import SEARCH_SETTINGS, verdict_decider
from core.planning.predict.load import Load
from core.planning.predict.prediction import Prediction, idle_lifetime, predict
from core.planning.predict.target_fields import check_targets as check_target_values
from core.planning.predict.vllm_bench import bench_command, bench_num_prompts, in_flight


def check_targets(targets: dict) -> dict[str, float]:
    """`targets` (key -> seconds) with every key a percentile key and every value checked by its field
    (`core.planning.predict.target_fields`: positive, finite, at most an hour; the message names the flag)."""
    if not targets:
        raise InvalidArgumentError("give at least one latency target (e.g. --ttft-p99 or --tpot-p99)")
    return check_target_values(targets)


def meets(prediction: Prediction, targets: dict[str, float]) -> bool:
    m = prediction.metrics
    return prediction.stable and all(m.get(k) is not None and m[k] <= t for k, t in targets.items())


def limiting(prediction: Prediction, targets: dict[str, float]) -> str:
    """The target with the largest predicted / target ratio, or "rate" when the load is not served."""
    if not prediction.stable:
        return "rate"
    m = prediction.metrics
    return max(targets, key=lambda k: (m.get(k) or float("inf")) / targets[k])


COMMAND_DIGITS = 4  # significant digits of the rate in MaxRate's bench command (11.976416... -> 11.97)


def round_down(value: float, digits: int) -> float:
    """`value` > 0 rounded down to `digits` significant digits (11.976416 -> 11.97 at 4)."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    return math.floor(value * scale * (1 + 1e-12)) / scale  # 1e-12: 11.97 stored as 11.969999... stays 11.97


@dataclass(frozen=True, eq=False)
class MaxRate:
    """max_req_per_s: the highest rate found to hold (0 when even the lowest tried misses); at: the prediction
    there (None when none holds); binding: the target (or "rate") that the next higher rate missed on."""

    max_req_per_s: float
    at: Prediction | None
    binding: str
    evaluations: int

    def to_dict(self, deployment: Deployment, load: Load, targets: dict) -> dict:
        """max_rate_req_per_s, binding, targets, evaluations, deployment (its flags), profile_check,
        vllm_bench_command (`vllm bench serve` of `load` at max_req_per_s rounded down to COMMAND_DIGITS
        significant digits (a rate no higher than the one found), its prompts sized from the requests in flight there; None when
        no rate holds), then the prediction at the rate (`Prediction.to_dict`)."""
        command = None
        if self.at is not None:
            at_load = replace(load, rate=round_down(self.max_req_per_s, COMMAND_DIGITS), concurrency=None)
            flying = in_flight(self.at.stable, self.at.metrics.get("mean_e2e_s"), deployment, at_load)
            command = bench_command(deployment.model_spec, at_load, bench_num_prompts(at_load, flying))
        body = {
            "max_rate_req_per_s": self.max_req_per_s,
            "binding": self.binding,
            "targets": targets,
            "evaluations": self.evaluations,
            "deployment": deployment.flags(),
            "profile_check": deployment.profile_check(),
            "vllm_bench_command": command,
        }
        return body | (self.at.to_dict() if self.at is not None else {})


def max_rate(
    deployment: Deployment,
    load: Load,
    targets: dict,
    rel_tol: float = 0.03,
    step_time=None,
    holds_at: float | None = None,
) -> MaxRate:
    """The highest rate of `load`'s lengths that `deployment` serves within `targets` (module docstring): the
    highest rate of the grid (1 + rel_tol)^k req/s (k an integer) that holds, so any starting bracket finds the
    same one. Each prediction stops once its verdict on the targets is clear (`core.planning.predict.early_stop`).
    holds_at: a rate already found to hold (e.g. the SLO search's), where the bracket starts instead of the idle
    guess (checked; ignored when it does not hold)."""
    targets = check_targets(targets)
    check_float(rel_tol, "rel_tol", minimum=1e-3, maximum=1.0)
    base = replace(load, rate=1.0, concurrency=None)
    decided, focus = verdict_decider(targets), tuple(targets)
    grid = math.log1p(rel_tol)
    preds: dict[int, Prediction] = {}

    def holds(k: int) -> bool:
        if k not in preds:
            preds[k] = predict(
                deployment, replace(base, rate=math.exp(k * grid)), step_time, SEARCH_SETTINGS, decided, focus
            )
        return meets(preds[k], targets)

    octave = math.ceil(math.log(2) / grid)  # grid steps in a doubling
    if holds_at is not None and holds(
        lo := math.floor(math.log(check_float(holds_at, "holds_at", minimum=1e-4)) / grid)
    ):
        hi = lo + octave
    else:
        step = deployment.step_model(step_time)
        guess = (
            deployment.ranks
            * deployment.max_num_seqs
            / idle_lifetime(step, base, deployment.max_num_batched_tokens)
        )
        lo, hi = None, math.ceil(math.log(guess) / grid)
    while holds(hi) and hi * grid < math.log(1e6):
        lo, hi = hi, hi + octave
    while lo is None:
        low = hi - 2 * octave
        if holds(low):
            lo = low
        else:
            hi = low
            if low * grid < math.log(1e-4):
                return MaxRate(0.0, None, limiting(preds[low], targets), len(preds))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return MaxRate(math.exp(lo * grid), preds[lo], limiting(preds[hi], targets), len(preds))
