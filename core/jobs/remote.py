"""One worker pool for several server processes: a pool process serves a `JobPool` on a local Unix socket, and
each Streamlit replica talks to it through `RemotePool`, which has `JobPool`'s public API.

Results do not travel over the socket when the shared `DiskResultCache` holds them: the pool answers "done" with
the marker `STORED`, and the replica reads the result from disk once into its own in-memory cache (as many
entries as the disk cache, at most LOCAL_BYTES of pickles: a page that asks for more results than fit would read
every one from disk on every render), so a result computed once (by any replica's session) is read, not
recomputed, by every replica.

Wire format (`multiprocessing.connection`, pickles, authenticated with a shared key): a request is a tuple
`(method, *arguments)` for method in submit / poll / cancel / stats / worker_pids / recycle_idle_workers; the
answer is `("ok", value)` or `("error", LabError)`. One thread of the pool process serves each connection.
"""

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Client, Listener

from core.errors import JobError, LabError
from core.jobs.cache import MISSING, ResultCache
from core.jobs.disk_cache import DiskResultCache
from core.jobs.pool import JobPool
from core.jobs.status import JobStatus, job_key

STORED = "__paged_lab_result_on_disk__"  # the result is in the shared disk cache under the job's key
# Pickled bytes of the results a replica keeps in memory: a default simulation is ~20 MB, a kernel sweep ~10 kB.
LOCAL_BYTES = 128 * 1024**2


class _DiskIndex:
    """The pool's view of the disk cache: `get` says STORED without reading the file; `put` writes it."""

    def __init__(self, disk: DiskResultCache):
        self.disk = disk

    def get(self, key):
        return STORED if self.disk.contains(key) else MISSING

    def put(self, key, value) -> None:
        self.disk.put(key, value)

    def __len__(self) -> int:
        return len(self.disk)


class PoolServer:
    """Serves `pool` on the Unix socket `address` (mode 0600) from a daemon thread, one thread per connection.
    `pool.cache` should be a `_DiskIndex` over `disk` (see `shared_pool`), so cached results answer as STORED."""

    def __init__(self, address: str, authkey: bytes, pool: JobPool, disk: DiskResultCache):
        self.pool, self.disk = pool, disk
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        os.chmod(address, 0o600)
        self._thread = threading.Thread(target=self._accept, name="pool-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                return  # closed
            except Exception:  # a client with the wrong key: refused, keep serving
                continue
            threading.Thread(target=_serve_connection, args=(conn, self.pool, self.disk), daemon=True).start()

    def close(self) -> None:
        """Stop accepting, then close the pool (its workers stop). Idempotent."""
        with contextlib.suppress(OSError):
            self._listener.close()
        self.pool.close()


def shared_pool(limits, disk: DiskResultCache, preload: tuple[str, ...] = ()) -> JobPool:
    """A `JobPool` sized by `limits` whose finished results go to `disk` (and are answered as STORED)."""
    pool = JobPool.from_limits(limits, preload=preload)
    pool.cache = _DiskIndex(disk)
    return pool


def _serve_connection(conn, pool: JobPool, disk: DiskResultCache) -> None:
    keys: dict[str, object] = {}  # session -> key of its last job submitted on this connection
    with conn:
        while True:
            try:
                method, *arguments = conn.recv()
            except (EOFError, OSError):
                return
            except Exception as error:  # a request that does not unpickle (e.g. an unknown function)
                conn.send(("error", JobError(f"the pool could not read the request: {error}")))
                continue
            try:
                if method not in _METHODS:
                    raise JobError(f"the pool has no method {method!r}")
                if method == "submit":
                    keys[arguments[0]] = job_key(arguments[1], tuple(arguments[2:]))
                elif method == "cancel":
                    keys.pop(arguments[0], None)
                value = getattr(pool, method)(*arguments)
                if isinstance(value, JobStatus) and value.finished:
                    key = keys.pop(arguments[0], None)
                    if (
                        value.state == "done"
                        and key is not None
                        and value.result is not STORED
                        and disk.contains(key)
                    ):
                        value = dataclasses.replace(value, result=STORED)  # the replica reads it from disk
                conn.send(("ok", value))
            except LabError as error:
                conn.send(("error", error))
            except (EOFError, OSError):
                return


_METHODS = frozenset({"submit", "poll", "cancel", "stats", "worker_pids", "recycle_idle_workers"})


class RemotePool:
    """`JobPool`'s public API (submit / poll / cancel / stats / worker_pids / recycle_idle_workers / close) served
    by the pool process.

    Thread-safe: one connection, one request at a time. Results are resolved from this replica's memory cache,
    then the shared disk cache; a result the disk lost in between (evicted) is computed again.
    """

    def __init__(self, address: str, authkey: bytes, disk: DiskResultCache):
        self.address, self._authkey, self.disk = address, authkey, disk
        self.cache = ResultCache(disk.max_entries, disk.ttl_s, max_bytes=LOCAL_BYTES)
        self._lock = threading.Lock()
        self._conn = None
        self._keys: dict[str, object] = {}  # session -> the key of its last submitted job

    def _call(self, method: str, *arguments):
        with self._lock:
            for attempt in (1, 2):  # the pool process may have been restarted: reconnect once
                try:
                    if self._conn is None:
                        self._conn = Client(self.address, family="AF_UNIX", authkey=self._authkey)
                    self._conn.send((method, *arguments))
                    outcome, value = self._conn.recv()
                    break
                except (EOFError, OSError) as error:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise JobError(
                            f"the shared job pool does not answer ({error}); try again shortly"
                        ) from None
        if outcome == "error":
            raise value
        return value

    def _resolve(self, status: JobStatus, key) -> JobStatus | None:
        """`status` with its result in hand; None when the disk no longer has a STORED result."""
        if status.result != STORED:
            if status.state == "done":
                self.cache.put(key, status.result)
            return status
        value = self.cache.get(key)
        if value is MISSING:
            value, nbytes = self.disk.get_sized(key)
            if value is MISSING:
                return None
            self.cache.put(key, value, nbytes)
        return dataclasses.replace(status, result=value)

    def submit(self, session: str, fn: Callable, *args) -> JobStatus:
        key = job_key(fn, args)
        value = self.cache.get(key)
        if value is not MISSING:
            self.cancel(session)  # the session's previous job, if any, is no longer wanted
            return JobStatus("done", fraction=1.0, result=value, cached=True)
        self._keys[session] = key
        for _ in range(2):
            status = self._resolve(self._call("submit", session, fn, *args), key)
            if status is not None:
                if status.finished:
                    self._keys.pop(session, None)
                return status
            self._call("cancel", session)  # evicted between the answer and the read: ask again, it recomputes
        raise JobError("the shared result cache dropped this result twice in a row; try again")

    def poll(self, session: str) -> JobStatus:
        status = self._call("poll", session)
        key = self._keys.pop(session, None) if status.finished else self._keys.get(session)
        if status.state != "done" or key is None:
            return status
        resolved = self._resolve(status, key)
        if resolved is None:
            raise JobError("the shared result cache dropped this result before it was read; run it again")
        return resolved

    def cancel(self, session: str) -> None:
        self._keys.pop(session, None)
        self._call("cancel", session)

    def stats(self) -> dict[str, int]:
        return self._call("stats")

    def worker_pids(self) -> list[int]:
        return self._call("worker_pids")

    def recycle_idle_workers(self) -> int:
        return self._call("recycle_idle_workers")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


POOL_SOCKET_VARIABLE = "PAGED_LAB_POOL_SOCKET"  # set by the team host for its replicas, with the two below
POOL_KEY_VARIABLE = "PAGED_LAB_POOL_KEY"  # hex
CACHE_DIR_VARIABLE = "PAGED_LAB_CACHE_DIR"


def remote_pool_from_env(limits, environ=None) -> RemotePool | None:
    """The shared pool this process's environment names (PAGED_LAB_POOL_SOCKET, PAGED_LAB_POOL_KEY,
    PAGED_LAB_CACHE_DIR, all set by `python -m hosting`), or None when it names none (a plain server)."""
    environ = os.environ if environ is None else environ
    address = environ.get(POOL_SOCKET_VARIABLE, "").strip()
    if not address:
        return None
    disk = DiskResultCache(environ[CACHE_DIR_VARIABLE], limits.cache_entries, limits.cache_ttl_s)
    return RemotePool(address, bytes.fromhex(environ[POOL_KEY_VARIABLE]), disk)
