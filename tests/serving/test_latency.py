"""Latency under load: the simulator's per-request TTFT / TPOT / e2e / queue percentiles against a hand-worked run
and against a brute-force recomputation from the recorded times."""

import math

import pytest

from core.planning.cost.step_model import StepTimeModel
from core.planning.cost.step_time import opt_13b_a100
from core.serving.latency import LATENCY_METRICS, PERCENTILES, latency_summary
from core.serving.memory_policies import paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request, sharegpt

FLAT = StepTimeModel(0.0, 0.0, 0.0, 0.0, 1e12, 1e15, overhead_s=0.010)  # every step 10 ms


def test_two_requests_one_slot_by_hand():
    # max_num_seqs 1: request 1 waits for request 0 (prefill 10 ms, then 2 decode steps of 10 ms)
    requests = [Request(0, 0.0, 5, 3), Request(1, 0.0, 5, 3)]
    result = simulate(
        requests, paged(16), SimulatorConfig(step_time=FLAT, max_num_seqs=1, kv_capacity_tokens=64)
    )
    frame = result.requests
    assert frame["admit_time"].tolist() == pytest.approx([0.0, 0.03])
    assert frame["first_token_time"].tolist() == pytest.approx([0.01, 0.04])
    assert frame["finish_time"].tolist() == pytest.approx([0.03, 0.06])
    s = result.summary
    assert s["ttft_p50_s"] == pytest.approx((0.01 + 0.04) / 2)  # linear interpolation between the two
    assert s["ttft_p95_s"] == pytest.approx(0.01 + 0.95 * 0.03)
    assert s["tpot_p99_s"] == pytest.approx(0.01)  # (0.03 - 0.01) / 2 for both
    assert s["queue_p50_s"] == pytest.approx(0.015) and s["mean_queue_s"] == pytest.approx(0.015)
    assert s["e2e_p99_s"] == pytest.approx(0.03 + 0.99 * 0.03)
    assert s["output_throughput_tokens_per_s"] == pytest.approx(6 / 0.06)
    assert s["request_throughput_per_s"] == pytest.approx(2 / 0.06)


def _percentile(values: list[float], q: float) -> float:
    """The linear-interpolation percentile, written out."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * q / 100
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])


def test_percentiles_match_a_brute_force_recomputation():
    requests = sharegpt(300, rate=3.0, seed=4)
    result = simulate(requests, paged(16), SimulatorConfig(step_time=opt_13b_a100()))
    per = {name: [] for name in LATENCY_METRICS}
    for row in result.requests.itertuples():
        assert row.arrival_time <= row.admit_time <= row.first_token_time <= row.finish_time
        per["ttft"].append(row.first_token_time - row.arrival_time)
        per["e2e"].append(row.finish_time - row.arrival_time)
        per["queue"].append(row.admit_time - row.arrival_time)
        if row.output_len > 1:
            per["tpot"].append((row.finish_time - row.first_token_time) / (row.output_len - 1))
    summary = result.summary
    for name, values in per.items():
        for q in PERCENTILES:
            assert summary[f"{name}_p{q}_s"] == pytest.approx(_percentile(values, q), rel=1e-12), (name, q)
        assert summary[f"mean_{name}_s"] == pytest.approx(sum(values) / len(values), rel=1e-12)
    span = result.requests["finish_time"].max() - result.requests["arrival_time"].min()
    assert summary["output_throughput_tokens_per_s"] == pytest.approx(
        sum(r.output_len for r in requests) / span
    )
    # admissions happen at step boundaries: at a step's start (the previous step's end) or an idle jump
    starts = set((result.steps["time_s"] - result.steps["step_time_ms"] / 1000).round(9))
    assert set(result.requests["admit_time"].round(9)) <= starts
    # the existing keys stay
    assert {"mean_ttft_s", "mean_latency_s", "throughput_tokens_per_s", "requests_per_s"} <= set(summary)


def test_latency_summary_without_finished_requests_or_tpot():
    frame = simulate([Request(0, 0.0, 4, 1)], paged(16), SimulatorConfig(step_time=FLAT)).requests
    out = latency_summary(frame)
    assert "tpot_p50_s" not in out and out["ttft_p50_s"] == pytest.approx(0.01)
    assert latency_summary(frame.assign(finish_time=math.nan)) == {}
