"""`python -m hosting --port 8501 [--replicas N] [--address 127.0.0.1]`: the lab for a team on one machine.

Starts, in order: the shared job pool (hosting/pool.py: one `JobPool` sized by the operator limits, serving every
replica over a Unix socket, its results in a shared on-disk cache), N Streamlit replicas of app.py on free loopback
ports (N = --replicas, else PAGED_LAB_REPLICAS, else one per core), and nginx on address:port in front of them
(hosting/nginx.conf.template: sticky by cookie, websockets upgraded). Between the replicas and the proxy it warms
the host (hosting/warmup.py, unless --no-warm): every page rendered once at its defaults on every replica, so
the shared cache holds each page's default results and no replica's first visitor pays for imports, first
compiles or first charts; a "hosting: warming i/N: ..." line per page shows its progress; then the pool's
workers are replaced by fresh ones (what the warm-up's jobs left in them, ~0.9 GB on 2 cores, given back). The
proxy, the only part listening on address:port, starts after that: "hosting: ready ..." is printed once it
answers. A child that exits is started again (at most MAX_RESTARTS times each).

Stops everything on SIGTERM or SIGINT (Ctrl-C): proxy first, then replicas, then the pool and its workers, each
given GRACE_S before SIGKILL; every child also gets SIGTERM from the kernel if this process dies (PR_SET_PDEATHSIG).
Leaves no process and no file behind (the runtime directory is removed; a --cache-dir or PAGED_LAB_CACHE_DIR
given by the operator stays).
"""

import argparse
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from core.errors import JobError
from core.jobs.disk_cache import DiskResultCache
from core.jobs.remote import CACHE_DIR_VARIABLE, remote_pool_from_env
from core.limits import Limits
from core.serve.ports import free_port
from hosting.live_hosts import live_hosts_notice
from hosting.proxy import copy_static_files, render_config
from hosting.warmup import warm_replicas

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 180.0
GRACE_S = 10.0
MAX_RESTARTS = 5
_PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    """One process of the host: its name, command, and the running process."""

    name: str
    command: list[str]
    env: dict[str, str]
    process: subprocess.Popen | None = None
    restarts: int = 0
    health_port: int | None = None  # answers /_stcore/health when ready

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In the child before exec: the kernel sends SIGTERM when the launcher dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def default_replicas(environ=os.environ) -> int:
    """PAGED_LAB_REPLICAS when set (1-64), else one replica per core. Raises ValueError for a bad value."""
    raw = environ.get("PAGED_LAB_REPLICAS", "").strip()
    if not raw:
        return os.cpu_count() or 1
    if not raw.isdigit() or not 1 <= int(raw) <= 64:
        raise ValueError(f"PAGED_LAB_REPLICAS must be an integer from 1 to 64, got {raw!r}")
    return int(raw)


def app_command(port: int) -> list[str]:
    """`streamlit run app.py` headless on 127.0.0.1:port, no file watcher, no usage stats: how every app process
    is started (a team host's replicas, the load tests' app, `bench.slo_page`)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        "app.py",
        "--server.headless",
        "true",
        "--server.address",
        "127.0.0.1",
        "--server.port",
        str(port),
        "--server.fileWatcherType",
        "none",
        "--browser.gatherUsageStats",
        "false",
    ]


def healthy(port: int, timeout: float = 2.0) -> bool:
    """Whether the app on 127.0.0.1:port answers its health check with ok."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=timeout) as response:
            return response.read().decode().strip() == "ok"
    except OSError:
        return False


class Host:
    """The pool, the replicas and the proxy of one team host; `run` blocks until a stop signal."""

    def __init__(self, address: str, port: int, replicas: int, cache_dir: str | None, warm: bool = True):
        if shutil.which("nginx") is None:
            raise RuntimeError("nginx is not installed (Debian: apt-get install -y nginx)")
        self.address, self.port, self.warm_first = address, port, warm
        self.runtime = Path(tempfile.mkdtemp(prefix="paged-lab-host-"))
        try:
            self._prepare(replicas, cache_dir)
        except BaseException:
            shutil.rmtree(self.runtime, ignore_errors=True)
            raise
        self.stopping = False

    def _prepare(self, replicas: int, cache_dir: str | None) -> None:
        """The children's commands and environment, and nginx.conf, in the runtime directory."""
        os.chmod(
            self.runtime, 0o711
        )  # nginx's workers (another user when started as root) reach their temp dirs
        self.cache_dir = Path(cache_dir) if cache_dir else self.runtime / "results"
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.limits = Limits.from_env()
        env = {
            **os.environ,
            "PYTHONHASHSEED": "0",  # job keys hash and print alike in every process
            "PAGED_LAB_POOL_SOCKET": str(self.runtime / "pool.sock"),
            "PAGED_LAB_POOL_KEY": secrets.token_hex(16),
            "PAGED_LAB_CACHE_DIR": str(self.cache_dir),
            # every replica signs and checks XSRF tokens alike (Streamlit reads it only from here or a file)
            "STREAMLIT_SERVER_COOKIE_SECRET": secrets.token_hex(32),
        }
        # One pool for every replica, sized like a single server's (PAGED_LAB_WORKERS, default cores - 1, 1 to 4):
        # the replicas keep a core for rendering, and each worker holding torch and a job's tensors costs
        # ~0.3-0.6 GB (peak RSS of the whole host stays under 3 GiB on 2 cores with 20 people running jobs).
        env.setdefault("PAGED_LAB_WORKERS", str(self.limits.workers))
        self.pool = Child(
            "pool",
            [
                sys.executable,
                "-m",
                "hosting.pool",
                "--socket",
                env["PAGED_LAB_POOL_SOCKET"],
                "--cache-dir",
                str(self.cache_dir),
            ],
            env,
        )
        self.replicas = []
        for index in range(replicas):
            replica_port = free_port()
            command = app_command(replica_port)
            self.replicas.append(Child(f"replica {index + 1}", command, env, health_port=replica_port))
        config = self.runtime / "nginx.conf"
        config.write_text(
            render_config(
                self.address,
                self.port,
                [r.health_port for r in self.replicas],
                self.runtime,
                self.limits.max_upload_bytes,
                static_dir=copy_static_files(self.runtime),
            )
        )
        self.proxy = Child(
            "proxy", ["nginx", "-e", "stderr", "-p", str(self.runtime), "-c", str(config)], env
        )
        self.stopping = False

    @property
    def children(self) -> list[Child]:
        return [self.pool, *self.replicas, self.proxy]

    def start(self) -> None:
        """Start every child and wait until all answer; raises RuntimeError (after stopping them) if not."""
        self.pool.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not Path(self.pool.env["PAGED_LAB_POOL_SOCKET"]).exists():
            self._check_started(deadline)
        for replica in self.replicas:
            replica.start()
        for replica in self.replicas:
            while not healthy(replica.health_port):
                self._check_started(deadline)
        if self.warm_first:
            self.warm()
        self.proxy.start()
        deadline = time.monotonic() + READY_TIMEOUT_S  # anew: the warm-up is bounded by its pages' timeouts
        while not healthy(self.port):
            self._check_started(deadline)

    def warm(self) -> None:
        """Render every page on every replica before anyone can connect (hosting/warmup.py), logging progress and
        a summary; raises RuntimeError when stopped meanwhile. Pages that fail are logged, not fatal."""
        log = lambda line: print(f"hosting: {line}", flush=True)  # noqa: E731
        started = time.perf_counter()
        page_timeout_s = 4 * self.limits.job_timeout_s + 60  # a page runs up to three jobs, and may queue
        warm_up = warm_replicas(
            [r.health_port for r in self.replicas],
            timeout_s=page_timeout_s,
            log=log,
            should_stop=lambda: self.stopping or self._child_exited(),
        )
        if warm_up.stopped or self.stopping or self._child_exited():  # (a child's exit may end it first)
            self._check_started(float("inf"))  # names the child that exited
            raise RuntimeError("stopped while starting")
        for problem in warm_up.problems:
            log(f"warm-up: {problem}")
        cached = len(DiskResultCache(self.cache_dir, self.limits.cache_entries, self.limits.cache_ttl_s))
        first = ", ".join(f"{p.path or '/'} {p.seconds:.1f}" for p in warm_up.pages if p.replica == 1)
        others = (
            f", replicas 2-{len(self.replicas)} in {warm_up.others_s:.1f} s" if len(self.replicas) > 1 else ""
        )
        log(
            f"warm-up done in {time.perf_counter() - started:.1f} s: replica 1 in {warm_up.first_s:.1f} s "
            f"({first} s){others}; {cached} results in the shared cache"
        )
        started = time.perf_counter()
        replaced = self._fresh_workers()
        log(f"pool workers restarted fresh ({replaced}), ready after {time.perf_counter() - started:.1f} s")

    def _fresh_workers(self) -> int:
        """Give the pool fresh worker processes and wait until they are ready; returns how many were replaced.

        The warm-up's jobs leave their memos in a worker (the Engine page's model weights, the last simulations)
        and its heap: ~1.2 GB in the one worker of a 2-core host, against ~0.3 GB fresh. Its results are on
        disk, so a visitor asking for them needs no worker; the first to ask for something else loads what that
        needs, as on a host that was never warmed."""
        pool = remote_pool_from_env(self.limits, self.pool.env)
        try:
            replaced = pool.recycle_idle_workers()
            deadline = time.monotonic() + READY_TIMEOUT_S
            while (stats := pool.stats())["ready"] < stats["workers"]:
                self._check_started(deadline)
        except JobError as error:  # the pool exited meanwhile
            self._check_started(float("inf"))
            raise RuntimeError(f"the pool stopped answering while starting: {error}") from None
        finally:
            pool.close()
        return replaced

    def _child_exited(self) -> bool:
        return any(c.process is not None and c.process.poll() is not None for c in self.children)

    def _check_started(self, deadline: float) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                raise RuntimeError(
                    f"the {child.name} exited with code {child.process.returncode} while starting"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every part answered within {READY_TIMEOUT_S:.0f} s")
        if self.stopping:
            raise RuntimeError("stopped while starting")
        time.sleep(0.2)

    def watch(self) -> int:
        """Until a stop signal: restart a child that exited; 1 when one exits more than MAX_RESTARTS times."""
        while not self.stopping:
            for child in self.children:
                if child.process.poll() is None or self.stopping:
                    continue
                if child.restarts >= MAX_RESTARTS:
                    print(f"hosting: the {child.name} keeps exiting; stopping", file=sys.stderr, flush=True)
                    return 1
                print(
                    f"hosting: the {child.name} exited ({child.process.returncode}); restarting", flush=True
                )
                child.restarts += 1
                child.start()
            time.sleep(0.5)
        return 0

    def stop(self) -> None:
        """Proxy, then replicas, then the pool: SIGTERM, then SIGKILL after GRACE_S. Removes the runtime dir."""
        self.stopping = True
        for group in ([self.proxy], self.replicas, [self.pool]):
            running = [c.process for c in group if c.process is not None and c.process.poll() is None]
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
            for process in running:
                try:
                    process.wait(timeout=GRACE_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        shutil.rmtree(self.runtime, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hosting", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8501, help="the proxy's port (default 8501)")
    parser.add_argument("--address", default="127.0.0.1", help="the proxy's address (default 127.0.0.1)")
    parser.add_argument(
        "--replicas", type=int, default=None, help="Streamlit processes (default: one per core)"
    )
    parser.add_argument(
        "--cache-dir",
        default=os.environ.get(CACHE_DIR_VARIABLE) or None,
        help=f"shared result cache directory, kept when the host stops (default: ${CACHE_DIR_VARIABLE}, e.g. a "
        "volume of the container, else a temporary one)",
    )
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help="open the proxy without rendering every page first (the first visitors pay for the warm-up)",
    )
    args = parser.parse_args(argv)
    try:
        replicas = args.replicas if args.replicas is not None else default_replicas()
        if not 1 <= replicas <= 64:
            raise ValueError(f"--replicas must be from 1 to 64, got {replicas}")
        host = Host(args.address, args.port, replicas, args.cache_dir, warm=not args.no_warm)
    except (ValueError, RuntimeError) as error:
        print(f"hosting: {error}", file=sys.stderr)
        return 2
    warning, notice = live_hosts_notice(host.limits)
    print(notice, file=sys.stderr if warning else sys.stdout, flush=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: setattr(host, "stopping", True))
    try:
        host.start()
        print(
            f"hosting: ready http://{args.address}:{args.port} ({replicas} replicas, "
            f"{host.pool.env['PAGED_LAB_WORKERS']} pool workers, cache {host.cache_dir})",
            flush=True,
        )
        return host.watch()
    except RuntimeError as error:
        print(f"hosting: {error}", file=sys.stderr, flush=True)
        return 0 if host.stopping else 1
    finally:
        host.stop()
