"""Warming a team host before it says ready: every page rendered once at its defaults on every replica.

A freshly started replica pays, on its first visitor, for imports (torch, plotly, pandas), Streamlit's first
compile of each page script, its module-level caches, the pages' default jobs (computed by the shared pool into
the shared disk cache, or read from that cache into the replica's memory) and the first build of each chart
(`ui/charts.py`). Twenty people arriving at once on such a host waited 2-4 s at p95 for pages that take 0.1 s warm.
`warm_replicas` pays all of it before the host is opened to anyone:

1. Replica 1 renders every page of the app's navigation, one after another, in one session over Streamlit's own
   protocol (`hosting/protocol.py`, directly on the replica's loopback port): the pages submit their default
   jobs, so the shared pool computes each page's default results into the shared disk cache, one page at a time,
   with a progress line per page ("warming 3/7: ...").
2. The other replicas then render every page the same way, all at once: their jobs are already cached, so they
   only import, compile, read the results from disk and build their charts.

Nothing here decides which jobs a page runs: a page asks for exactly what it asks for when a visitor opens it.
A page that draws an exception or an error alert, or does not finish in time, is reported in the log and the
warm-up goes on (a broken page must not keep the others from being served).
"""

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hosting.protocol import ProtocolSession

STOP_CHECK_S = 0.2  # how often a warm-up in progress checks whether the host is being stopped


@dataclass
class PageWarmed:
    """One page rendered on one replica: its URL path ("" for the default page), sidebar title, seconds from
    request to script_finished, and what went wrong (exceptions, refusals, error alerts, a transport error)."""

    replica: int  # 1-based, in the launcher's order
    path: str
    title: str
    seconds: float
    problems: list[str] = field(default_factory=list)


@dataclass
class WarmUp:
    """What `warm_replicas` did: every page rendered, the seconds of phase 1 (replica 1, computing the shared
    results) and of phase 2 (the other replicas at once), and whether it was stopped before the end."""

    pages: list[PageWarmed]
    first_s: float
    others_s: float
    stopped: bool = False

    @property
    def problems(self) -> list[str]:
        return [
            f"{p.title or p.path} on replica {p.replica}: {text}" for p in self.pages for text in p.problems
        ]


async def warm_replica(
    port: int, replica: int, timeout_s: float, announce: Callable[[int, int, str, str], None] | None = None
) -> list[PageWarmed]:
    """Render every page of the replica on 127.0.0.1:`port` once, at its defaults, in one session: the default
    page by URL, then every other page of the navigation from the sidebar, in the navigation's order.
    `announce(index, total, path, title)` is called before each page (for the first, when the page list arrives,
    at the start of its run). A page that draws problems is recorded with them; a session that cannot connect,
    times out or drops ends the pass, recorded as the problem of the page it was on. Never raises for those."""
    done: list[PageWarmed] = []
    current = PageWarmed(replica, "", "", 0.0)  # the page being rendered
    started = time.perf_counter()
    try:
        # no page load first: a replica sets no cookie, and the websocket alone is cancelled at once on a stop
        async with ProtocolSession(f"http://127.0.0.1:{port}", timeout_s, load_page=False) as session:
            if announce is not None:
                session.on_navigation = lambda hashes: announce(1, len(hashes), *_first_page(session))
            render = await session.open("")
            session.on_navigation = None
            current.path, current.title = _first_page(session)
            current.seconds, current.problems = render.server_s, _problems(render)
            done.append(current)
            rest = [page for page in session.hashes if page != current.path]
            for index, page in enumerate(rest, start=2):
                current = PageWarmed(replica, page, session.titles.get(page, page), 0.0)
                if announce is not None:
                    announce(index, len(rest) + 1, page, current.title)
                started = time.perf_counter()
                render = await session.open(page)
                current.seconds, current.problems = render.server_s, _problems(render)
                done.append(current)
    except Exception as error:  # no connection, a timeout, a dropped socket: nothing more from this replica
        current.seconds, current.problems = time.perf_counter() - started, [_describe(error)]
        done.append(current)
    return done


def _first_page(session: ProtocolSession) -> tuple[str, str]:
    """(path, title) of the page a session opened with no path: the first of the navigation that the server
    marks as the default, else the first listed."""
    path = session.default_page if session.default_page is not None else next(iter(session.hashes), "")
    return path, session.titles.get(path, path)


def _problems(render) -> list[str]:
    return [*render.exceptions, *render.refusals, *render.errors]


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:300]}" if str(error) else type(error).__name__


async def _warm(ports: list[int], timeout_s: float, log: Callable[[str], None]) -> WarmUp:
    def announce(index: int, total: int, path: str, title: str) -> None:
        log(f"warming {index}/{total}: {title} (/{path}) defaults on replica 1 ...")

    started = time.perf_counter()
    pages = await warm_replica(ports[0], 1, timeout_s, announce)
    first_s = time.perf_counter() - started
    warm_up = WarmUp(pages, first_s, 0.0)
    if len(ports) > 1:
        log(f"warming replicas 2-{len(ports)}: every page once, at the same time ...")
        started = time.perf_counter()
        others = await asyncio.gather(
            *(warm_replica(port, index, timeout_s) for index, port in enumerate(ports[1:], start=2))
        )
        warm_up.others_s = time.perf_counter() - started
        warm_up.pages += [page for replica in others for page in replica]
    return warm_up


async def _until_stopped(work, should_stop: Callable[[], bool]):
    """`work`'s result, or None as soon as `should_stop()` says so (the work is then cancelled)."""
    task = asyncio.ensure_future(work)
    while not task.done():
        if should_stop():
            task.cancel()
            return None
        await asyncio.wait({task}, timeout=STOP_CHECK_S)
    return task.result()


def warm_replicas(
    ports: list[int],
    timeout_s: float,
    log: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
) -> WarmUp:
    """Warm the replicas listening on 127.0.0.1 at `ports` (phase 1 on the first, then phase 2 on the rest at
    once, as the module docstring says), each page given `timeout_s` seconds; progress goes to `log` as one line
    per step. Returns what was rendered; `stopped` is True when `should_stop()` turned true meanwhile (checked
    every STOP_CHECK_S), in which case the pages are those of neither phase."""
    if not ports:
        raise ValueError("no replica to warm")
    work = _until_stopped(_warm(ports, timeout_s, log), should_stop)
    # A loop of its own on a thread of its own: the caller may already run an event loop in this thread
    # (Playwright's sync API does, for the whole test session), and asyncio.run refuses to nest.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm-up") as pool:
        warm_up = pool.submit(asyncio.run, work).result()
    return warm_up if warm_up is not None else WarmUp([], 0.0, 0.0, stopped=True)
