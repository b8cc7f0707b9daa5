"""The warm-up's edges without a host (a real host's warm-up is tests/hosting/test_host.py): a replica that does
not answer is reported, not raised, a stop request ends the warm-up at once, and a caller whose thread already runs
an event loop (Playwright's sync API does, for a whole test session) can still warm."""

import asyncio
import socket
import threading
import time

from hosting.warmup import warm_replicas
from tests.conftest import _free_port


def test_a_replica_that_does_not_answer_is_reported_and_the_others_still_warm():
    lines = []
    warm_up = warm_replicas([_free_port(), _free_port()], timeout_s=5, log=lines.append)
    assert not warm_up.stopped and [p.replica for p in warm_up.pages] == [1, 2], warm_up
    assert all(len(p.problems) == 1 for p in warm_up.pages), warm_up
    assert len(warm_up.problems) == 2 and "on replica 1: " in warm_up.problems[0], warm_up.problems
    assert lines == ["warming replicas 2-2: every page once, at the same time ..."]  # no page list came


def test_a_stop_request_ends_a_warm_up_that_waits_on_a_silent_replica():
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        warm_up = warm_replicas([silent.getsockname()[1]], timeout_s=60, log=print, should_stop=stop.is_set)
        assert warm_up.stopped and warm_up.pages == [] and time.monotonic() - started < 5


def test_a_caller_inside_a_running_event_loop_can_warm():
    async def caller():  # a synchronous call made while this thread's loop runs, as under Playwright's sync API
        return warm_replicas([_free_port()], timeout_s=5, log=lambda line: None)

    warm_up = asyncio.run(caller())
    assert not warm_up.stopped and len(warm_up.problems) == 1, warm_up
