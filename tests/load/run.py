"""Load test: N people at once on a real server on 127.0.0.1, each a websocket speaking Streamlit's protocol.

Each session opens the Kernels, Simulator and Planner pages (session i starts at page i mod 3, so Planner renders
overlap the other pages' heavy work): the first by its URL, the next two from the sidebar. With `--edit` or
`--distinct` it also changes one number on every page after opening it (the Planner's context length, the
Simulator's seed, the Kernels' context length): the same value in every session (`--edit`), or its own value per
session (`--distinct`: new heavy jobs for the worker pool). Before the clock starts, untimed sessions open
every page on every replica (a first run imports torch and starts the pool; the results get cached), then
`--cpu-renders` warm renders per page are measured one at a time for the server's CPU per render.

`--fresh` measures a team's first morning instead: a new team host (`--replicas`, default 2), which warms
itself before it says ready (hosting/warmup.py); then ONE untimed session opens each page at its defaults, as the
first visitor would (it lands on one replica; the edit values are not cached); then the burst. Warm CPU per render
is measured after the burst, so that it warms nothing before the clock. The JSON says which (`mode`: "warm" or
"fresh") and how long the host took to say ready (`startup_s`).

Prints one JSON object: per page p50 / p95 / max server seconds (request to script_finished), seconds to the
first element, kB received, exceptions, refusals (queue full), other error alerts; peak RSS of the server's whole
process tree (replicas, pool, workers, proxy); warm CPU ms per render; optionally (`--watch`) the seconds one real
Chromium took to draw the Planner's charts during the burst.

    python -m tests.load.run --sessions 20 [--rounds 2] [--distinct] [--replicas 2] [--watch [--watch-niceness 0]] [--fresh]

Bounded: loopback only, at most 200 sessions, every wait has a timeout. Exits 1 when a session saw an exception,
a refusal or a transport error.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

from core.kernels.cpu_isa import cpu_description
from hosting.protocol import Edit, ProtocolSession, Render
from tests.conftest import ROOT, _free_port
from tests.load.server import RssSampler, start_server, stop_server, tree_cpu_s
from tests.load.watch import WATCH_NICENESS

MAX_SESSIONS = 200
MAX_ROUNDS = 10
PAGES = ("kernels", "simulator", "planner")
# The targets for 20 sessions at once on 2 cores (server seconds at p95), warm or fresh (`target_met`)
PLANNER_P95_S = 1.0
PAGE_P95_S = 2.5
FRESH_REPLICAS = 2  # `--fresh` starts the team host with this many replicas unless --replicas says otherwise
CHARTS = {"kernels": 4, "simulator": 5, "planner": 4}  # plotly charts each page draws at its defaults


def edit_for(page: str, index: int, distinct: bool) -> Edit:
    """The number session `index` types on `page`: its own value when `distinct`, else one shared value."""
    k = index + 1 if distinct else 0
    if page == "planner":
        return Edit(page, "Context length: max_model_len (tokens)", 8192 + 256 * k)
    if page == "simulator":
        return Edit(page, "Seed", 1 + k)
    return Edit(page, "context length (tokens)", 2048 + 256 * k)


async def person(
    base_url: str, index: int, edits: str | None, timeout_s: float, rounds: int = 1
) -> tuple[list[Render], list]:
    """One session: its three pages in turn, `rounds` times, each edited after opening when `edits` is "same" or
    "distinct"."""
    renders: list[Render] = []
    try:
        async with ProtocolSession(base_url, timeout_s) as session:
            order = PAGES[index % 3 :] + PAGES[: index % 3]
            for page in order * rounds:
                renders.append(await session.open(page))
                if edits:
                    renders.append(await session.edit(edit_for(page, index, edits == "distinct")))
    except Exception as error:  # a timeout or a dropped socket: recorded, the other sessions go on
        return renders, [{"session": index, "error": f"{type(error).__name__}: {str(error)[:300]}"}]
    return renders, []


async def warm(base_url: str, replicas: int) -> None:
    """Every replica renders every page at its defaults and with the value every session types under `--edit`,
    so their results are cached and each replica has imported what its pages need. New sessions land on random
    replicas (a fresh sticky cookie each): open sessions until each replica was seen (at most 8 per replica)."""
    seen: set[str] = set()
    for _ in range(8 * replicas):
        async with ProtocolSession(base_url) as session:
            if session.replica in seen:
                continue
            seen.add(session.replica)
            for page in PAGES:
                await session.open(page)
                await session.edit(edit_for(page, 0, distinct=False))
        if len(seen) >= replicas:
            return
    raise RuntimeError(f"warmed {len(seen)} of {replicas} replicas")


async def warm_once(base_url: str, timeout_s: float) -> float:
    """`--fresh`'s warm-up: one session opens every page once at its defaults (no edits), as the first visitor of
    a new host would; returns its seconds. It lands on one replica: the others get nothing from it but the
    shared results."""
    started = time.perf_counter()
    async with ProtocolSession(base_url, timeout_s) as session:
        for page in PAGES:
            await session.open(page)
    return time.perf_counter() - started


async def warm_cpu(base_url: str, server_pid: int, renders_per_page: int) -> dict[str, float]:
    """Server CPU milliseconds per warm render of each page, one render at a time: the mean of `renders_per_page`
    renders, each navigating to the page from another one in the same session (a mean, not a median: the kernel
    counts CPU in 10 ms ticks, so single renders of ~50 ms read as 40, 50 or 60)."""
    costs: dict[str, list[float]] = {page: [] for page in PAGES}
    async with ProtocolSession(base_url) as session:
        for page in PAGES:
            await session.open(page)
        for _ in range(renders_per_page):
            for page in PAGES:
                before = tree_cpu_s(server_pid)
                await session.open(page)
                await asyncio.sleep(
                    0.3
                )  # let the server finish sending (its CPU after script_finished counts)
                costs[page].append((tree_cpu_s(server_pid) - before) * 1000)
    return {page: round(statistics.fmean(values), 1) for page, values in costs.items() if values}


async def burst(
    base_url: str,
    sessions: int,
    edits: str | None,
    watch: bool,
    timeout_s: float,
    watch_niceness: int = WATCH_NICENESS,
    rounds: int = 1,
) -> dict:
    """Every session at once (and the Chromium watcher at `watch_niceness`, if asked); returns renders, errors
    and the watch."""
    jobs = [person(base_url, i, edits, timeout_s, rounds) for i in range(sessions)]
    watcher = None
    if watch:
        from tests.load.watch import watch_planner

        watcher = asyncio.create_task(
            asyncio.to_thread(watch_planner, base_url, CHARTS["planner"], timeout_s, watch_niceness)
        )
    results = await asyncio.gather(*jobs)
    return {
        "renders": [r for renders, _ in results for r in renders],
        "errors": [e for _, errors in results for e in errors],
        "watch": await watcher if watcher else None,
    }


def _percentile(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarize(renders: list[Render]) -> dict:
    """Per page: renders, server p50/p95/max s and the three slowest, first-element p50/p95 s, kB per render (median), exceptions,
    refusals, other error alerts (distinct texts)."""
    pages = {}
    for page in PAGES:
        mine = [r for r in renders if r.page == page]
        if not mine:
            continue
        server = [r.server_s for r in mine]
        first = [r.first_s for r in mine if r.first_s is not None]
        pages[page] = {
            "renders": len(mine),
            "server_p50_s": round(statistics.median(server), 2),
            "server_p95_s": round(_percentile(server, 95), 2),
            "server_max_s": round(max(server), 2),
            "server_slowest_s": [round(s, 2) for s in sorted(server, reverse=True)[:3]],
            "first_p50_s": round(statistics.median(first), 2) if first else None,
            "first_p95_s": round(_percentile(first, 95), 2) if first else None,
            "kb_p50": round(statistics.median(r.bytes for r in mine) / 1000, 1),
            "exceptions": sum(len(r.exceptions) for r in mine),
            "refusals": sum(len(r.refusals) for r in mine),
            "errors": sorted({e for r in mine for e in r.errors})[:5],
            "charts_min": min(r.charts for r in mine if r.action != "edit") if mine else 0,
        }
    return pages


def target_met(pages: dict) -> bool:
    """The issue's latency targets on `summarize`'s pages: Planner p95 <= PLANNER_P95_S, every page's <= PAGE_P95_S."""
    planner = pages.get("planner", {}).get("server_p95_s", PLANNER_P95_S + 1)
    return planner <= PLANNER_P95_S and all(page["server_p95_s"] <= PAGE_P95_S for page in pages.values())


def run(
    sessions: int,
    edits: str | None = None,
    replicas: int | None = None,
    watch: bool = False,
    watch_niceness: int = WATCH_NICENESS,
    cpu_renders: int = 10,
    env: dict[str, str] | None = None,
    timeout_s: float = 300.0,
    fresh: bool = False,
    rounds: int = 1,
) -> dict:
    """Start a server, warm it, measure warm CPU per render, drive `sessions` at once, stop it; the figures.

    `fresh`: the team host (`replicas`, default FRESH_REPLICAS) as a team's first morning finds it: once it says
    ready, one session opens each page at its defaults (`warm_once`), then the burst; warm CPU per render is
    measured after the burst, so that it warms nothing before the clock."""
    for name, value, most in (("sessions", sessions, MAX_SESSIONS), ("rounds", rounds, MAX_ROUNDS)):
        if not 1 <= value <= most:
            raise ValueError(f"{name} must be between 1 and {most}, got {value}")
    if fresh and replicas is None:
        replicas = FRESH_REPLICAS
    load_before = os.getloadavg()[0]
    port = _free_port()
    log_path = ROOT / "tests" / "artifacts" / f"load_server_{port}.log"
    log_path.parent.mkdir(exist_ok=True)
    started = time.perf_counter()
    server = start_server(port, log_path, {**os.environ, **(env or {})}, replicas)
    startup = time.perf_counter() - started
    base_url = f"http://127.0.0.1:{port}"
    sampler = RssSampler(server.pid)
    sampler.start()
    cpu, warm_up = {}, None
    try:
        if fresh:
            warm_up = asyncio.run(warm_once(base_url, timeout_s))
        else:
            asyncio.run(warm(base_url, replicas or 1))
            cpu = asyncio.run(warm_cpu(base_url, server.pid, cpu_renders)) if cpu_renders else {}
        started = time.perf_counter()
        cpu_before = tree_cpu_s(server.pid)
        outcome = asyncio.run(burst(base_url, sessions, edits, watch, timeout_s, watch_niceness, rounds))
        wall = time.perf_counter() - started
        burst_cpu = tree_cpu_s(server.pid) - cpu_before
        if fresh and cpu_renders:
            cpu = asyncio.run(warm_cpu(base_url, server.pid, cpu_renders))
    finally:
        peak = sampler.stop()
        stop_server(server)
    renders = outcome["renders"]
    pages = summarize(renders)
    failures = outcome["errors"] + [
        {"page": r.page, "action": r.action, "exceptions": r.exceptions, "refusals": r.refusals}
        for r in renders
        if r.exceptions or r.refusals
    ]
    met = not failures and target_met(pages)
    return {
        "mode": "fresh" if fresh else "warm",
        "sessions": sessions,
        "rounds": rounds,
        "edits": edits,
        "replicas": replicas,
        "startup_s": round(startup, 1),
        "warm_up_s": None if warm_up is None else round(warm_up, 2),
        "pages": pages,
        "warm_cpu_ms_per_render": cpu,
        "burst_wall_s": round(wall, 1),
        "burst_server_cpu_s": round(burst_cpu, 1),
        "peak_rss_bytes": peak,
        "peak_rss_gib": round(peak / 1024**3, 2),
        "watch": outcome["watch"],
        "cpu_count": os.cpu_count(),
        "cpu": cpu_description(),
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "failures": failures[:20],
        "failure_count": len(failures),
        "targets": {"planner_p95_s": PLANNER_P95_S, "page_p95_s": PAGE_P95_S},
        "target_met": met,
        "server_log": str(log_path.relative_to(ROOT)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.load.run", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3, help=f"sessions at once (1-{MAX_SESSIONS})")
    parser.add_argument("--edit", action="store_true", help="every session types the same value on each page")
    parser.add_argument(
        "--distinct", action="store_true", help="every session types its own value on each page"
    )
    parser.add_argument("--replicas", type=int, default=None, help="run `python -m hosting` with R replicas")
    parser.add_argument(
        "--watch", action="store_true", help="one real Chromium opens the Planner in the burst"
    )
    parser.add_argument(
        "--watch-niceness",
        type=int,
        default=WATCH_NICENESS,
        help="the Chromium's nice value (0: it competes with the server)",
    )
    parser.add_argument("--cpu-renders", type=int, default=10, help="warm renders per page timed for CPU")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help=f"a new team host (--replicas, default {FRESH_REPLICAS}), one warm-up pass, then the burst",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help=f"each session visits its three pages this many times (1-{MAX_ROUNDS}): more renders per p95",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one render may take")
    args = parser.parse_args(argv)
    edits = "distinct" if args.distinct else "same" if args.edit else None
    figures = run(
        args.sessions,
        edits,
        args.replicas,
        args.watch,
        args.watch_niceness,
        args.cpu_renders,
        timeout_s=args.timeout,
        fresh=args.fresh,
        rounds=args.rounds,
    )
    print(json.dumps(figures, indent=2))
    return 1 if figures["failure_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
