"""The fits' one damped Gauss-Newton (`core.planning.cost.fits.gauss_newton`)."""

import math

import numpy as np
import pytest

from core.planning.cost.fits.gauss_newton import NewtonLimits, damped_gauss_newton


def _exponential_fit(t, y):
    """log(a exp(b t)) - log(y) on x = (log a, b): linear in x, so one step lands on the least-squares answer."""

    def residual(x):
        return x[0] + x[1] * t - np.log(y)

    def jacobian(x, r):
        return np.column_stack((np.ones_like(t), t))

    return residual, jacobian


def test_recovers_known_parameters():
    t = np.linspace(0.0, 2.0, 9)
    residual, jacobian = _exponential_fit(t, 3.0 * np.exp(-0.7 * t))
    x, r = damped_gauss_newton(residual, jacobian, np.array([0.0, 0.0]), np.array([math.inf, math.inf]))
    assert x == pytest.approx([math.log(3.0), -0.7], abs=1e-9)
    assert np.abs(r).max() < 1e-9


def test_holds_a_parameter_at_its_bound():
    """An efficiency's log held at 0 (efficiency 1) where the unconstrained answer is above it."""
    t = np.linspace(0.0, 2.0, 9)
    residual, jacobian = _exponential_fit(t, 3.0 * np.exp(0.5 * t))
    x, _ = damped_gauss_newton(residual, jacobian, np.array([0.0, -1.0]), np.array([math.inf, 0.0]))
    assert x[1] <= 0.0


def test_stops_when_no_halving_lowers_the_cost():
    """A Jacobian that points the wrong way: every halved step raises the cost, so the start comes back."""
    t = np.linspace(0.0, 2.0, 9)
    residual, jacobian = _exponential_fit(t, 3.0 * np.exp(-0.7 * t))
    start = np.array([0.0, 0.0])
    x, r = damped_gauss_newton(
        residual,
        lambda x, r: -jacobian(x, r),
        start,
        np.array([math.inf, math.inf]),
        NewtonLimits(halvings=5),
    )
    assert x.tolist() == start.tolist() and r.tolist() == residual(start).tolist()
