"""One worker pool for several replicas: a pool process's `JobPool` served over a Unix socket to `RemotePool`
clients, with results in the shared disk cache. Each replica here is a `RemotePool` with its own connection and
its own in-memory cache, as in two Streamlit processes."""

import os
import secrets
from multiprocessing.connection import AuthenticationError

import pytest

from core.errors import MemoryBudgetError
from core.jobs import JobPool, ResultCache
from core.jobs.disk_cache import DiskResultCache
from core.jobs.remote import STORED, PoolServer, RemotePool, _DiskIndex, remote_pool_from_env
from core.limits import Limits
from tests.hosting import job_functions as jf
from tests.hosting.test_jobs import wait_for

KEY = secrets.token_bytes(16)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    directory = tmp_path_factory.mktemp("shared")
    disk = DiskResultCache(directory / "results", 16, 600)
    pool = JobPool(workers=1, max_queued=4, timeout_s=10.0, cache=ResultCache(8, 600), abandon_after_s=5.0)
    pool.cache = _DiskIndex(disk)
    address = str(directory / "pool.sock")
    server = PoolServer(address, KEY, pool, disk)
    replicas = [RemotePool(address, KEY, DiskResultCache(directory / "results", 16, 600)) for _ in range(2)]
    yield server, replicas, disk
    for replica in replicas:
        replica.close()
    server.close()


def test_a_result_computed_for_one_replica_serves_the_other_from_disk(host):
    server, (one, two), disk = host
    first = one.submit("a", jf.sleep_steps, 3, 0.05, "shared")
    assert first.state in ("queued", "running")
    done = wait_for(one, "a")[-1]
    value, steps, pid = done.result
    assert (value, steps) == ("shared", 3) and pid in one.worker_pids() and pid != os.getpid()
    assert disk.contains(("tests.hosting.job_functions", "sleep_steps", (3, 0.05, "shared")))
    other = two.submit("b", jf.sleep_steps, 3, 0.05, "shared")  # another replica, another session
    assert other.state == "done" and other.cached and other.result == done.result  # the same worker's pid
    assert other.result is not STORED
    assert server.pool.stats()["running"] == 0 and server.pool.stats()["queued"] == 0


def test_a_replica_reads_a_result_once_then_serves_it_from_memory(host):
    _, (one, _), disk = host
    if not one.submit("c", jf.sleep_steps, 1, 0.01, 7).finished:
        wait_for(one, "c")
    for path in disk.directory.glob("*.result"):
        path.unlink()  # gone from disk: a second ask must be answered from this replica's memory
    again = one.submit("c2", jf.sleep_steps, 1, 0.01, 7)
    assert again.state == "done" and again.result[0] == 7


def test_queue_places_progress_and_errors_travel(host):
    _, (one, two), _ = host
    one.submit("q1", jf.sleep_steps, 8, 0.1, "first")
    queued = two.submit("q2", jf.sleep_steps, 1, 0.01, "second")
    assert queued.state == "queued" and queued.position == 1 and queued.running == 1
    seen = wait_for(one, "q1")
    assert any(0 < s.fraction < 1 for s in seen if s.state == "running")
    assert wait_for(two, "q2")[-1].result[0] == "second"
    two.submit("e", jf.raise_budget, 123)
    failed = wait_for(two, "e")[-1]
    assert failed.state == "failed" and isinstance(failed.error, MemoryBudgetError)
    assert failed.error.requested_bytes == 123


def test_a_client_with_the_wrong_key_is_refused_and_the_server_keeps_serving(host):
    _, (one, _), _ = host
    with pytest.raises(AuthenticationError):
        RemotePool(one.address, b"wrong key", one.disk).stats()
    assert one.stats()["workers"] == 1


def test_the_environment_names_the_shared_pool(tmp_path):
    limits = Limits()
    assert remote_pool_from_env(limits, {}) is None
    pool = remote_pool_from_env(
        limits,
        {
            "PAGED_LAB_POOL_SOCKET": "/x.sock",
            "PAGED_LAB_POOL_KEY": "00ff",
            "PAGED_LAB_CACHE_DIR": str(tmp_path),
        },
    )
    assert isinstance(pool, RemotePool) and pool.address == "/x.sock" and pool.disk.directory == tmp_path


def test_a_page_asking_for_more_results_than_a_few_reads_each_from_disk_once(host, monkeypatch):
    """Six small results asked for in turn, again and again, as the Kernels and Simulator pages do: each is read
    from disk once; the replica's memory (bounded by bytes, not by a handful of entries) serves every repeat."""
    _, (one, _), _ = host
    for n in range(6):
        if not one.submit(f"m{n}", jf.sleep_steps, 1, 0.01, f"page-{n}").finished:
            wait_for(one, f"m{n}")
    reads = []
    real_get_sized = one.disk.get_sized
    monkeypatch.setattr(one.disk, "get_sized", lambda key: reads.append(key) or real_get_sized(key))
    one.cache.clear()
    for _ in range(3):
        for n in range(6):
            status = one.submit(f"r{n}", jf.sleep_steps, 1, 0.01, f"page-{n}")
            assert status.state == "done" and status.result[0] == f"page-{n}"
    assert len(reads) == 6


def _result(pool, session: str, fn, *args):
    status = pool.submit(session, fn, *args)
    return (status if status.finished else wait_for(pool, session)[-1]).result


def test_recycling_gives_idle_workers_a_fresh_process_and_spares_a_running_job(host):
    """What the team host does after its warm-up: whatever the warm-up's jobs left in a worker is gone."""
    _, (one, _), _ = host
    _result(one, "m1", jf.memoise, "a")
    count, pid = _result(one, "m2", jf.memoise, "b")
    assert count >= 2 and one.worker_pids() == [pid]  # one worker, remembering both
    restarts = one.stats()["restarts"]
    assert one.recycle_idle_workers() == 1
    assert one.worker_pids() != [pid] and one.stats()["restarts"] == restarts  # not counted as a failure
    count, fresh = _result(one, "m3", jf.memoise, "c")
    assert count == 1 and fresh != pid  # a new process: its memo starts empty
    one.submit("busy", jf.sleep_steps, 20, 0.05, "kept")
    wait_for(one, "busy", lambda s: s.state == "running")
    assert one.recycle_idle_workers() == 0  # its only worker is running a job: kept
    assert wait_for(one, "busy")[-1].result[0] == "kept" and one.worker_pids() == [fresh]
