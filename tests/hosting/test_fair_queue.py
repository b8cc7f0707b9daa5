"""Fair heavy work: the queue grows with the people present (up to PAGED_LAB_MAX_SESSIONS), so the 17th of 20
people is not refused; a queued session sees its place and an estimate of its wait; a session holds one job."""

import pytest

from core.errors import QueueFullError
from core.jobs import JobPool, ResultCache
from core.limits import Limits
from tests.hosting import job_functions as jf
from tests.hosting.test_jobs import wait_for


def _pool(**kwargs) -> JobPool:
    return JobPool(workers=1, timeout_s=30.0, cache=ResultCache(64, 600), abandon_after_s=30.0, **kwargs)


def test_twenty_people_with_distinct_jobs_are_all_queued_and_served():
    pool = _pool(max_queued=4, max_sessions=50)
    try:
        statuses = [pool.submit(f"p{i}", jf.sleep_steps, 1, 0.02, i) for i in range(20)]
        positions = [s.position for s in statuses if s.state == "queued"]
        assert len(positions) >= 19 and positions == list(range(positions[0], positions[0] + len(positions)))
        assert positions[-1] == pool.stats()["queued"] >= 19  # the 20th person waits at the back, not refused
        for index in range(20):
            assert wait_for(pool, f"p{index}", timeout=120)[-1].result[0] == index
    finally:
        pool.close()


def test_over_max_sessions_people_waiting_the_next_is_refused_naming_the_limit():
    pool = _pool(max_queued=2, max_sessions=5)
    try:
        pool.submit("s0", jf.sleep_steps, 40, 0.05, "running")
        wait_for(pool, "s0", lambda s: s.state == "running")
        for index in range(1, 6):  # five people wait: within the limit of five
            assert pool.submit(f"s{index}", jf.sleep_steps, 1, 0.01, index).state == "queued"
        with pytest.raises(QueueFullError, match="PAGED_LAB_MAX_SESSIONS") as caught:
            pool.submit("s6", jf.sleep_steps, 1, 0.01, 6)
        assert caught.value.variable == "PAGED_LAB_MAX_SESSIONS" and pool.poll("s6").state == "idle"
        assert pool.submit("s7", jf.sleep_steps, 1, 0.01, 3).position == 3  # joining s3's job takes no place
    finally:
        pool.close()


def test_a_session_holds_one_job_whatever_it_asks_for():
    pool = _pool(max_queued=4, max_sessions=50)
    try:
        pool.submit("busy", jf.sleep_steps, 40, 0.05, "running")
        wait_for(pool, "busy", lambda s: s.state == "running")
        for value in range(5):
            status = pool.submit("me", jf.sleep_steps, 1, 0.01, value)
        assert status.position == 1 and pool.stats()["queued"] == 1  # the four earlier asks were dropped
    finally:
        pool.close()


def test_a_queued_session_sees_an_estimate_from_the_functions_recent_run_times():
    pool = _pool(max_queued=4, max_sessions=50)
    try:
        first = pool.submit("a", jf.sleep_steps, 5, 0.2, "first")
        assert first.estimate_s is None  # nothing of this function has finished yet
        wait_for(pool, "a")  # ~1 s
        pool.submit("b", jf.sleep_steps, 5, 0.2, "second")
        wait_for(pool, "b", lambda s: s.state == "running")
        queued = pool.submit("c", jf.sleep_steps, 5, 0.2, "third")
        assert queued.state == "queued" and queued.position == 1
        # b's remaining (< 1 s) plus c's own mean run (~1 s): between 1 and 2 s, allowing a slow machine
        assert 0.8 <= queued.estimate_s <= 4.0, queued
        running = wait_for(pool, "c", lambda s: s.state == "running" and s.fraction >= 0.4)[-1]
        assert 0 <= running.estimate_s <= 2.0, running
    finally:
        pool.close()


def test_the_limits_size_the_pool():
    pool = JobPool.from_limits(Limits(workers=1, max_queued_jobs=3, max_sessions=40))
    try:
        assert (pool.max_queued, pool.max_sessions) == (3, 40)
    finally:
        pool.close()
