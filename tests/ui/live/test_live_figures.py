"""Live figure builders: what they draw is the data they were given (units, one colour per source, tree sizes)."""

import math

import pytest

from core.kv.events import BlockStored
from core.live.histogram import Histogram
from core.live.history import FLEET, LiveHistory
from core.live.metrics import parse_vllm_metrics
from core.live.tree import CachedBlockTree
from core.planning.catalog.hardware import get_gpu
from core.planning.catalog.models import get_model
from core.planning.memory.plan import PlanInputs
from core.planning.observed.compare import compare_with_server
from tests.live.exposition import EngineState, vllm_exposition
from ui.live.figures import (
    FLEET_COLOR,
    comparison_figure,
    latency_figure,
    source_colors,
    tree_figure,
    usage_figure,
)


def test_usage_lines_per_source_and_fleet_in_percent():
    h = LiveHistory()
    for t, (ua, ub) in enumerate([(0.1, 0.3), (0.5, 0.7)]):
        h.record(
            float(t),
            {
                "a": parse_vllm_metrics(vllm_exposition({"0": EngineState(usage=ua)})),
                "b": parse_vllm_metrics(vllm_exposition({"0": EngineState(usage=ub)})),
            },
        )
    colors = source_colors([*h.sources(), FLEET])
    fig = usage_figure(h.frame(), colors)
    by_name = {trace.name: trace for trace in fig.data}
    assert set(by_name) == {"a", "b", FLEET}
    assert list(by_name[FLEET].y) == pytest.approx([20.0, 60.0])
    assert by_name[FLEET].line.color == FLEET_COLOR and by_name["a"].line.color != by_name["b"].line.color
    assert "%" in fig.layout.yaxis.title.text and "s" in fig.layout.xaxis.title.text


def test_latency_bars_are_the_quantiles_in_ms():
    h = Histogram.from_buckets([(0.1, 5), (1.0, 10), (math.inf, 10)], 3.0, 10)
    fig = latency_figure({"TTFT": h, "empty": None})
    assert [t.name for t in fig.data] == ["p50", "p90", "p99"]
    assert fig.data[0].x == ("TTFT",) and fig.data[0].y[0] == pytest.approx(h.quantile(0.5) * 1000)
    assert "ms" in fig.layout.yaxis.title.text


def test_tree_icicle_sizes_and_node_cap():
    tree = CachedBlockTree()
    tree.apply(BlockStored([1, 2, 3], None, [0] * 12, 4, None, "GPU", None))
    tree.apply(BlockStored([4, 5], 1, [0] * 8, 4, None, "GPU", None))
    tree.apply(BlockStored([9], None, [0] * 4, 4, None, "CPU", None, group_idx=1))
    fig, drawn = tree_figure(tree)
    icicle = fig.data[0]
    values = dict(zip(icicle.ids, icicle.values, strict=True))
    assert drawn == 6 and values["group 0 · GPU"] == 5 and values["group 1 · CPU"] == 1
    assert values["group 0 · GPU/1"] == 5 and values["group 0 · GPU/2"] == 2
    for node, parent in zip(icicle.ids, icicle.parents, strict=True):
        assert parent == "" or parent in values
        children = [v for n, p, v in zip(icicle.ids, icicle.parents, icicle.values, strict=True) if p == node]
        assert sum(children) <= values[node]  # branchvalues="total" holds
    capped, drawn = tree_figure(tree, max_nodes=2)
    assert drawn == 2 and all(p == "" or p in capped.data[0].ids for p in capped.data[0].parents)


def test_comparison_bars():
    m = parse_vllm_metrics(vllm_exposition({"0": EngineState(num_gpu_blocks=20_000)}))
    c = compare_with_server(PlanInputs(get_model("llama-3.1-8b"), get_gpu("h100-80gb")), m, 4096)
    fig = comparison_figure(c)
    assert [t.name for t in fig.data] == ["planned (capacity planner)", "observed (server)"]
    assert list(fig.data[1].y) == [20_000, 20_000 // 256]


def test_planned_observed_bars_in_ms_with_the_source_colour():
    from core.planning.cost.step_time import opt_13b_a100
    from core.planning.observed.planned import HistogramFit, PlannedVsObserved
    from tests.planning.observed.simulated_server import simulated_server
    from ui.live.figures import PLANNED_COLOR, PRIOR_COLOR, planned_observed_figure

    _, window = simulated_server(n=20)
    fit = HistogramFit(opt_13b_a100(), (), {}, {}, 1, True)
    planned = {"ttft_p50_s": 0.2, "ttft_p95_s": 0.5, "tpot_p50_s": 0.05, "tpot_p95_s": None}
    observed = {"ttft_p50_s": 0.25, "ttft_p95_s": 0.4, "tpot_p50_s": 0.0, "tpot_p95_s": 0.1}
    fig = planned_observed_figure(PlannedVsObserved(window, fit, planned, {}, observed), "#123456", "srv")
    observed_bars, planned_bars = fig.data
    assert list(observed_bars.x) == [
        "TTFT p50",
        "TTFT p95",
    ]  # a 0 observed (log axis) or a None planned left out
    assert list(observed_bars.y) == [250.0, 400.0] and list(planned_bars.y) == [200.0, 500.0]
    assert observed_bars.marker.color == "#123456" and planned_bars.marker.color == PLANNED_COLOR
    assert list(planned_bars.text) == ["200 (-20%)", "500 (+25%)"]  # (planned - observed) / observed
    assert "ms" in fig.layout.yaxis.title.text and observed_bars.name == "observed (srv)"
    prior = {"ttft_p50_s": 0.3, "ttft_p95_s": 0.6, "tpot_p50_s": 0.04, "tpot_p95_s": 0.2}
    with_prior = planned_observed_figure(
        PlannedVsObserved(window, fit, planned, {}, observed, prior), "#123456", "srv"
    )
    prior_bars = with_prior.data[2]
    assert prior_bars.name.startswith("SLO planner") and prior_bars.marker.color == PRIOR_COLOR
    assert list(prior_bars.y) == [300.0, 600.0] and list(prior_bars.text) == ["300 (+20%)", "600 (+50%)"]
