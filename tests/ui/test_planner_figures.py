"""Planner figure builders: the drawn numbers are the plan's numbers, axes carry units."""

import pytest

from core.planning.hardware import GPUS
from core.planning.models import MODELS
from core.planning.plan import concurrency_vs_context, plan
from core.planning.what_if import fragmentation_by_block_size, memory_breakdown, workload_what_if
from ui.planner_figures import (
    BREAKDOWN_ORDER,
    concurrency_vs_context_figure,
    fragmentation_figure,
    memory_breakdown_figure,
    paged_vs_contiguous_figure,
)

GiB = 1024**3
REQUESTS = [(161, 338), (20, 58), (500, 1000), (1, 1)] * 5


def _plan(**kwargs):
    defaults = {"tensor_parallel": 4, "kv_dtype": "fp8", "max_model_len": 4096}
    return plan(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], **{**defaults, **kwargs})


def test_memory_breakdown_sums_to_gpu_memory():
    capacity = _plan()
    what_if = workload_what_if(capacity, REQUESTS)
    parts = memory_breakdown(capacity, what_if)
    assert sum(parts.values()) == capacity.gpu_memory_bytes
    assert parts["weights"] == capacity.weights_bytes and parts["activations"] == capacity.activation_bytes
    assert parts["kv cache"] + parts["internal fragmentation"] == what_if.kv_used_bytes
    assert parts["kv cache"] + parts["internal fragmentation"] + parts["free"] == capacity.kv_budget_bytes
    assert parts["headroom"] == capacity.gpu_memory_bytes - capacity.usable_bytes
    # Without a workload the whole KV budget is free.
    assert memory_breakdown(capacity, None)["free"] == capacity.kv_budget_bytes


def test_memory_breakdown_when_weights_overflow():
    capacity = _plan(tensor_parallel=1)  # 131 GiB of weights on an 80 GiB GPU
    parts = memory_breakdown(capacity, None)
    assert parts["free"] == 0 and parts["kv cache"] == 0 and parts["headroom"] == 0
    assert parts["weights"] > capacity.gpu_memory_bytes


def test_memory_breakdown_figure_draws_gib():
    capacity = _plan()
    parts = memory_breakdown(capacity, workload_what_if(capacity, REQUESTS))
    fig = memory_breakdown_figure({"A": parts}, {"A": capacity.gpu_memory_bytes})
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == len(BREAKDOWN_ORDER)
    drawn = {bar.name: bar.x[0] for bar in bars}
    assert drawn["weights"] == pytest.approx(capacity.weights_bytes / GiB)
    assert sum(drawn.values()) == pytest.approx(81_559 / 1024)  # the H100's driver-reported 79.6 GiB
    assert "GiB" in fig.layout.xaxis.title.text
    marker = next(t for t in fig.data if t.type == "scatter")
    assert marker.x[0] == pytest.approx(81_559 / 1024)


def test_concurrency_vs_context_figure():
    capacity = _plan()
    contexts = [512, 1024, 4096, 131072]
    values = concurrency_vs_context(capacity, contexts)
    fig = concurrency_vs_context_figure(contexts, {"H100": values, "other": [1, 1, 1, 1]}, 4096)
    assert list(fig.data[0].y) == values and list(fig.data[0].x) == contexts
    assert values[2] == capacity.max_concurrency
    assert "tokens" in fig.layout.xaxis.title.text and "requests" in fig.layout.yaxis.title.text
    assert fig.layout.xaxis.type == "log"


def test_paged_vs_contiguous_figure_uses_memory_bound_values():
    capacity = _plan()
    what_if = workload_what_if(capacity, REQUESTS)
    fig = paged_vs_contiguous_figure({"A": what_if}, {"A": 256})
    bars = {t.name.split(" ")[0]: t.y[0] for t in fig.data if t.type == "bar"}
    assert bars["paged"] == pytest.approx(what_if.paged_memory_concurrency)
    assert bars["contiguous"] == what_if.contiguous_memory_concurrency == capacity.kv_tokens // 4096
    assert bars["Orca-Oracle"] == pytest.approx(what_if.oracle_memory_concurrency)
    assert "requests" in fig.layout.yaxis.title.text
    cap = next(t for t in fig.data if t.type == "scatter")
    assert cap.y[0] == 256


def test_fragmentation_figure_percent_and_highlight():
    rows = fragmentation_by_block_size(REQUESTS, [1, 16, 128])
    fig = fragmentation_figure(rows, 16)
    bar = fig.data[0]
    assert list(bar.x) == ["1", "16", "128"]
    assert bar.y[0] == 0 and bar.y[1] == pytest.approx(100 * rows[1]["internal_fragmentation"])
    assert bar.marker.color[1] != bar.marker.color[0]
    assert "tokens" in fig.layout.xaxis.title.text and "%" in fig.layout.yaxis.title.text
