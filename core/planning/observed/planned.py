"""Planned vs observed for a live server: fit the step-time model to the server's own histograms over a window,
predict the window's TTFT / TPOT percentiles with the simulator, and compare them with what the server observed.

    window = observe_window(before, after, seconds)          # core.live.window: two scrapes of /metrics
    result = plan_against_observed(window, base, limits)     # base: the roofline of the server's model + hardware

Method (docs/live-planned.md):
1. Workload: as many requests as the window finished, arriving as a Poisson process at the window's request rate
   from an idle server (as a window that starts idle does), prompt and output lengths drawn from the window's
   request_prompt_tokens / request_generation_tokens buckets (uniform inside a bucket) and rescaled to the exact
   means the histograms' sums give; several independent draws (at least `sim_requests` requests in all) pooled,
   so the simulated figures are not one draw's noise. Seeded: the same draws in every simulation.
2. Fit (method of simulated moments): FIT_PARAMETERS of `base`, overhead_s (fixed time per step) and
   flops_efficiency (of base's peak x flops_headroom: 1 for a GPU's datasheet peak, MEASURED_ROOF_HEADROOM for a
   roof measured on a busy CPU, which the engine's GEMMs can beat), are solved so that the simulator, serving
   that workload under the server's scheduler limits, reproduces two means the histograms give exactly
   (sum / count): the mean prefill time per request
   (vllm:request_prefill_time_seconds: first scheduled -> first token) and the mean inter-token latency
   (vllm:inter_token_latency_seconds). Two nested monotone root searches on the log parameters (`fit_to_window`);
   a parameter the data push past its bound is held there (`at_bound`), and the other moment then fits alone.
   The inner search (overhead for the ITL) steps in overhead_s and ITL themselves (the mean ITL is close to linear
   in the overhead) and, once flops_efficiencies on both sides are solved, starts from their overheads (o(e)
   grows with e): a guess interpolated between them, one Newton step with the last solved slope, the bracket
   sought outwards only when those miss. 10-20 simulations per fit instead of 35-50; the same tolerance.
3. Planned figures: the fitted model's simulation of the workload; its per-request TTFT and TPOT counted into
   vLLM's buckets and read with the same histogram_quantile as the observed ones (`planned`), so both carry the
   same bucket error; the simulator's exact percentiles are kept too (`planned_exact`).

What histograms identify, and what they do not: two exact means pin two parameters. bandwidth_efficiency is held
(`base`'s value): a decode step's time is overhead + weights / (bandwidth x efficiency) + ..., and one mean
cannot split the fixed part between the two; the fitted overhead_s absorbs whatever the held efficiency leaves.
per_token_overhead_s and single_token_overhead_s are held too (a one-token step's cost is not separable from
batched ones in a per-token histogram). Percentiles are predictions, not fitted: the TTFT tail comes from queueing
in the simulator's schedule, the TPOT spread from batch sizes. The rate is a mean (Poisson assumed): a bursty
window queues more than the plan.
"""

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from core.errors import InvalidArgumentError
from core.live.histogram import Histogram
from core.live.window import LATENCY_KEYS, ObservedWindow, bucketed
from core.metric_names import ITL_BUCKETS, TTFT_BUCKETS
from core.planning.cost.step_model import StepTimeModel
from core.serving.latency import latency_summary
from core.serving.memory_policies import paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request, poisson_arrivals

FIT_PARAMETERS = ("overhead_s", "flops_efficiency")
MIN_REQUESTS = 20  # finished requests a window needs before its percentiles mean anything
MAX_ITERATIONS = 20  # root-search steps, per search
TOLERANCE = 0.005  # |log(simulated / observed)| a root search stops at
MEASURED_ROOF_HEADROOM = 4.0  # a measured CPU roof is a sample: the fit may find up to 4x its FLOP/s


@dataclass(frozen=True)
class ServerLimits:
    """The scheduler limits the simulator serves the workload under (the server's): KV capacity in tokens, block
    size, running sequences, tokens per step, longest sequence."""

    kv_capacity_tokens: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_seq_len: int


@dataclass(frozen=True)
class FitSettings:
    """How `plan_against_observed` fits: sim_requests (simulated requests in all, pooled over draws), seed (of
    the first draw), min_requests (finished requests the window needs), flops_headroom (>= 1: 1 for a GPU's
    datasheet peak, MEASURED_ROOF_HEADROOM for a roof measured on a busy CPU)."""

    sim_requests: int = 240
    seed: int = 0
    min_requests: int = MIN_REQUESTS
    flops_headroom: float = 1.0


@dataclass(frozen=True)
class HistogramFit:
    """model: `base` with FIT_PARAMETERS fitted; at_bound: those held at a bound; observed / simulated: the two
    moments (prefill_mean_s, itl_mean_s) of the server and of the fitted model's simulation; iterations: the
    simulations run; converged: both moments within 2 x TOLERANCE in log (False when a bound stopped the fit).
    flops_vs_roof: the fitted FLOP/s as a fraction of `base`'s peak_flops (above 1 only with a headroom: the
    model's peak_flops is then base's x headroom, its flops_efficiency this / headroom)."""

    model: StepTimeModel
    at_bound: tuple[str, ...]
    observed: dict
    simulated: dict
    iterations: int
    converged: bool
    flops_vs_roof: float = 1.0

    def to_dict(self) -> dict:
        return {
            **{name: getattr(self.model, name) for name in FIT_PARAMETERS},
            "flops_vs_roof": self.flops_vs_roof,
            "bandwidth_efficiency_held": self.model.bandwidth_efficiency,
            "at_bound": list(self.at_bound),
            "observed": self.observed,
            "simulated": self.simulated,
            "iterations": self.iterations,
            "converged": self.converged,
        }


@dataclass(frozen=True)
class PlannedVsObserved:
    """planned / observed: LATENCY_KEYS -> seconds, both by histogram_quantile over vLLM's buckets; planned_exact:
    the simulator's own percentiles; rel_errors: |planned - observed| / observed (None where undefined). prior:
    the same workload simulated with the step-time model as the SLO planner prices it (the engine profile, no
    fit to this window), bucketed the same way; None when no prior model was given."""

    window: ObservedWindow
    fit: HistogramFit
    planned: dict
    planned_exact: dict
    observed: dict
    prior: dict | None = None

    @property
    def rel_errors(self) -> dict:
        return _rel_errors(self.planned, self.observed)

    @property
    def prior_rel_errors(self) -> dict | None:
        """|prior - observed| / observed: how far the SLO planner's own prediction (no fit) was."""
        return None if self.prior is None else _rel_errors(self.prior, self.observed)

    def to_dict(self) -> dict:
        w = self.window
        return {
            "window": {
                "seconds": w.seconds,
                "requests": w.requests,
                "request_rate": w.request_rate,
                "mean_prompt_tokens": w.mean_prompt_tokens,
                "mean_output_tokens": w.mean_output_tokens,
                "steps": w.steps,
                "tpot_source": w.tpot_source,
            },
            "fit": self.fit.to_dict(),
            "planned": self.planned,
            "planned_exact": self.planned_exact,
            "observed": self.observed,
            "rel_errors": self.rel_errors,
            "prior": self.prior,
            "prior_rel_errors": self.prior_rel_errors,
        }


def _rel_errors(planned: dict, observed: dict) -> dict:
    out = {}
    for key in LATENCY_KEYS:
        p, o = planned.get(key), observed.get(key)
        out[key] = abs(p - o) / o if p is not None and o else None
    return out


def sample_lengths(hist: Histogram, n: int, rng: np.random.Generator) -> np.ndarray:
    """n integer lengths >= 1 drawn from `hist`'s buckets (bucket by its share of the count, uniform integer in
    (lower, upper]; the +Inf bucket taken as the last finite bound), rescaled to `hist`'s exact mean."""
    if hist.count <= 0:
        raise InvalidArgumentError("a length histogram with no observation cannot be sampled")
    counts = np.diff(np.asarray((0.0, *hist.cumulative)))
    finite = [b for b in hist.bounds if math.isfinite(b)]
    upper = np.array([b if math.isfinite(b) else finite[-1] for b in hist.bounds])
    lower = np.concatenate(([0.0], upper[:-1]))
    lower = np.minimum(lower, upper - 1)
    which = rng.choice(len(counts), size=n, p=counts / counts.sum())
    draws = rng.integers(lower[which] + 1, upper[which] + 1).astype(np.float64)
    draws *= hist.sum / hist.count / draws.mean()
    return np.maximum(1, np.rint(draws)).astype(np.int64)


def window_workload(window: ObservedWindow, n: int, limits: ServerLimits, seed: int = 0) -> list[Request]:
    """n requests like the window's: Poisson arrivals at its rate, lengths from its token histograms (each
    request capped to max_seq_len tokens, its output kept >= 1)."""
    if window.request_rate <= 0:
        raise InvalidArgumentError("the window finished no request: there is no workload to plan")
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(n, window.request_rate, rng)
    prompts = np.minimum(sample_lengths(window.prompt_tokens, n, rng), limits.max_seq_len - 1)
    outputs = np.minimum(sample_lengths(window.output_tokens, n, rng), limits.max_seq_len - prompts)
    return [Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(n)]


def window_workloads(
    window: ObservedWindow, total: int, limits: ServerLimits, seed: int = 0
) -> list[list[Request]]:
    """Independent draws of `window_workload` the size of the window (its finished requests, at least 1), as many
    as make `total` requests or more; draw k uses seed + k."""
    n = max(1, round(window.requests))
    return [window_workload(window, n, limits, seed + k) for k in range(max(1, math.ceil(total / n)))]


def _simulate(workloads: list[list[Request]], model: StepTimeModel, limits: ServerLimits) -> pd.DataFrame:
    """The simulated requests of every workload (each served from an idle server), concatenated."""
    config = SimulatorConfig(
        kv_capacity_tokens=limits.kv_capacity_tokens,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_seq_len=limits.max_seq_len,
        step_time=model,
        max_snapshots=1,
    )
    policy = paged(limits.block_size)
    return pd.concat([simulate(w, policy, config).requests for w in workloads], ignore_index=True)


def simulated_moments(frame: pd.DataFrame) -> dict:
    """The two fitted moments of a simulation's requests: mean first scheduled -> first token (vLLM's
    request_prefill_time) and mean inter-token latency (decode time summed over requests / tokens after the
    first: the ITLs of a request tile its decode time)."""
    done = frame[frame["finish_time"].notna()]
    decode = (done["finish_time"] - done["first_token_time"]).sum()
    gaps = (done["output_len"] - 1).clip(lower=0).sum()
    return {
        "prefill_mean_s": float((done["first_token_time"] - done["admit_time"]).mean()),
        "itl_mean_s": float(decode / gaps) if gaps > 0 else math.nan,
    }


def observed_moments(window: ObservedWindow) -> dict:
    return {"prefill_mean_s": window.prefill_time.mean, "itl_mean_s": window.itl.mean}


def _with(base: StepTimeModel, overhead_s: float, flops_efficiency: float) -> StepTimeModel:
    return replace(base, overhead_s=overhead_s, flops_efficiency=flops_efficiency)


def _root(
    f, lo: float, hi: float, start: tuple | None = None, linear: bool = False
) -> tuple[float, float, int]:
    """(x, f(x), evaluations) for an increasing f on [lo, hi] (log parameters): the end when f has one sign on the
    whole interval (the parameter at its bound), else the Illinois variant of regula falsi to |f| <= TOLERANCE.
    linear: interpolate in exp(x) and exp(f) - 1 (the parameter and the moment's ratio, for a moment near linear
    in the parameter). start, (x0, slope, a, b): a first guess, the slope of v(f) against u(x) (the interpolation
    coordinates) for a Newton step from it, and a <= b where the root likely lies: the bracket is then sought
    from x0 and that step outwards (a or b, then lo or hi: an end of [lo, hi] only when f says the root is past
    the points tried), not from [lo, hi]'s ends: the same root and stop, fewer evaluations."""
    u, u_inv, v = (math.exp, math.log, math.expm1) if linear else (_same, _same, _same)
    if start is None:
        f_lo, f_hi, evals = f(lo), f(hi), 2
    else:
        x0, slope, a, b = start
        seen: dict = {}
        x = min(max(x0, lo), hi)
        while True:
            fx = seen[x] = f(x)
            if abs(fx) <= TOLERANCE:
                return x, fx, len(seen)
            pos = [p for p in seen if seen[p] > 0]
            neg = [n for n in seen if seen[n] < 0 and (not pos or n < min(pos))]
            if pos and neg:
                lo, hi = max(neg), min(pos)
                f_lo, f_hi, evals = seen[lo], seen[hi], len(seen)
                break
            if len(seen) == 1 and slope and slope > 0:  # the Newton step
                step = min(max(u(x) - v(fx) / slope, u(lo)), u(hi))
                x = min(max(u_inv(step), lo), hi)
                if x not in seen:
                    continue
            if pos and len(pos) < len(seen):  # a negative above a positive: not monotone here, so [lo, hi]
                f_lo = seen[lo] if lo in seen else f(lo)
                f_hi = seen[hi] if hi in seen else f(hi)
                evals = len(seen) + (lo not in seen) + (hi not in seen)
                break
            if pos:  # the root is below every point tried
                edge = min(seen)
                if edge <= lo:
                    return lo, seen[lo], len(seen)
                x = a if a < edge else lo
            else:
                edge = max(seen)
                if edge >= hi:
                    return hi, seen[hi], len(seen)
                x = b if b > edge else hi
    if f_lo >= 0 or f_hi <= 0:
        return (lo, f_lo, evals) if f_lo >= 0 else (hi, f_hi, evals)
    u_lo, u_hi, v_lo, v_hi = u(lo), u(hi), v(f_lo), v(f_hi)
    side = 0
    for _ in range(MAX_ITERATIONS):
        x = min(max(u_inv(u_hi - v_hi * (u_hi - u_lo) / (v_hi - v_lo)), lo), hi)
        fx = f(x)
        evals += 1
        if abs(fx) <= TOLERANCE:
            return x, fx, evals
        if fx < 0:
            lo, u_lo, v_lo = x, u(x), v(fx)
            v_hi = v_hi / 2 if side == -1 else v_hi
            side = -1
        else:
            hi, u_hi, v_hi = x, u(x), v(fx)
            v_lo = v_lo / 2 if side == 1 else v_lo
            side = 1
    return x, fx, evals


def _same(x: float) -> float:
    return x


def _start(chosen: dict, slopes: list, log_e: float) -> tuple | None:
    """`_root`'s start for the overhead at log_e, from the overheads o(e) already solved: o(e) grows with e (a
    faster FLOP/s leaves more of the mean ITL to overhead), so it lies between o at the nearest solved e below and
    at the nearest above; the guess interpolates o linearly in log e between them, the slope (of ITL / target
    against o) is the last solved one's. None unless both sides were solved."""
    below = [e for e in chosen if e < log_e]
    above = [e for e in chosen if e > log_e]
    if not below or not above:
        return None
    (e0, o0), (e1, o1) = ((e, chosen[e]) for e in (max(below), min(above)))
    guess = math.exp(o0) + (math.exp(o1) - math.exp(o0)) * (log_e - e0) / (e1 - e0)
    return math.log(guess), slopes[-1] if slopes else None, min(o0, o1), max(o0, o1)


def _slope(cache: dict, log_o: float, log_e: float, target: float) -> float | None:
    """d(ITL / target) / d overhead_s at log_e near log_o, from the two simulations at log_e nearest to it."""
    near = sorted((abs(k[0] - log_o), k[0]) for k in cache if k[1] == round(log_e, 12))[:2]
    if len(near) < 2:
        return None
    (_, x0), (_, x1) = near
    v0, v1 = (cache[(x, round(log_e, 12))][1]["itl_mean_s"] / target for x in (x0, x1))
    return (v1 - v0) / (math.exp(x1) - math.exp(x0))


def fit_to_window(
    window: ObservedWindow,
    base: StepTimeModel,
    limits: ServerLimits,
    workloads: list[list[Request]],
    flops_headroom: float = 1.0,
) -> tuple[HistogramFit, pd.DataFrame]:
    """Fit FIT_PARAMETERS (module docstring, step 2) on `workloads` (the window's); (the fit, the fitted
    model's simulated requests). Both moments grow with overhead_s and shrink with flops_efficiency, so the fit
    nests two monotone root searches: for a flops_efficiency e, the overhead o(e) that matches the mean ITL;
    then the e at which o(e) also matches the mean prefill time (the inner search started from the o(e) already
    solved on either side of e, and interpolating in o and ITL, not their logs: `_start`, `_root`). Bounds: overhead_s in [1 us, the mean ITL],
    flops_efficiency in [1e-3, 1] of base's peak_flops x `flops_headroom` (1 for a datasheet peak; more for a
    roof measured on a shared machine, which a quieter moment of the server can beat). Raises
    InvalidArgumentError when the window has no prefill or ITL observation."""
    if not flops_headroom >= 1:
        raise InvalidArgumentError(f"flops_headroom must be >= 1, got {flops_headroom!r}")
    base = replace(base, peak_flops=base.peak_flops * flops_headroom)
    target = observed_moments(window)
    if not all(v and v > 0 for v in target.values()):
        raise InvalidArgumentError("the window has no prefill time or inter-token latency to fit")
    cache: dict = {}

    def run(log_o: float, log_e: float):
        key = (round(log_o, 12), round(log_e, 12))
        if key not in cache:
            frame = _simulate(workloads, _with(base, math.exp(log_o), math.exp(log_e)), limits)
            cache[key] = (frame, simulated_moments(frame))
        return cache[key]

    def itl_gap(log_o: float, log_e: float) -> float:
        return math.log(run(log_o, log_e)[1]["itl_mean_s"] / target["itl_mean_s"])

    o_bounds = (math.log(1e-6), math.log(target["itl_mean_s"]))
    chosen: dict = {}
    slopes: list = []

    def prefill_gap(log_e: float) -> float:  # decreasing in e: returned negated, increasing
        start = _start(chosen, slopes, log_e)
        log_o, _, _ = _root(lambda lo: itl_gap(lo, log_e), *o_bounds, start, linear=True)
        chosen[log_e] = log_o
        slope = _slope(cache, log_o, log_e, target["itl_mean_s"])
        if slope and slope > 0:
            slopes.append(slope)
        return -math.log(run(log_o, log_e)[1]["prefill_mean_s"] / target["prefill_mean_s"])

    e_bounds = (math.log(1e-3), 0.0)
    log_e, _, _ = _root(prefill_gap, *e_bounds)
    log_o = chosen[log_e]
    frame, moments = run(log_o, log_e)
    model = _with(base, math.exp(log_o), math.exp(log_e))
    at_bound = tuple(
        name
        for name, value, bounds in (("overhead_s", log_o, o_bounds), ("flops_efficiency", log_e, e_bounds))
        if min(abs(value - b) for b in bounds) < 1e-9
    )
    gaps = [abs(math.log(moments[k] / target[k])) for k in target]
    fit = HistogramFit(
        model,
        at_bound,
        target,
        moments,
        len(cache),
        max(gaps) <= 2 * TOLERANCE,
        math.exp(log_e) * flops_headroom,
    )
    return fit, frame


def planned_latency(frame: pd.DataFrame) -> tuple[dict, dict]:
    """(bucketed, exact) LATENCY_KEYS of simulated requests: TTFT and per-request TPOT (0 for a one-token output,
    as vLLM observes it) counted into vLLM's TTFT / TPOT buckets and read by histogram_quantile; and numpy's
    percentiles of the same values (`core.serving.latency`)."""
    done = frame[frame["finish_time"].notna()]
    ttft = (done["first_token_time"] - done["arrival_time"]).to_numpy()
    out = done["output_len"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (done["finish_time"] - done["first_token_time"]).to_numpy() / (out - 1), 0.0)
    t, p = bucketed(ttft, TTFT_BUCKETS), bucketed(tpot, ITL_BUCKETS)
    planned = {
        "ttft_p50_s": t.quantile(0.5),
        "ttft_p95_s": t.quantile(0.95),
        "tpot_p50_s": p.quantile(0.5),
        "tpot_p95_s": p.quantile(0.95),
    }
    summary = latency_summary(done)
    exact = {key: summary.get(key) for key in LATENCY_KEYS}
    return planned, exact


def plan_against_observed(
    window: ObservedWindow,
    base: StepTimeModel,
    limits: ServerLimits,
    settings: FitSettings = FitSettings(),
    prior: StepTimeModel | None = None,
) -> PlannedVsObserved:
    """Fit `base` to the window and compare its planned TTFT / TPOT p50 / p95 with the observed ones (module
    docstring), as `settings` say; with `prior` (the model the SLO planner prices this deployment with), also
    that model's prediction of the same workload, unfitted. Raises InvalidArgumentError when the window finished
    fewer than `settings.min_requests` requests."""
    if window.requests < settings.min_requests:
        raise InvalidArgumentError(
            f"the window finished {window.requests:g} request(s); planned vs observed needs at least "
            f"{settings.min_requests} (wait for more traffic or widen the window)"
        )
    workloads = window_workloads(window, settings.sim_requests, limits, settings.seed)
    fit, frame = fit_to_window(window, base, limits, workloads, settings.flops_headroom)
    planned, exact = planned_latency(frame)
    predicted = None if prior is None else planned_latency(_simulate(workloads, prior, limits))[0]
    return PlannedVsObserved(window, fit, planned, exact, window.latency(), predicted)
