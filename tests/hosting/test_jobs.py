"""The worker pool with small real jobs: progress, results, the cache, cancellation, timeouts, queue limits,
two sessions, failures that travel back as LabErrors."""

import os
import time
from pathlib import Path

import pytest

from core.errors import (
    InvalidArgumentError,
    JobError,
    JobFailedError,
    JobTimeoutError,
    MemoryBudgetError,
    QueueFullError,
)
from core.jobs import JobPool, ResultCache
from core.limits import Limits
from tests.hosting import job_functions as jf


def wait_for(pool, session, until=lambda s: s.finished, timeout=60.0):
    """Poll like the page does until `until(status)`; returns every status seen (the last satisfies it)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(pool.poll(session))
        if until(seen[-1]):
            return seen
        time.sleep(0.02)
    raise AssertionError(f"timed out; last status {seen[-1]}")


@pytest.fixture(scope="module")
def pool():
    pool = JobPool(workers=1, max_queued=3, timeout_s=3.0, cache=ResultCache(8, 600), abandon_after_s=5.0)
    yield pool
    pool.close()


def test_job_runs_in_a_worker_reports_progress_and_is_cached(pool):
    first = pool.submit("a", jf.sleep_steps, 5, 0.15, "x")
    assert first.state in ("queued", "running") and not first.cached
    seen = wait_for(pool, "a")
    value, steps, pid = seen[-1].result
    assert (value, steps) == ("x", 5) and pid != os.getpid() and pid in pool.worker_pids()
    fractions = [s.fraction for s in seen if s.state == "running"]
    assert fractions == sorted(fractions) and any(0 < f < 1 for f in fractions)
    assert any(s.message.startswith("step ") for s in seen)
    # a second session asking the same thing gets the very same value at once
    again = pool.submit("b", jf.sleep_steps, 5, 0.15, "x")
    assert again.state == "done" and again.cached and again.result is seen[-1].result


def test_resubmitting_the_same_inputs_does_not_restart(pool):
    first = pool.submit("c", jf.sleep_steps, 10, 0.05, "same")
    time.sleep(0.2)
    second = pool.submit("c", jf.sleep_steps, 10, 0.05, "same")
    assert second.state == "running" and second.fraction >= first.fraction
    assert wait_for(pool, "c")[-1].result[0] == "same"


def test_queue_position_two_sessions_and_sharing(pool):
    pool.submit("s1", jf.sleep_steps, 6, 0.1, "one")
    second = pool.submit("s2", jf.sleep_steps, 2, 0.05, "two")
    assert second.state == "queued" and second.position == 1
    shared = pool.submit("s3", jf.sleep_steps, 2, 0.05, "two")  # same inputs: joins s2's job
    assert shared.state == "queued" and shared.position == 1 and shared.queued == 1
    assert wait_for(pool, "s1")[-1].result[0] == "one"
    results = [wait_for(pool, s)[-1].result for s in ("s2", "s3")]
    assert results[0] is results[1] and results[0][0] == "two"


def test_submitting_other_inputs_cancels_the_previous_job(pool):
    pool.submit("d", jf.sleep_steps, 50, 0.1, "long")
    wait_for(pool, "d", lambda s: s.state == "running")
    pid = pool.worker_pids()[0]
    pool.submit("d", jf.sleep_steps, 1, 0.01, "short")
    assert wait_for(pool, "d")[-1].result[0] == "short"
    assert pool.worker_pids()[0] == pid  # stopped cooperatively at a progress call, no restart needed


def test_cancel_while_queued_removes_the_job(pool):
    pool.submit("e1", jf.sleep_steps, 5, 0.1, "first")
    assert pool.submit("e2", jf.sleep_steps, 1, 0.01, "queued").position == 1
    pool.cancel("e2")
    assert pool.poll("e2").state == "idle" and pool.stats()["queued"] == 0
    wait_for(pool, "e1")


def test_full_queue_refuses_naming_the_limit(pool):
    pool.submit("f0", jf.sleep_steps, 10, 0.1, "running")
    wait_for(pool, "f0", lambda s: s.state == "running")
    for index in range(3):
        pool.submit(f"f{index + 1}", jf.sleep_steps, 1, 0.01, index)
    with pytest.raises(QueueFullError, match="PAGED_LAB_MAX_QUEUED_JOBS") as caught:
        pool.submit("f4", jf.sleep_steps, 1, 0.01, "refused")
    assert caught.value.variable == "PAGED_LAB_MAX_QUEUED_JOBS" and pool.poll("f4").state == "idle"
    for index in range(4):
        pool.cancel(f"f{index}")
    assert pool.stats()["queued"] == 0


def test_job_over_the_wall_time_limit_is_stopped_and_its_worker_replaced(pool):
    restarts = pool.stats()["restarts"]
    old = pool.worker_pids()
    pool.submit("t", jf.sleep_forever)
    final = wait_for(pool, "t", timeout=30)[-1]
    assert final.state == "failed" and isinstance(final.error, JobTimeoutError)
    assert "PAGED_LAB_JOB_TIMEOUT_S" in str(final.error) and "3 s" in str(final.error)
    assert pool.stats()["restarts"] == restarts + 1 and pool.worker_pids() != old
    # the replacement worker serves the next job
    pool.submit("t", jf.sleep_steps, 1, 0.01, "after")
    assert wait_for(pool, "t")[-1].result[0] == "after"


def test_a_job_that_ignores_cancel_is_stopped_by_force(pool):
    pool.submit("g", jf.sleep_forever)
    wait_for(pool, "g", lambda s: s.state == "running")
    restarts = pool.stats()["restarts"]
    pool.cancel("g")
    deadline = time.monotonic() + 20
    while pool.stats()["restarts"] == restarts and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.stats()["restarts"] == restarts + 1 and pool.stats()["running"] == 0


def test_errors_travel_back_as_lab_errors(pool):
    pool.submit("h", jf.raise_budget, 123_456)
    error = wait_for(pool, "h")[-1].error
    assert type(error) is MemoryBudgetError and str(error) == "needs 123,456 bytes"
    assert (error.requested_bytes, error.allowed_bytes) == (123_456, 1)
    pool.submit("h", jf.raise_bug)
    error = wait_for(pool, "h")[-1].error
    assert isinstance(error, JobFailedError) and "ZeroDivisionError" in str(error)
    pool.submit("h", jf.unpicklable_result)
    assert wait_for(pool, "h")[-1].state == "failed"
    assert not isinstance(MemoryBudgetError, JobError)


def test_a_session_that_stops_polling_has_left(pool):
    pool.submit("gone", jf.sleep_steps, 200, 0.1, "abandoned")
    time.sleep(pool.abandon_after_s + 1.0)
    assert pool.poll("gone").state == "idle" and pool.stats()["running"] == 0


def test_bad_jobs_are_refused_before_queueing(pool):
    with pytest.raises(InvalidArgumentError, match="module-level"):
        pool.submit("x", lambda progress: None)
    with pytest.raises(InvalidArgumentError, match="hashable"):
        pool.submit("x", jf.sleep_steps, 1, 0.01, [1, 2])
    assert pool.poll("x").state == "idle"


def test_workers_read_the_operator_limits():
    limits = Limits(max_tensor_bytes=12_345, workers=1, job_timeout_s=30.0, cache_entries=0)
    pool = JobPool.from_limits(limits)
    try:
        pool.submit("l", jf.worker_limits)
        assert wait_for(pool, "l")[-1].result == limits
        assert pool.submit("l2", jf.worker_limits).state != "done"  # cache_entries=0: nothing is cached
    finally:
        pool.close()


def test_result_cache_bounds_and_ttl():
    now = [0.0]
    cache = ResultCache(2, ttl_s=10, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)  # evicts b, the least recently used
    assert len(cache) == 2 and cache.get("b") is cache.get("zzz")
    now[0] = 11
    assert cache.get("a") is cache.get("missing") and len(cache) == 1


def test_result_cache_bytes_bound_evicts_the_least_recently_used_but_keeps_the_newest():
    cache = ResultCache(16, ttl_s=10, max_bytes=100)
    cache.put("a", 1, nbytes=40)
    cache.put("b", 2, nbytes=40)
    cache.get("a")
    cache.put("c", 3, nbytes=40)  # 120 > 100: b, the least recently used, goes
    assert cache.get("b") is cache.get("missing") and cache.get("a") == 1 and cache.get("c") == 3
    cache.put("a", 1, nbytes=10)  # replacing an entry counts its new size only: 50 bytes held
    cache.put("d", 4, nbytes=50)
    assert len(cache) == 3
    cache.put("huge", 5, nbytes=1_000)  # alone over the bound: kept, everything older goes
    assert len(cache) == 1 and cache.get("huge") == 5


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_an_idle_worker_gives_back_the_heap_its_job_freed():
    """A kernel timing keeps up to 1 GiB of freed heap (tune_malloc); after the job the worker trims it."""
    pool = JobPool(workers=1, max_queued=2, timeout_s=60.0, cache=ResultCache(0, 600), abandon_after_s=30.0)
    try:
        status = pool.submit("small", jf.churn_heap, 1)
        if not status.finished:
            status = wait_for(pool, "small")[-1]
        pid = status.result
        before = _rss_mib(pid)
        status = pool.submit("big", jf.churn_heap, 400)
        if not status.finished:
            status = wait_for(pool, "big")[-1]
        assert status.result == pid
        time.sleep(0.5)  # the worker trims after sending its result
        assert _rss_mib(pid) < before + 100, (before, _rss_mib(pid))
    finally:
        pool.close()


def test_what_the_preload_imported_is_out_of_the_collectors_sight():
    """The full collection after every job walks only what jobs made: the preloaded modules' objects are frozen."""
    pool = JobPool(
        workers=1, max_queued=2, timeout_s=60.0, cache=ResultCache(0, 600), preload=("plotly.graph_objects",)
    )
    try:
        status = pool.submit("sight", jf.collector_sight)
        if not status.finished:
            status = wait_for(pool, "sight")[-1]
        frozen, tracked = status.result
        assert frozen > 10_000 and tracked < frozen / 10, (frozen, tracked)
    finally:
        pool.close()
