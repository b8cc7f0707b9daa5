"""The percentile intervals of a steady-state estimate (`core.serving.steady_state._quantile_interval`): batch
means of each percentile's indicator. Worked by hand on a case whose batches agree exactly, and held to the
coverage it states on samples whose true percentiles are known (independent exponential draws)."""

import math

import numpy as np
import pytest

from core.serving.steady_state import _quantile_interval


def test_batches_that_agree_leave_the_independent_samples_floor():
    """100 samples, 1..100, in 10 batches of 10, each batch five at or below the median (50.5) and five above:
    every batch's fraction is 0.5, so the batches' spread is 0 and the floor decides, 1.96 x sqrt(0.5 x 0.5 /
    100) = 0.098; the interval is the samples' own percentiles at 0.402 and 0.598: 1 + 99 x 0.402 = 40.798 and
    1 + 99 x 0.598 = 60.202 (numpy's linear percentile of 1..100)."""
    values = np.array(
        [v for b in range(10) for v in [*range(5 * b + 1, 5 * b + 6), *range(51 + 5 * b, 56 + 5 * b)]]
    )
    batch_of = np.repeat(np.arange(10), 10)
    assert sorted(values) == list(range(1, 101))
    median = float(np.percentile(values, 50))
    assert median == 50.5
    low, high = _quantile_interval(values.astype(float), np.ones(100), batch_of, 10, 50, median)
    assert (low, high) == pytest.approx((40.798, 60.202), rel=1e-12)


@pytest.mark.parametrize("q", [50, 95, 99])
def test_the_interval_holds_the_true_percentile_about_95_times_in_100(q):
    """400 independent runs of 2,000 exponential(1) draws in 10 batches: the interval holds the true percentile,
    -ln(1 - q / 100), in 92-98 % of them (the 95 % it states, within 2.7 binomial standard deviations), and it is
    not much wider than it must be: its mean half-width within 1.5x the large-sample one of independent draws,
    1.96 x sqrt(p (1 - p) / n) / f(x_p), f(x_p) = 1 - p the density there (1.29x at p50, 1.43x at p99: Student's t
    for 10 batches and the batches' own noise)."""
    rng = np.random.default_rng(0)
    truth = -math.log(1 - q / 100)
    held, widths = 0, []
    batch_of = np.repeat(np.arange(10), 200)
    for _ in range(400):
        values = rng.exponential(size=2000)
        estimate = float(np.percentile(values, q))
        low, high = _quantile_interval(values, np.ones(2000), batch_of, 10, q, estimate)
        assert low <= estimate <= high
        held += low <= truth <= high
        widths.append((high - low) / 2 / truth)
    assert 0.92 <= held / 400 <= 0.98
    p = q / 100
    large_sample = 1.96 * math.sqrt(p * (1 - p) / 2000) / (1 - p) / truth
    assert np.mean(widths) < 1.5 * large_sample


def test_weights_count_as_repeated_samples():
    """ITL gaps carry the number of tokens that waited them as weights: weights 2, 1 give the interval the samples
    listed with their repeats give, when each batch holds the same fractions either way."""
    values = np.array([1.0, 2.0, 3.0, 4.0] * 10)
    weights = np.array([2.0, 1.0, 1.0, 2.0] * 10)
    batch_of = np.repeat(np.arange(10), 4)
    estimate = float(np.percentile(values, 50, weights=weights, method="inverted_cdf"))
    low, high = _quantile_interval(values, weights, batch_of, 10, 50, estimate)
    assert low <= estimate <= high and (low, high) == (2.0, 3.0)
