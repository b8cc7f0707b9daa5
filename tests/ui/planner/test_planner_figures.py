"""Planner figure builders: the drawn numbers are the plan's numbers, axes carry units."""

import numpy as np
import pytest

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.plan import concurrency_vs_context, plan
from core.planning.memory.what_if import fragmentation_by_block_size, memory_breakdown, workload_what_if
from ui.planner.figures import (
    BREAKDOWN_ORDER,
    activation_label,
    concurrency_vs_context_figure,
    context_label,
    fragmentation_figure,
    memory_breakdown_figure,
    paged_vs_contiguous_figure,
)
from ui.theme import integer_dtick

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


def test_concurrency_axes_label_only_spaced_ticks():
    """Log axes: x labels at every other power of two (no minor labels running together, "4,0005,0006,000"),
    y labels one per decade (dtick 1), whole numbers."""
    contexts = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 6000]
    fig = concurrency_vs_context_figure(sorted(contexts), {"H100": [100] * 10}, 6000)
    assert list(fig.layout.xaxis.tickvals) == [512, 2048, 8192, 32768, 131072]
    assert list(fig.layout.xaxis.ticktext) == ["512", "2k", "8k", "32k", "128k"]
    ratios = np.diff(np.log10(fig.layout.xaxis.tickvals))
    assert (ratios >= np.log10(4) - 1e-9).all()  # labels at least 4x apart: ~0.6 decade each
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.tickformat == ",d"


def test_context_labels_and_integer_ticks():
    assert [context_label(t) for t in (16, 1000, 4096, 131072, 1 << 20)] == [
        "16",
        "1,000",
        "4k",
        "128k",
        "1M",
    ]
    assert [integer_dtick(v) for v in (0.4, 3, 6, 7, 40, 250, 1300)] == [1, 1, 1, 2, 10, 50, 500]


def test_paged_vs_contiguous_counts_have_whole_ticks():
    capacity = _plan()
    what_if = workload_what_if(capacity, REQUESTS)
    fig = paged_vs_contiguous_figure({"A": what_if}, {"A": 256})
    top = max(what_if.paged_memory_concurrency, 256)
    assert fig.layout.yaxis.dtick == integer_dtick(top) >= 1 and float(fig.layout.yaxis.dtick).is_integer()


def test_activations_are_named_as_the_formula_names_them():
    capacity = _plan()
    parts = memory_breakdown(capacity, None)
    estimated = memory_breakdown_figure({"A": parts}, {"A": capacity.gpu_memory_bytes})
    entered = memory_breakdown_figure({"A": parts}, {"A": capacity.gpu_memory_bytes}, {"A": False})
    both = memory_breakdown_figure({"A": parts, "B": parts}, {"A": 1, "B": 1}, {"A": True, "B": False})
    names = [[t.name for t in f.data if t.name.startswith("activations")] for f in (estimated, entered, both)]
    assert names == [
        ["activations (estimate)"],
        ["activations (entered peak)"],
        ["activations (estimate / entered peak)"],
    ]
    assert list(both.data[1].customdata) == ["activations (estimate)", "activations (entered peak)"]
    assert capacity.activation_estimated and activation_label(None) == "activations (estimate)"
