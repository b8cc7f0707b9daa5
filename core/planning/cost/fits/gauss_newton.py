"""Damped Gauss-Newton least squares, the one minimiser of the fits that solve for a few parameters on their logs
(`published_vllm.fit_vllm`: finite-difference Jacobians over simulated rows; `moe_kernels.fit_kernel_model`: an
analytic one). Each iteration solves the linearised problem for a step, halves it until the cost |r|^2 falls
(none falling within `halvings`: stop), clips the parameters at `upper` (an efficiency's log at 0) and stops once a
step moves no parameter by `tolerance` or more."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NewtonLimits:
    """Iterations at most, halvings of a step at most, and the step size (in every parameter) that ends the fit."""

    iterations: int = 60
    halvings: int = 20
    tolerance: float = 1e-9


def damped_gauss_newton(
    residual: Callable[[np.ndarray], np.ndarray],
    jacobian: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x: np.ndarray,
    upper: np.ndarray,
    limits: NewtonLimits = NewtonLimits(),
) -> tuple[np.ndarray, np.ndarray]:
    """(x, residual(x)) minimising |residual(x)|^2 from `x` (module docstring). residual(x): float64 [rows];
    jacobian(x, r): float64 [rows, parameters], d residual / d x at x, where r = residual(x)."""
    r = residual(x)
    for _ in range(limits.iterations):
        step = np.linalg.lstsq(jacobian(x, r), -r, rcond=None)[0]
        for _ in range(limits.halvings):
            x_new = np.minimum(x + step, upper)
            r_new = residual(x_new)
            if r_new @ r_new < r @ r:
                break
            step /= 2
        else:
            break
        converged = np.max(np.abs(x_new - x)) < limits.tolerance
        x, r = x_new, r_new
        if converged:
            break
    return x, r
