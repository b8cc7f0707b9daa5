"""The result cache several replicas share on disk: round trips, its bounds, and concurrent writers in separate
processes that never leave a partial file."""

import multiprocessing
import os
import pickle
import time

from core.jobs import MISSING
from core.jobs.disk_cache import SUFFIX, DiskResultCache, key_digest
from core.jobs.worker import start_without_main

KEY = ("core.page_models.tasks", "compare_policies", (1, 2.5, "x"))


def test_a_value_comes_back_equal_in_another_cache_object(tmp_path):
    DiskResultCache(tmp_path, 4, 60).put(KEY, {"rows": list(range(1000))})
    assert DiskResultCache(tmp_path, 4, 60).get(KEY) == {"rows": list(range(1000))}
    assert DiskResultCache(tmp_path, 4, 60).get(("other",)) is MISSING


def test_at_most_max_entries_and_the_least_recently_used_go_first(tmp_path):
    cache = DiskResultCache(tmp_path, 3, 60)
    for index in range(3):
        cache.put(("k", index), index)
        os.utime(cache._path(("k", index)), (time.time() - 30 + index, time.time() - 30 + index))
    assert cache.get(("k", 0)) == 0  # a hit makes ("k", 0) the most recent
    cache.put(("k", 3), 3)
    assert len(cache) == 3
    assert cache.get(("k", 1)) is MISSING  # the oldest unread one went
    assert [cache.get(("k", i)) for i in (0, 2, 3)] == [0, 2, 3]


def test_byte_bound_expiry_and_off(tmp_path):
    cache = DiskResultCache(tmp_path / "a", 100, 60, max_bytes=3000)
    for index in range(5):
        cache.put(("big", index), b"x" * 1000)
    assert len(cache) == 2  # each file is ~1 kB plus the pickled key
    assert cache.get(("big", 4)) == b"x" * 1000
    expiring = DiskResultCache(tmp_path / "b", 10, 0.5)
    expiring.put(KEY, 1)
    os.utime(expiring._path(KEY), (time.time() - 5, time.time() - 5))
    assert expiring.get(KEY) is MISSING and not expiring.contains(KEY)
    off = DiskResultCache(tmp_path / "c", 0, 60)
    assert off.put(KEY, 1) is False and off.get(KEY) is MISSING


def test_a_file_holding_another_key_is_a_miss(tmp_path):
    cache = DiskResultCache(tmp_path, 4, 60)
    cache.put(("a",), 1)
    os.replace(cache._path(("a",)), cache._path(("b",)))  # as if ("b",) had the same digest
    assert cache.get(("b",)) is MISSING
    (tmp_path / (key_digest(("c",)) + SUFFIX)).write_bytes(b"not a pickle")
    assert cache.get(("c",)) is MISSING


def _writer(directory: str, writer: int, rounds: int) -> None:
    cache = DiskResultCache(directory, 8, 60)
    for index in range(rounds):
        key = ("shared", index % 4)  # every writer writes the same four keys, and its own ones
        cache.put(key, [key[1]] * 20_000)
        cache.put(("own", writer, index), [writer] * 20_000)


def test_concurrent_writers_in_four_processes_leave_whole_files_within_the_bound(tmp_path):
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_writer, args=(str(tmp_path), w, 30)) for w in range(4)]
    for process in processes:
        # not re-running the worker's __main__: after an AppTest in this pytest-xdist worker that is app.py, whose
        # imports (torch, Streamlit) took each writer ~9 s of CPU
        start_without_main(process)
    reader = DiskResultCache(tmp_path, 8, 60)
    reads = 0
    while any(p.is_alive() for p in processes):
        for index in range(4):
            try:  # read the file directly: a partial file would raise here, where `get` would call it a miss
                with open(reader._path(("shared", index)), "rb") as file:
                    key, value = pickle.load(file)
            except FileNotFoundError:  # not written yet, or pruned
                continue
            assert key == ("shared", index) and value == [index] * 20_000
            reads += 1
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert reads > 0
    assert len(reader) <= 8 + 4  # a writer prunes after its own write; others may be between write and prune
    assert not list(tmp_path.glob(".tmp-*"))
