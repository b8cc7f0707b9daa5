"""The SLO planner's chart: the SLO lines sit at the targets, the target rate is marked, each knee is the first rate
at which `latency_curve` (called here, apart from the page model) binds on queueing or is pruned by the throughput
bound, the drawn p95s are latency_curve's, and a configuration keeps one colour in both panels."""

from dataclasses import replace

import pytest

from core.page_models.slo_planner import (
    CURVE_FACTORS,
    DEFAULT_PARAMS,
    chart_configs,
    config_label,
    curve,
    curves,
    search,
)
from core.planning.search.slo import latency_curve

# the page's defaults (rate 12, its targets, GPUs and dtypes) with shorter requests: the same chart is drawn from a
# search and curves that simulate ~3x fewer steps (2000 / 300 tokens took 50 s for this file); long enough that
# each drawn deployment saturates below 2x the rate (at 1000 / 100 one H100 still kept up at 24 req/s)
P = replace(DEFAULT_PARAMS, prompt_len=1500, output_len=150)


@pytest.fixture(scope="module")
def plan():
    return search(P).plan


def first_queueing_rate(config, rates):
    points = latency_curve(P.model, config, P.workload(), P.slo(), rates, P.candidates())
    for rate, point in zip(rates, points, strict=True):
        if point.binding == "queueing" or (not point.simulated and point.limiting_metric == "rate"):
            return rate, point, points
    return None, None, points


def shapes(fig, name):
    return [s for s in fig.layout.shapes if s.name == name]


def test_chart_configurations_meet_the_slo_one_per_deployment_in_rank_order(plan):
    configs = chart_configs(plan)
    assert len(configs) == 3 and configs[0] == plan.best and all(c.meets_slo for c in configs)
    deployments = [(c.gpu, c.tp, c.pp, c.replicas, c.kv_dtype) for c in configs]
    assert len(set(deployments)) == 3
    ranks = [plan.configs.index(c) for c in configs]
    assert ranks == sorted(ranks)
    # every meeting configuration ranked before the last one drawn shares a drawn deployment
    skipped = [c for c in plan.configs[: ranks[-1]] if c.meets_slo and c not in configs]
    assert all((c.gpu, c.tp, c.pp, c.replicas, c.kv_dtype) in deployments for c in skipped)


def test_slo_lines_target_rate_and_knees(plan):
    from ui.slo_planner.figures import latency_vs_rate_figure
    from ui.theme import config_color

    configs = chart_configs(plan)
    drawn = curves(P, configs, lambda fraction, message: None)
    fig = latency_vs_rate_figure(drawn, P.rate, 1.0, 0.05)  # the default targets, TTFT / TPOT p95
    [ttft] = shapes(fig, "ttft target")
    [tpot] = shapes(fig, "tpot target")
    assert (ttft.y0, ttft.y1, ttft.yref) == (1.0, 1.0, "y")
    assert (tpot.y0, tpot.y1, tpot.yref) == (50.0, 50.0, "y2")  # ms
    assert sorted((s.x0, s.xref) for s in shapes(fig, "target rate")) == [(12.0, "x"), (12.0, "x2")]
    rates = tuple(P.rate * f for f in CURVE_FACTORS)
    assert rates[0] == 3.0 and rates[-1] == 24.0
    for i, config in enumerate(configs):
        expected, _, points = first_queueing_rate(config, rates)
        assert expected is not None  # at 2x the rate every one of these deployments saturates
        knees = shapes(fig, f"knee {i}")
        assert sorted((s.x0, s.xref) for s in knees) == [(expected, "x"), (expected, "x2")]
        lines = [t for t in fig.data if t.name == config_label(config)]  # each meets the SLO: no suffix
        assert [t.xaxis for t in lines] == ["x", "x2"]
        assert {t.line.color for t in lines} == {config_color(i)}  # one colour in both panels
        assert list(lines[0].y) == [p.ttft_p95_s if p.simulated else None for p in points]
        assert list(lines[1].y) == [p.tpot_p95_s * 1e3 if p.simulated else None for p in points]
    assert fig.layout.xaxis.title.text == "request rate (requests/s)" == fig.layout.xaxis2.title.text
    assert "(s" in fig.layout.yaxis.title.text and "(ms" in fig.layout.yaxis2.title.text


def test_a_queueing_knee_is_marked_on_its_point(plan):
    from ui.slo_planner.figures import latency_vs_rate_figure

    # one H100 capped at 128 sequences: requests wait for a slot before the throughput bound rules a rate out
    capped = next(
        c
        for c in plan.configs
        if (c.gpu, c.tp, c.replicas, c.kv_dtype, c.max_num_seqs) == ("h100-80gb", 1, 1, "auto", 128)
    )
    drawn = curve(P, capped)
    expected, point, _ = first_queueing_rate(capped, drawn.rates)
    assert point.binding == "queueing" and point.simulated
    assert (drawn.knee_rate, drawn.knee_reason) == (expected, "queueing")
    fig = latency_vs_rate_figure((drawn,), P.rate, 1.0, None)
    assert not shapes(fig, "tpot target")  # no target, no line
    markers = [t for t in fig.data if t.name == "knee 0"]
    assert [(t.x[0], t.y[0]) for t in markers] == [
        (expected, point.ttft_p95_s),
        (expected, point.tpot_p95_s * 1e3),
    ]


def test_a_curve_a_bound_ruled_out_at_every_rate_is_not_drawn_and_the_next_keeps_its_colour():
    """A configuration topped up as the closest miss can have no simulated point (e.g. one decode step longer
    than the TPOT target at every rate): no line, no legend entry, no knee; the next curve keeps its rank's colour
    (the page's caption names it as not drawn, with the bound)."""
    from core.page_models.slo_planner import Curve
    from ui.slo_planner.figures import latency_vs_rate_figure
    from ui.theme import config_color

    rates = (1.0, 2.0)
    pruned = Curve(
        "2 x L40S (misses the SLO)", rates, (None, None), (None, None), ("tpot",) * 2, (False,) * 2, 2.0
    )
    drawn = Curve("2 x H100", rates, (0.2, 0.3), (0.01, 0.011), ("memory",) * 2, (True,) * 2, None)
    fig = latency_vs_rate_figure((pruned, drawn), 2.0, 1.0, 0.012)
    assert {t.name for t in fig.data} == {"2 x H100"} and not shapes(fig, "knee 0")
    assert {t.line.color for t in fig.data} == {config_color(1)}


def test_the_top_up_prefers_a_simulated_miss_to_one_a_bound_ruled_out(plan):
    """Fewer meet the SLO than the chart draws: the closest misses top it up, the simulated ones first (a miss a
    bound ruled out at the target rate, e.g. a decode step over the TPOT target, has no line to draw)."""
    best = plan.best
    others = [
        c for c in plan.configs if c.mode == "agg" and c.feasible and (c.gpu, c.tp) != (best.gpu, best.tp)
    ]
    pruned = replace(others[0], meets_slo=False, simulated=False, slo_ratio=1.001)  # closer by its ratio
    simulated = next(
        replace(c, meets_slo=False, simulated=True, slo_ratio=1.3)
        for c in others
        if (c.gpu, c.tp, c.replicas, c.kv_dtype) != (pruned.gpu, pruned.tp, pruned.replicas, pruned.kv_dtype)
    )
    crafted = replace(plan, configs=(best, pruned, simulated))
    assert chart_configs(crafted, count=2) == (best, simulated)
    assert chart_configs(crafted, count=3) == (best, simulated, pruned)
