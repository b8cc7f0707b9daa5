"""The job entry points the pages submit: same numbers as calling core directly, limits checked first, and the
limit errors arrive intact through a worker."""

import time

import pytest

from core.errors import MemoryBudgetError
from core.jobs import JobPool
from core.jobs.tasks import compare_policies, kernel_correctness, kernel_sweep
from core.kernels.timing import KernelConfig, correctness, sweep_contexts
from core.limits import LimitExceededError, Limits
from core.serving.experiment import SimulatorParams, run_comparison, steady_summary

SMALL = SimulatorParams(num_requests=40, rate=8.0, policies=("paged", "orca-max"))
TINY_KERNEL = KernelConfig(batch=2, context_len=64, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16)


def test_compare_policies_is_run_comparison_with_steady_summaries():
    results, summaries = compare_policies(SMALL)
    requests = SMALL.requests()
    reference = run_comparison(SMALL, requests)
    assert set(results) == set(reference) == {"paged", "orca-max"}
    for name, result in reference.items():
        assert summaries[name] == steady_summary(result, requests)
        assert len(results[name].steps) == len(result.steps)


def test_simulated_requests_are_checked_before_generating(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MAX_REQUESTS", "39")
    with pytest.raises(LimitExceededError, match=r"40 requests.*39.*PAGED_LAB_MAX_REQUESTS"):
        compare_policies(SMALL)


def test_kernel_jobs_match_timing_and_refuse_over_budget(monkeypatch):
    assert (
        kernel_correctness(TINY_KERNEL, ("torch",), "cpu").keys()
        == correctness(TINY_KERNEL, ["torch"]).keys()
    )
    sweep = kernel_sweep(TINY_KERNEL, ("torch",), "cpu", 1)
    assert sweep["contexts"] == sweep_contexts(64, 16) == [16, 32, 64]
    assert [row["context_len"] for row in sweep["rows"]] == [16, 32, 64] and sweep["copy_gbps"] > 0
    assert all(row["max_abs_err"] < 1e-4 for row in sweep["rows"])
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", str(TINY_KERNEL.footprint_bytes - 1))
    with pytest.raises(MemoryBudgetError):
        kernel_sweep(TINY_KERNEL, ("torch",), "cpu", 1)


def test_a_limit_error_travels_back_from_the_worker_intact():
    pool = JobPool.from_limits(Limits(max_simulated_requests=10, workers=1))
    try:
        pool.submit("s", compare_policies, SMALL, None)
        deadline = time.monotonic() + 120
        while not (status := pool.poll("s")).finished and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isinstance(status.error, LimitExceededError)
        assert status.error.variable == "PAGED_LAB_MAX_REQUESTS" and "over this server's limit of 10" in str(
            status.error
        )
    finally:
        pool.close()
