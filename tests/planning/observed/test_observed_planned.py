"""core.live.window and core.planning.observed.planned against hand-worked examples, and the fit against a server
whose truth is known: a simulated server (known overhead_s and flops_efficiency) whose requests are counted into
vLLM's buckets exactly as /metrics would carry them."""

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from core.errors import InvalidArgumentError
from core.live.histogram import Histogram
from core.live.metrics import VllmMetrics
from core.live.window import bucketed, observe_window
from core.metric_names import request_token_buckets
from core.planning.observed import planned as planned_module
from core.planning.observed.planned import (
    FitSettings,
    fit_to_window,
    plan_against_observed,
    planned_latency,
    sample_lengths,
    simulated_moments,
)
from tests.planning.observed.simulated_server import BASE, LIMITS, TRUTH, simulated_server

INF = math.inf


@pytest.fixture(scope="module")
def server():
    """(requests, window) of the simulated server whose truth is known."""
    return simulated_server()


@pytest.fixture(scope="module")
def plain(server):
    """`plan_against_observed` of the server's window with no prior (a fit: ~8 s), read by two tests."""
    return plan_against_observed(server[1], BASE, LIMITS)


def test_request_token_buckets_are_vllms_1_2_5():
    assert request_token_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert request_token_buckets(8192) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def test_bucketed_counts_like_prometheus_and_reads_back_by_hand():
    h = bucketed([0.05, 0.1, 0.1, 0.3, 7.0], (0.1, 0.2, 0.5))
    assert h.bounds == (0.1, 0.2, 0.5, INF) and h.cumulative == (3, 3, 4, 5)  # le is inclusive
    assert h.count == 5 and h.sum == pytest.approx(7.55)
    # rank 0.5 x 5 = 2.5 lies in the first bucket (0, 0.1] holding 3: 0 + 0.1 x 2.5 / 3
    assert h.quantile(0.5) == pytest.approx(0.1 * 2.5 / 3)
    # rank 4.75 lies in +Inf: Prometheus answers the highest finite bound
    assert h.quantile(0.95) == 0.5


def window_metrics(prefill, itl, ttft, prompts, outputs, e2e) -> VllmMetrics:
    return VllmMetrics(
        ttft=ttft,
        itl=itl,
        e2e=e2e,
        prefill_time=prefill,
        request_prompt_tokens=prompts,
        request_generation_tokens=outputs,
    )


def test_observe_window_subtracts_the_earlier_scrape():
    def h(bounds, cum, total):
        return Histogram((*bounds, INF), cum, total, cum[-1])

    before = window_metrics(
        h([1], (1, 1), 0.5),
        h([1], (4, 4), 0.4),
        h([1], (1, 1), 0.6),
        h([10], (1, 1), 8),
        h([10], (1, 1), 5),
        h([1], (1, 1), 0.9),
    )
    after = window_metrics(
        h([1], (3, 5), 4.5),
        h([1], (20, 24), 6.4),
        h([1], (4, 5), 3.6),
        h([10], (3, 5), 108),
        h([10], (4, 5), 45),
        h([1], (2, 5), 9.9),
    )
    w = observe_window(before, after, 8.0)
    assert w.requests == 4 and w.request_rate == 0.5  # 5 - 1 finished in 8 s
    assert w.mean_prompt_tokens == 25 and w.mean_output_tokens == 10  # (108 - 8) / 4, (45 - 5) / 4
    assert w.prefill_time.mean == 1.0 and w.itl.mean == 0.3  # 4 / 4, 6 / 20
    assert w.tpot_source == "itl" and w.steps is None  # no request TPOT or iteration histogram published
    # TTFT window: 3 of 4 in (0, 1]; p50 rank 2 -> 2/3 of the way up the first bucket
    assert w.latency()["ttft_p50_s"] == pytest.approx(2 / 3)
    with pytest.raises(InvalidArgumentError, match="positive"):
        observe_window(before, after, 0)
    with pytest.raises(InvalidArgumentError, match="prefill_time"):
        observe_window(before, replace(after, prefill_time=None), 8.0)


def test_sample_lengths_keeps_the_exact_mean_and_the_buckets():
    h = Histogram((10, 20, 50, INF), (0, 30, 40, 40), 30 * 15 + 10 * 40, 40)  # 30 in (10, 20], 10 in (20, 50]
    draws = sample_lengths(h, 4000, np.random.default_rng(0))
    assert draws.mean() == pytest.approx(h.sum / h.count, rel=0.01)
    assert draws.min() >= 10 and draws.max() <= 55  # rescaling by ~1 keeps them near their buckets
    assert np.mean(draws <= 21) == pytest.approx(0.75, abs=0.03)


def test_simulated_moments_by_hand():
    frame = pd.DataFrame(
        {
            "arrival_time": [0.0, 1.0],
            "admit_time": [0.5, 1.0],
            "first_token_time": [1.0, 1.4],
            "finish_time": [2.0, 1.4],
            "output_len": [5, 1],
            "prompt_len": [3, 3],
            "n": [1, 1],
        }
    )
    m = simulated_moments(frame)
    assert m["prefill_mean_s"] == pytest.approx((0.5 + 0.4) / 2)
    assert m["itl_mean_s"] == pytest.approx(
        1.0 / 4
    )  # decode 1 s over 4 gaps; the one-token request adds none
    planned, exact = planned_latency(frame)
    # TPOTs 0.25 and 0 (one token, as vLLM observes it): p50 rank 1 in the first ITL bucket (0, 0.01]
    assert planned["tpot_p50_s"] == pytest.approx(0.01)
    assert exact["tpot_p50_s"] == pytest.approx(0.25)  # numpy's percentile over the defined TPOTs only


def test_fit_recovers_the_truth_from_its_own_workload(server):
    requests, window = server
    fit, _ = fit_to_window(window, BASE, LIMITS, [requests])
    assert fit.converged and fit.at_bound == ()
    assert fit.model.overhead_s == pytest.approx(0.03, rel=0.05)
    assert fit.model.flops_efficiency == pytest.approx(0.4, rel=0.05)


def test_plan_against_a_simulated_server(server, plain):
    """From the histograms alone (lengths resampled from buckets, arrivals redrawn): the fitted parameters land
    near the truth and the planned percentiles within 15% of the observed ones (measured: <= 7%)."""
    _, window = server
    result = plain
    assert result.fit.converged
    assert result.fit.model.flops_efficiency == pytest.approx(0.4, rel=0.15)
    for key, err in result.rel_errors.items():
        assert err < 0.15, (key, result.planned, result.observed)
    with pytest.raises(InvalidArgumentError, match="at least 100"):
        plan_against_observed(window, BASE, LIMITS, FitSettings(min_requests=100))
    assert result.prior is None and result.prior_rel_errors is None


def test_the_planners_own_prediction_beside_the_fit(server, plain, monkeypatch):
    """A prior model (what the SLO planner prices the deployment with, nothing fitted) predicts the same
    workload: the server's true model lands as close as the fit (within 15%), a model with twice the true
    overhead predicts every latency higher than the truth does."""
    _, window = server
    # the fit reads the window and its workloads, never the prior (truth.planned == plain.planned below): the
    # second prior's call takes the first call's fit (the same arguments) instead of running the same ~8 s fit
    # again; each prior is simulated on its own
    fit_to_window, fits = planned_module.fit_to_window, []

    def fitted_once(*args, **kwargs):
        if not fits:
            fits.append((args, kwargs, fit_to_window(*args, **kwargs)))
        assert (args, kwargs) == fits[0][:2]
        return fits[0][2]

    monkeypatch.setattr(planned_module, "fit_to_window", fitted_once)
    truth = plan_against_observed(window, BASE, LIMITS, prior=TRUTH)
    assert all(err < 0.15 for err in truth.prior_rel_errors.values()), (truth.prior, truth.observed)
    assert truth.planned == plain.planned  # the fit is not touched (plain's fit ran unpatched)
    slow = plan_against_observed(window, BASE, LIMITS, prior=replace(TRUTH, overhead_s=0.06)).prior
    assert all(
        slow[key] > truth.prior[key] for key in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
    )
    assert truth.to_dict()["prior"] == truth.prior


def test_warm_started_root_finds_the_cold_searchs_root_and_bounds():
    """`_root` from a start (guess, slope, neighbours) against the cold search over [lo, hi], on a moment that is
    linear in the parameter as the mean ITL is in overhead_s (ITL = 0.01 + 1.1 o, hand-solved root): the same root
    within TOLERANCE in fewer evaluations, a wrong guess or slope still converging, and the bound returned where
    the root lies outside [lo, hi] whichever side the start is on."""
    from core.planning.observed.planned import TOLERANCE, _root

    def gap(target):
        return lambda log_o: math.log((0.01 + 1.1 * math.exp(log_o)) / target)

    lo, hi = math.log(1e-6), math.log(0.1)
    root = math.log((0.05 - 0.01) / 1.1)
    cold = _root(gap(0.05), lo, hi, linear=True)
    assert abs(cold[1]) <= TOLERANCE and cold[0] == pytest.approx(root, abs=2 * TOLERANCE)
    for guess, slope, a, b in (
        (math.log(0.03), 1.1 / 0.05, math.log(0.02), math.log(0.05)),  # good guess, exact slope
        (
            math.log(0.09),
            5.0 / 0.05,
            math.log(0.06),
            math.log(0.09),
        ),  # guess and neighbours above, slope 4x off
        (math.log(1e-4), None, math.log(1e-5), math.log(1e-4)),  # below, no slope
    ):
        warm = _root(gap(0.05), lo, hi, (guess, slope, a, b), linear=True)
        assert abs(warm[1]) <= TOLERANCE and warm[0] == pytest.approx(root, abs=2 * TOLERANCE)
    assert (
        _root(gap(0.05), lo, hi, (math.log(0.03), 1.1 / 0.05, root - 0.1, root + 0.1), linear=True)[2]
        < cold[2]
    )
    start = (math.log(0.05), 22.0, math.log(0.04), math.log(0.06))
    assert _root(gap(0.5), lo, hi, start, linear=True)[0] == hi  # ITL 0.5 needs o > 0.1: held at hi
    assert _root(gap(0.005), lo, hi, start, linear=True)[0] == lo  # below the 0.01 floor: held at lo
