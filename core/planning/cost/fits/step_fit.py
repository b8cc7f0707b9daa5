"""Fitting the step-time model (`core.planning.cost.step_model.StepTimeModel`) to measured steps: `fit_step_time`
finds the bandwidth and FLOP/s efficiencies and the per-step / per-token overheads that minimise the squared
relative error of the predicted step times (numpy least squares; optionally robust to steps slowed by another
process), and optionally the small-step factors (`StepTimeModel.small_step_factors`: a measured ratio per
step size). Our engine's steps are fitted by bench/slo.py; published GPU figures by `core.planning.cost.fits.published`."""

import math
from dataclasses import dataclass, replace

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.cost.step_model import StepTimeModel

# --------------------------------------------------------------------------------------------------------------

FIT_PARAMETERS = ("bandwidth_efficiency", "flops_efficiency", "overhead_s", "per_token_overhead_s")
# Fitted only when named: single_token_overhead_s needs one-token steps among the measured ones;
# small_step_factors one ratio per step size n <= SMALL_STEP_MAX_TOKENS with SMALL_STEP_MIN_STEPS steps of n tokens.
OPTIONAL_FIT = ("single_token_overhead_s", "small_step_factors")
SMALL_STEP_MAX_TOKENS = 16
SMALL_STEP_MIN_STEPS = 4
MEASURED_STEP_COLUMNS = ("new_tokens", "kv_tokens_read", "attention_pairs", "seconds")  # (+ output_tokens)
_RATIO_GRID = 160  # roof ratios tried before the local refinement
_GOLDEN_STEPS = 60
ROBUST_ROUNDS = 8


@dataclass(frozen=True, eq=False)
class StepTimeFit:
    """What `fit_step_time` found. model: the base model with the fitted parameters replaced. fitted: the names
    fitted; at_bound: those the fit held at a bound (an efficiency at 1, an overhead at 0). measured_s /
    predicted_s: float64 [steps]. compute_bound_steps: steps whose compute roof exceeds the memory roof under the
    fit (0 means flops_efficiency is only a bound: no step measured it; len - that count for bandwidth).
    robust: whether the fit was reweighted (Huber); the residual statistics are over every step, unweighted."""

    model: StepTimeModel
    fitted: tuple[str, ...]
    at_bound: tuple[str, ...]
    measured_s: np.ndarray
    predicted_s: np.ndarray
    compute_bound_steps: int
    robust: bool = False

    @property
    def residuals_s(self) -> np.ndarray:
        """predicted - measured, seconds per step."""
        return self.predicted_s - self.measured_s

    @property
    def relative_residuals(self) -> np.ndarray:
        """(predicted - measured) / measured per step: what the fit minimises the squares of."""
        return self.residuals_s / self.measured_s

    @property
    def rms_relative_error(self) -> float:
        return float(np.sqrt(np.mean(self.relative_residuals**2)))

    @property
    def max_relative_error(self) -> float:
        return float(np.max(np.abs(self.relative_residuals)))

    def to_dict(self) -> dict:
        """The fitted values and the residual statistics, JSON-ready."""
        return {
            **{name: getattr(self.model, name) for name in FIT_PARAMETERS + OPTIONAL_FIT[:1]},
            "small_step_factors": list(self.model.small_step_factors),
            "fitted": list(self.fitted),
            "robust": self.robust,
            "at_bound": list(self.at_bound),
            "num_steps": len(self.measured_s),
            "compute_bound_steps": self.compute_bound_steps,
            "rms_relative_error": self.rms_relative_error,
            "max_relative_error": self.max_relative_error,
            "median_abs_relative_error": float(np.median(np.abs(self.relative_residuals))),
        }


def _measured(steps) -> tuple[np.ndarray, ...]:
    """The four MEASURED_STEP_COLUMNS of `steps` (a DataFrame or a mapping of sequences) as float64 arrays, and
    the optional output_tokens column (None when absent)."""
    try:
        columns = [np.asarray(steps[name], dtype=np.float64) for name in MEASURED_STEP_COLUMNS]
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidArgumentError(
            f"measured steps need the columns {', '.join(MEASURED_STEP_COLUMNS)} as numbers ({err})"
        ) from None
    n, kv, pairs, seconds = columns
    if not (n.ndim == 1 and n.shape == kv.shape == pairs.shape == seconds.shape):
        raise InvalidArgumentError("the measured step columns must be 1-D and of one length")
    if not (np.isfinite(np.stack(columns)).all() and (n > 0).all() and (seconds > 0).all()):
        raise InvalidArgumentError("measured steps need finite values, new_tokens > 0 and seconds > 0")
    if (kv < 0).any() or (pairs < 0).any():
        raise InvalidArgumentError("kv_tokens_read and attention_pairs must be >= 0")
    outputs = None
    if "output_tokens" in steps:
        outputs = np.asarray(steps["output_tokens"], dtype=np.float64)
        if outputs.shape != n.shape or not (np.isfinite(outputs).all() and (outputs >= 0).all()):
            raise InvalidArgumentError("output_tokens must be finite, >= 0 and one per step")
    return n, kv, pairs, seconds, outputs


def _bounded_lstsq(x: np.ndarray, y: np.ndarray, lower: np.ndarray) -> tuple[np.ndarray, float]:
    """min |x b - y|^2 subject to b >= lower, for a handful of columns: the best feasible solution over every
    set of coefficients held at their bound (the optimum of this convex problem is one of them)."""
    k = x.shape[1]
    best, best_cost = None, math.inf
    for mask in range(1 << k):
        held = np.array([(mask >> j) & 1 == 1 for j in range(k)])
        b = np.where(held, lower, 0.0)
        free = ~held
        if free.any():
            b[free] = np.linalg.lstsq(x[:, free], y - x[:, held] @ lower[held], rcond=None)[0]
            if (b[free] < lower[free] - 1e-12).any():
                continue
        cost = float(np.sum((x @ b - y) ** 2))
        if cost < best_cost:
            best, best_cost = b, cost
    return best, best_cost


def _check_fit_names(fit) -> tuple[str, ...]:
    names = tuple(fit)
    unknown = [n for n in names if n not in FIT_PARAMETERS + OPTIONAL_FIT]
    if unknown or not names:
        raise InvalidArgumentError(
            f"fit names some of {', '.join(FIT_PARAMETERS + OPTIONAL_FIT)}; got {list(names)}"
        )
    if ("bandwidth_efficiency" in names) != ("flops_efficiency" in names):
        raise InvalidArgumentError(
            "bandwidth_efficiency and flops_efficiency are fitted together (their ratio "
            "decides which roof binds), or neither"
        )
    return names


def fit_step_time(steps, base: StepTimeModel, fit=FIT_PARAMETERS, robust: bool = False) -> StepTimeFit:
    """Fit `fit` (names of FIT_PARAMETERS; the two efficiencies together) of `base` to measured step times.

    steps: a DataFrame or mapping with MEASURED_STEP_COLUMNS (new_tokens, kv_tokens_read, attention_pairs as
    `StepTimeModel.step_time` takes them, seconds measured), and optionally output_tokens (the tokens each step
    sampled, for a base with lm_head_flops_per_output). Least squares on the relative error
    (predicted - measured) / measured. With a = 1 / bandwidth_efficiency and b = 1 / flops_efficiency the model is
        t = overhead_s + per_token_overhead_s x n + max(a M, b F) + comm
    (M, F: the ideal roofs at efficiency 1): linear in (overhead, per-token, a) once the ratio r = b / a is fixed,
    so r is searched (a log grid over the range where the roofs cross, then golden section) and the rest solved
    exactly, with bounds overhead >= 0, per-token >= 0, a >= 1, b >= 1 (efficiencies at most 1).
    robust: iteratively reweighted (Huber weights, threshold 1.345 x the residuals' MAD scale, ROBUST_ROUNDS
    rounds), so that a few steps slowed by another process do not pull the fit.
    single_token_overhead_s (OPTIONAL_FIT, when named): the overhead of one-token steps, fitted apart from
    overhead_s (which then covers the other steps); it needs one-token steps among the measured ones.
    small_step_factors (OPTIONAL_FIT, when named): after the other parameters are fitted without factors, the
    factor of n tokens is the median of measured / predicted over the steps of exactly n tokens, for
    n = 1 .. SMALL_STEP_MAX_TOKENS with at least SMALL_STEP_MIN_STEPS such steps (1.0 otherwise; trailing 1.0s
    dropped); then the other parameters are fitted once more with those factors applied (the relative error of
    f x t against s is that of t against s / f, so the same least squares on s / f) and the factors re-measured;
    the second round is kept when its rms relative error is lower. Without the name, base's factors (usually
    none) are applied and kept as they are.
    Raises InvalidArgumentError for malformed steps or fewer steps than parameters + 1.
    """
    names = _check_fit_names(fit)
    data = _measured(steps)
    n = data[0]
    if len(n) < len(names) + 1:
        raise InvalidArgumentError(f"fitting {len(names)} parameters needs at least {len(names) + 1} steps")
    if "single_token_overhead_s" in names and not ((n == 1).any() and (n != 1).any()):
        raise InvalidArgumentError("single_token_overhead_s needs measured steps of one token and of more")
    main = tuple(name for name in names if name != "small_step_factors")
    if len(main) == len(names):
        return _fit_main(base, main, data, robust)
    first = _fit_main(replace(base, small_step_factors=()), main, data, robust)
    first = _with_factors(first, _measured_factors(first.model, data), data)
    again = _fit_main(first.model, main, data, robust)
    again = _with_factors(again, _measured_factors(again.model, data), data)
    best = again if again.rms_relative_error < first.rms_relative_error else first
    return replace(best, fitted=names)


def _fit_main(base: StepTimeModel, main, data, robust: bool) -> StepTimeFit:
    """Fit the parameters `main` (no small_step_factors) with base's small-step factors applied and kept."""
    n, kv, pairs, seconds, outputs = data
    factors = base.small_step_factors
    if not main:  # nothing but the factors to fit: base as it is
        parts = base.breakdown(n, kv, pairs, outputs)
        bound = int((parts.compute_s > parts.memory_s).sum())
        return _with_factors(StepTimeFit(base, (), (), seconds, seconds, bound, robust), factors, data)
    if factors:  # f x t against s has the relative error of t against s / f
        data = (n, kv, pairs, seconds / base.step_factor(n), outputs)
        base = replace(base, small_step_factors=())
    weights = np.ones_like(seconds)
    for _ in range(ROBUST_ROUNDS if robust else 1):
        result = _fit_weighted(base, main, data, weights)
        weights = _huber_weights(result.relative_residuals)
    result = replace(result, robust=robust)
    return _with_factors(result, factors, (n, kv, pairs, seconds, outputs)) if factors else result


def _with_factors(fit: StepTimeFit, factors: tuple, data) -> StepTimeFit:
    """`fit` with its model's small_step_factors set to `factors`, predicted_s re-priced and measured_s the
    measured seconds of `data`."""
    n, kv, pairs, seconds, outputs = data
    model = replace(fit.model, small_step_factors=factors)
    predicted = model.step_time(n, kv, pairs, output_tokens=outputs)
    return replace(fit, model=model, measured_s=seconds, predicted_s=predicted)


def _measured_factors(model: StepTimeModel, data) -> tuple[float, ...]:
    """Median measured / predicted (by `model` without factors) over the steps of exactly n tokens, for each
    n <= SMALL_STEP_MAX_TOKENS with at least SMALL_STEP_MIN_STEPS of them (else 1.0), trailing 1.0s dropped."""
    n, kv, pairs, seconds, outputs = data
    ratio = seconds / replace(model, small_step_factors=()).step_time(n, kv, pairs, output_tokens=outputs)
    factors = []
    for k in range(1, SMALL_STEP_MAX_TOKENS + 1):
        steps = n == k
        factors.append(float(np.median(ratio[steps])) if steps.sum() >= SMALL_STEP_MIN_STEPS else 1.0)
    while factors and factors[-1] == 1.0:
        factors.pop()
    return tuple(factors)


def _huber_weights(residuals: np.ndarray) -> np.ndarray:
    """IRLS weights of the Huber loss: 1 within 1.345 robust standard deviations (1.4826 x MAD), c / |r| beyond."""
    scale = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
    if scale <= 0:
        return np.ones_like(residuals)
    c = 1.345 * scale
    return np.minimum(1.0, c / np.maximum(np.abs(residuals), 1e-300))


def _overhead_columns(base: StepTimeModel, names, n: np.ndarray, y: np.ndarray):
    """(columns, their names, the lower bounds, y less the overheads that are not fitted) for the overheads:
    overhead_s on every step (on the steps of more than one token when one-token steps have their own),
    single_token_overhead_s on one-token steps, per_token_overhead_s x n."""
    single = n == 1
    own = "single_token_overhead_s" in names or base.single_token_overhead_s is not None
    columns, col_names = [], []
    if "overhead_s" in names:
        columns.append((~single if own else np.ones_like(single)).astype(np.float64))
        col_names.append("overhead_s")
    else:
        y = y - base.overhead_s * (~single if own else 1.0)
    if "single_token_overhead_s" in names:
        columns.append(single.astype(np.float64))
        col_names.append("single_token_overhead_s")
    elif base.single_token_overhead_s is not None:
        y = y - base.single_token_overhead_s * single
    if "per_token_overhead_s" in names:
        columns.append(n)
        col_names.append("per_token_overhead_s")
    else:
        y = y - base.per_token_overhead_s * n
    return columns, col_names, [0.0] * len(columns), y


def _fit_weighted(base: StepTimeModel, names, data, weights: np.ndarray) -> "StepTimeFit":
    """One weighted least-squares fit (fit_step_time's docstring); weights multiply the squared relative errors."""
    n, kv, pairs, seconds, outputs = data
    ideal = replace(
        base,
        bandwidth_efficiency=1.0,
        flops_efficiency=1.0,
        overhead_s=0.0,
        per_token_overhead_s=0.0,
        single_token_overhead_s=None,
        small_step_factors=(),
    )
    parts = ideal.breakdown(n, kv, pairs, outputs)
    memory, compute = parts.memory_s, parts.compute_s
    y = seconds - (parts.comm_s if (base.comm_bytes_per_token or base.comm_latency_s) else 0.0)
    columns, col_names, lower, y = _overhead_columns(base, names, n, y)
    w = np.sqrt(weights) / seconds  # relative error, weighted
    if "bandwidth_efficiency" not in names:
        y = y - np.maximum(memory / base.bandwidth_efficiency, compute / base.flops_efficiency)
        b, _ = _bounded_lstsq(np.stack(columns, 1) * w[:, None], y * w, np.array(lower))
        return _fit_result(
            base, names, dict(zip(col_names, b, strict=True)), None, None, memory, compute, data
        )

    def solve(log_ratio: float):
        ratio = math.exp(log_ratio)
        roof = np.maximum(memory, ratio * compute)
        x = np.stack([*columns, roof], 1) * w[:, None]
        return _bounded_lstsq(x, y * w, np.array([*lower, max(1.0, 1.0 / ratio)]))

    log_ratio = _search_ratio(solve, memory, compute)
    b, _ = solve(log_ratio)
    linear = dict(zip(col_names, b[:-1], strict=True))
    return _fit_result(base, names, linear, b[-1], math.exp(log_ratio), memory, compute, data)


def _search_ratio(solve, memory: np.ndarray, compute: np.ndarray) -> float:
    """The log roof ratio minimising the fit's cost: a grid spanning where max(M, r F) switches roof, then a
    golden-section refinement between the grid neighbours of the best point."""
    with np.errstate(divide="ignore"):
        crossings = np.log(memory[compute > 0] / compute[compute > 0])
    lo, hi = (float(crossings.min()) - 2.0, float(crossings.max()) + 2.0) if len(crossings) else (-1.0, 1.0)
    grid = np.linspace(lo, hi, _RATIO_GRID)
    costs = [solve(g)[1] for g in grid]
    k = int(np.argmin(costs))
    a, c = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(_GOLDEN_STEPS):
        x1, x2 = c - golden * (c - a), a + golden * (c - a)
        if solve(x1)[1] <= solve(x2)[1]:
            c = x2
        else:
            a = x1
    best = (a + c) / 2.0
    return best if solve(best)[1] <= costs[k] else float(grid[k])


def _fit_result(base, names, linear: dict, a, ratio, memory, compute, data) -> StepTimeFit:
    """The StepTimeFit of the solved coefficients (the overheads by name; then a, and r)."""
    values, at_bound = {}, []
    for name, value in linear.items():
        values[name] = max(0.0, float(value))
        at_bound += [name] if values[name] <= 1e-15 else []
    if a is not None:
        values["bandwidth_efficiency"] = min(1.0, 1.0 / float(a))
        values["flops_efficiency"] = min(1.0, 1.0 / (float(a) * ratio))
        at_bound += [k for k in ("bandwidth_efficiency", "flops_efficiency") if values[k] >= 1.0 - 1e-12]
    model = replace(base, **values)
    n, kv, pairs, seconds, outputs = data
    compute_bound = compute / model.flops_efficiency > memory / model.bandwidth_efficiency
    return StepTimeFit(
        model,
        names,
        tuple(at_bound),
        seconds,
        model.step_time(n, kv, pairs, output_tokens=outputs),
        int(compute_bound.sum()),
    )
