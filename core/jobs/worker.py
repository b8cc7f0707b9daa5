"""The loop a worker process runs: receive a job, run it with a progress callback, send back what happened; and
how the pool starts one (`start_without_main`).

Messages from the worker on its pipe, as tuples:
    ("ready",)                               once its environment is set and its modules are imported
    ("progress", job_id, fraction, message)  at most every PROGRESS_INTERVAL_S (and at fraction 1)
    ("done", job_id, result)                 the job returned `result`
    ("cancelled", job_id)                    the job stopped at a progress call after its cancel event was set
    ("error", job_id, error)                 the job raised; `error` is the exception when it survives
                                             pickling, else (type name, message, is a LabError)
"""

import contextlib
import ctypes
import gc
import importlib
import multiprocessing
import os
import pickle
import threading
import time
from multiprocessing import spawn
from pathlib import Path

from core.errors import JobCancelledError, LabError

REPO_ROOT = str(Path(__file__).resolve().parents[2])
_SPAWN_LOCK = threading.Lock()
PROGRESS_INTERVAL_S = 0.1
PARENT_CHECK_S = 1.0  # an idle worker checks this often that the process that started it is still there
WORKER_NICENESS = 10  # the server process renders pages first; workers take the CPU left over
# What the app's workers import when they start, so the first job does not pay for torch, the simulator and the
# engine (the `preload` a server passes to its pool).
PRELOAD = ("core.page_models.simulator", "core.kernels.timing", "core.engine.engine")


class _Progress:
    """The `progress(fraction, message)` callback a job receives: throttled, and where cancellation lands."""

    def __init__(self, conn, job_id: int, cancel_event):
        self._conn, self._job_id, self._cancel = conn, job_id, cancel_event
        self._last = 0.0

    def __call__(self, fraction: float, message: str = "") -> None:
        if self._cancel.is_set():
            raise JobCancelledError("cancelled")
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL_S or fraction >= 1.0:
            self._last = now
            self._conn.send(("progress", self._job_id, float(min(max(fraction, 0.0), 1.0)), str(message)))


def _portable(error: BaseException):
    """The exception itself when it pickles and unpickles (no traceback travels), else a plain description."""
    try:
        pickle.loads(pickle.dumps(error))
        error.__traceback__ = None
        return error
    except Exception:
        return (type(error).__name__, str(error), isinstance(error, LabError))


def release_free_memory() -> None:
    """Give the heap a finished job freed back to the system (glibc's `malloc_trim`; nothing elsewhere).

    A kernel timing keeps up to 1 GiB of free heap for its duration (`core.kernels.timer.tune_malloc`), which the
    worker would otherwise hold while idle: a host's worker sat at 1.2 GB after 20 people's distinct sweeps."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def worker_main(
    conn, cancel_event, environ: dict[str, str], preload: tuple[str, ...], parent_pid: int | None = None
) -> None:
    """Run jobs from `conn` until it sends None or closes, or the process `parent_pid` (the pool's; default this
    process's parent when it starts) is gone. Jobs are `(job_id, fn, args)`, run as `fn(*args, progress=callback)`."""
    os.environ.update(environ)
    with contextlib.suppress(AttributeError, OSError):
        os.nice(WORKER_NICENESS)
    for module in preload:
        importlib.import_module(module)
    # What the imports made lives as long as the process: out of the collector's sight (`gc.freeze`), the full
    # collection after each job (`release_free_memory`) walks only what jobs made, ~0 ms instead of ~85 ms with
    # torch, the simulator and the engine loaded (200k objects).
    gc.collect()
    gc.freeze()
    conn.send(("ready",))
    parent = os.getppid() if parent_pid is None else parent_pid
    while True:
        try:
            while not conn.poll(PARENT_CHECK_S):
                if os.getppid() != parent:  # the pool's process died (killed): nobody will send a job again
                    return
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        job_id, fn, args = task
        _run_job(conn, job_id, fn, args, cancel_event)
        del task, fn, args
        release_free_memory()


def _run_job(conn, job_id: int, fn, args: tuple, cancel_event) -> None:
    """Run one job and send what happened (done, cancelled or error)."""
    try:
        result = fn(*args, progress=_Progress(conn, job_id, cancel_event))
    except JobCancelledError:
        conn.send(("cancelled", job_id))
        return
    except Exception as error:
        conn.send(("error", job_id, _portable(error)))
        return
    try:
        conn.send(("done", job_id, result))
    except Exception as error:  # the result does not pickle
        conn.send(("error", job_id, _portable(error)))


def start_without_main(process: multiprocessing.process.BaseProcess) -> None:
    """Start a spawned process that does not re-run the parent's `__main__`.

    Streamlit installs each page script as `sys.modules["__main__"]`, so a plain spawn would run the page again
    in the worker (and start workers from there). The child gets the parent's sys.path plus the repository root,
    which is all `worker_main` and the job functions need.
    """
    with _SPAWN_LOCK:
        original = spawn.get_preparation_data

        def preparation_data(name: str) -> dict:
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            data["sys_path"] = [REPO_ROOT, *data.get("sys_path", [])]
            return data

        spawn.get_preparation_data = preparation_data
        try:
            process.start()
        finally:
            spawn.get_preparation_data = original
