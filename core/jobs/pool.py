"""A bounded pool of worker processes that runs the heavy jobs of every browser session off the server process.

A job is a module-level function and hashable, picklable arguments, run in a worker as
`fn(*args, progress=callback)` where `callback(fraction, message)` reports progress (and is where a cancelled
job stops). Invariants:
- Workers are started with the `spawn` context (torch after fork is unsafe) and number exactly `workers`;
  one that dies, overruns the wall-time limit or ignores a cancel is terminated and replaced.
- A session (any string key) has at most one job: submitting different inputs cancels its previous job,
  submitting the same inputs again returns the same job. A job runs while at least one session waits for it;
  sessions asking for inputs already running share that job.
- A finished result is cached by (function, arguments) in a bounded `ResultCache` and handed to every session
  that asks, as the same read-only value.
- At most `max_queued` jobs wait for a worker; a submission beyond that raises `QueueFullError` and changes
  nothing. With `max_sessions`, the queue also grows with the people present (sessions heard from within
  `abandon_after_s`), up to `max_sessions`: as each session holds at most one job, nobody is refused until more
  than `max_sessions` people wait at once. A session that has not polled for `abandon_after_s` has left: its
  job is cancelled.
- A queued or running job's status carries an estimate of the seconds until its result, from the mean run time
  of recent jobs of the same function (None until one has finished).
"""

import contextlib
import itertools
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from core.errors import JobError, JobFailedError, JobTimeoutError, LabError, QueueFullError
from core.jobs.cache import MISSING, ResultCache
from core.jobs.status import JobStatus, as_lab_error, job_key
from core.jobs.worker import start_without_main, worker_main
from core.limits import Limits

CANCEL_GRACE_S = 2.0  # a cancelled job that reaches no progress call within this is stopped by force
TICK_S = 0.1


@dataclass(eq=False)
class _Job:
    id: int
    key: Hashable
    fn: Callable
    args: tuple
    subscribers: set[str] = field(default_factory=set)
    worker: "_Worker | None" = None
    started: float | None = None
    fraction: float = 0.0
    message: str = "waiting for a worker"


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: object
    cancel_event: object
    ready: bool = False
    job: _Job | None = None
    cancel_sent_at: float | None = None


@dataclass(eq=False)
class _Slot:
    key: Hashable
    job: _Job | None
    last_seen: float
    outcome: JobStatus | None = None


class JobPool:
    """Worker processes, a FIFO queue of jobs, per-session slots and a result cache, run by one dispatcher thread.

    Thread-safe: every public method may be called from any session's script thread.
    """

    def __init__(
        self,
        workers: int = 1,
        max_queued: int = 16,
        timeout_s: float = 120.0,
        cache: ResultCache | None = None,
        environ: dict[str, str] | None = None,
        preload: tuple[str, ...] = (),
        abandon_after_s: float = 15.0,
        max_sessions: int | None = None,
    ):
        self.workers, self.max_queued, self.timeout_s = workers, max_queued, timeout_s
        self.abandon_after_s, self.max_sessions = abandon_after_s, max_sessions
        self._mean_s: dict[tuple[str, str], float] = {}  # (module, function) -> recent mean run seconds
        self.cache = cache if cache is not None else ResultCache(32, 3600.0)
        self._environ, self._preload = dict(environ or {}), tuple(preload)
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.RLock()
        self._queue: deque[_Job] = deque()
        self._by_key: dict[Hashable, _Job] = {}
        self._sessions: dict[str, _Slot] = {}
        self._workers: list[_Worker] = []
        self._dying: list[tuple[multiprocessing.process.BaseProcess, float]] = []
        self._ids = itertools.count(1)
        self._closed = False
        self.restarts = 0  # workers replaced after a timeout, a forced cancel or a crash
        for _ in range(workers):
            self._workers.append(self._start_worker())
        self._thread = threading.Thread(target=self._run, name="job-pool", daemon=True)
        self._thread.start()

    @classmethod
    def from_limits(cls, limits: Limits, preload: tuple[str, ...] = (), **kwargs) -> "JobPool":
        """A pool sized by the operator limits; workers read exactly these limits from their environment."""
        return cls(
            workers=limits.workers,
            max_queued=limits.max_queued_jobs,
            max_sessions=limits.max_sessions,
            timeout_s=limits.job_timeout_s,
            cache=ResultCache(limits.cache_entries, limits.cache_ttl_s),
            environ=limits.as_environ(),
            preload=preload,
            **kwargs,
        )

    # ---- public API ----------------------------------------------------------------------------------------
    def submit(self, session: str, fn: Callable, *args) -> JobStatus:
        """Ask for `fn(*args)` on behalf of `session`; returns its status at once (done when cached).

        Same inputs as the session's current job: that job's status, nothing restarts. Other inputs: the
        previous job is cancelled first. Raises QueueFullError (the session keeps no job) when the queue is full,
        InvalidArgumentError for a function or arguments that cannot travel to a worker.
        """
        key = job_key(fn, args)
        with self._lock:
            self._check_open()
            now = time.monotonic()
            slot = self._sessions.get(session)
            if slot is not None and slot.key == key:
                slot.last_seen = now
                return self._status(slot)
            if slot is not None:
                self._leave(session, slot)
            cached = self.cache.get(key)
            if cached is not MISSING:
                slot = _Slot(key, None, now, JobStatus("done", fraction=1.0, result=cached, cached=True))
                self._sessions[session] = slot
                return self._status(slot)
            job = self._by_key.get(key)
            if job is None:
                self._check_room(session)
                job = _Job(next(self._ids), key, fn, args)
                self._by_key[key] = job
                self._queue.append(job)
                self._dispatch()
            job.subscribers.add(session)
            slot = _Slot(key, job, now)
            self._sessions[session] = slot
            return self._status(slot)

    def poll(self, session: str) -> JobStatus:
        """The session's job status (idle when it has none); also tells the pool the session is still there."""
        with self._lock:
            slot = self._sessions.get(session)
            if slot is None:
                return JobStatus("idle", queued=len(self._queue), running=self._running())
            slot.last_seen = time.monotonic()
            return self._status(slot)

    def cancel(self, session: str) -> None:
        """Forget the session's job: cancelled when no other session waits for it. Idempotent."""
        with self._lock:
            slot = self._sessions.pop(session, None)
            if slot is not None:
                self._leave(session, slot)

    def stats(self) -> dict[str, int]:
        """workers (alive), ready, running, queued, sessions, cached, restarts."""
        with self._lock:
            return {
                "workers": sum(w.process.is_alive() for w in self._workers),
                "ready": sum(w.ready for w in self._workers),
                "running": self._running(),
                "queued": len(self._queue),
                "sessions": len(self._sessions),
                "cached": len(self.cache),
                "restarts": self.restarts,
            }

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._workers if w.process.pid is not None]

    def recycle_idle_workers(self) -> int:
        """Replace every idle worker by a fresh process, giving back what its earlier jobs left in it (what a job
        memoised, such as a model's weights, and its heap); a running job keeps its worker. Not counted in
        `restarts`. Returns how many were replaced; they count as `ready` in `stats` again after their imports."""
        with self._lock:
            self._check_open()
            idle = [w for w in self._workers if w.job is None]
            for worker in idle:
                self._replace(worker, counted=False)
            return len(idle)

    def close(self) -> None:
        """Stop the dispatcher and every worker (running jobs are abandoned). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers, self._workers = self._workers, []
        self._thread.join(timeout=5)
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in workers:
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=2)
        for process, _ in self._dying:
            process.kill()
            process.join(timeout=2)

    # ---- internals (called with the lock held unless noted) ------------------------------------------------
    def _check_room(self, session: str) -> None:
        """Raise QueueFullError when a new job from `session` would find no place in the queue."""
        if self.max_sessions is None:
            if len(self._queue) >= self.max_queued:
                raise QueueFullError(
                    f"the server's job queue is full ({self.max_queued:,} jobs waiting, the limit "
                    "PAGED_LAB_MAX_QUEUED_JOBS); try again in a minute",
                    "PAGED_LAB_MAX_QUEUED_JOBS",
                )
            return
        present = len(self._sessions) + (session not in self._sessions)
        if len(self._queue) >= max(self.max_queued, min(present, self.max_sessions)):
            raise QueueFullError(
                f"the server's job queue is full: {len(self._queue):,} jobs of {present:,} people are waiting, "
                f"over this server's limit of {self.max_sessions:,} people waiting at once (PAGED_LAB_MAX_SESSIONS); "
                "try again in a minute",
                "PAGED_LAB_MAX_SESSIONS",
            )

    def _remaining(self, job: _Job, now: float) -> float | None:
        """Seconds a running job has left: from its progress once it reported 10 %, else from the mean run
        time of its function; None when neither is known."""
        elapsed = now - job.started
        if job.fraction >= 0.1:
            return elapsed * (1 - job.fraction) / job.fraction
        expected = self._mean_s.get(job.key[:2])
        return None if expected is None else max(0.0, expected - elapsed)

    def _estimate(self, job: _Job, now: float) -> float | None:
        """Seconds until `job`'s result. Queued: the running jobs' remaining times and the queue ahead of it
        replayed on the workers, each queued job taking its function's mean run time. None when any of those is
        unknown (a function with no finished run yet)."""
        if job.worker is not None:
            return self._remaining(job, now)
        free = []
        for worker in self._workers:
            remaining = self._remaining(worker.job, now) if worker.job is not None else 0.0
            if remaining is None:
                return None
            free.append(remaining)
        free = sorted(free) or [0.0]
        for queued in self._queue:
            expected = self._mean_s.get(queued.key[:2])
            if expected is None:
                return None
            start = free.pop(0)
            if queued is job:
                return start + expected
            free.append(start + expected)
            free.sort()
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise JobError("the job pool is closed")

    def _running(self) -> int:
        return sum(w.job is not None for w in self._workers)

    def _status(self, slot: _Slot) -> JobStatus:
        totals = {"queued": len(self._queue), "running": self._running()}
        if slot.outcome is not None:
            return JobStatus(**{**slot.outcome.__dict__, **totals})
        job = slot.job
        estimate = self._estimate(job, time.monotonic())
        if job.worker is None:
            position = next(i for i, queued in enumerate(self._queue, 1) if queued is job)
            return JobStatus("queued", position, job.fraction, job.message, estimate_s=estimate, **totals)
        return JobStatus("running", 0, job.fraction, job.message, estimate_s=estimate, **totals)

    def _start_worker(self) -> _Worker:
        parent, child = self._context.Pipe(duplex=True)
        cancel_event = self._context.Event()
        process = self._context.Process(
            target=worker_main,
            args=(child, cancel_event, self._environ, self._preload, os.getpid()),
            name="paged-lab-worker",
            daemon=True,
        )
        start_without_main(process)
        child.close()
        return _Worker(process, parent, cancel_event)

    def _leave(self, session: str, slot: _Slot) -> None:
        """`session` stops waiting for `slot`'s job; the job is cancelled when nobody else waits."""
        job = slot.job
        if job is None or slot.outcome is not None:
            return
        job.subscribers.discard(session)
        if job.subscribers:
            return
        self._by_key.pop(job.key, None)
        if job.worker is None:
            self._queue.remove(job)
        elif job.worker.cancel_sent_at is None:
            job.worker.cancel_event.set()
            job.worker.cancel_sent_at = time.monotonic()

    def _finish(self, job: _Job, outcome: JobStatus) -> None:
        """Hand `outcome` to every session still waiting for `job`."""
        if self._by_key.get(job.key) is job:
            del self._by_key[job.key]
        for session in job.subscribers:
            slot = self._sessions.get(session)
            if slot is not None and slot.job is job:
                slot.outcome = outcome
        job.subscribers.clear()

    def _dispatch(self) -> None:
        for worker in self._workers:
            if not self._queue:
                return
            if worker.ready and worker.job is None and worker.process.is_alive():
                job = self._queue.popleft()
                worker.cancel_event.clear()
                worker.cancel_sent_at = None
                try:
                    worker.conn.send((job.id, job.fn, job.args))
                except OSError:
                    self._queue.appendleft(job)
                    continue
                job.worker, job.started = worker, time.monotonic()
                job.message = "started"
                worker.job = job

    def _replace(self, worker: _Worker, counted: bool = True) -> None:
        """Terminate `worker` (its job, if any, is already settled) and start a fresh one in its place; `counted`:
        the replacement counts in `restarts` (a timeout, a forced cancel, a crash)."""
        worker.process.terminate()
        self._dying.append((worker.process, time.monotonic()))
        worker.conn.close()
        index = self._workers.index(worker)
        self._workers[index] = self._start_worker()
        self.restarts += counted

    def _handle(self, worker: _Worker, message: tuple) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
            return
        job = worker.job
        if job is None or message[1] != job.id:
            return  # a late message about a job already settled
        if kind == "progress":
            job.fraction, job.message = message[2], message[3]
            return
        worker.job, job.worker = None, None
        if kind == "done":
            seconds = time.monotonic() - job.started
            previous = self._mean_s.get(job.key[:2])
            self._mean_s[job.key[:2]] = seconds if previous is None else 0.7 * previous + 0.3 * seconds
            self.cache.put(job.key, message[2])
            self._finish(job, JobStatus("done", fraction=1.0, message="done", result=message[2]))
        elif kind == "error":
            self._finish(job, JobStatus("failed", message="failed", error=as_lab_error(message[2])))
        else:  # cancelled
            self._finish(
                job, JobStatus("failed", message="cancelled", error=JobError("the job was cancelled"))
            )

    def _fail_running(self, worker: _Worker, error: LabError) -> None:
        job = worker.job
        worker.job = None
        if job is not None:
            job.worker = None
            self._finish(job, JobStatus("failed", message=str(error), error=error))
        self._replace(worker)

    def _enforce(self, now: float) -> None:
        """Timeouts, forced cancels, dead workers, abandoned sessions, reaping of terminated processes."""
        for worker in list(self._workers):
            job = worker.job
            if not worker.process.is_alive():
                self._fail_running(
                    worker,
                    JobFailedError(
                        f"the worker process died (exit code {worker.process.exitcode}); the job may need more "
                        "memory than this server has",
                        "WorkerDied",
                    ),
                )
            elif job is not None and now - job.started > self.timeout_s:
                self._fail_running(
                    worker,
                    JobTimeoutError(
                        f"stopped after {self.timeout_s:,g} s: over this server's job wall-time limit "
                        "(PAGED_LAB_JOB_TIMEOUT_S); choose a smaller problem",
                        "PAGED_LAB_JOB_TIMEOUT_S",
                    ),
                )
            elif (
                job is not None
                and worker.cancel_sent_at is not None
                and now - worker.cancel_sent_at > CANCEL_GRACE_S
            ):
                self._fail_running(worker, JobError("the job was cancelled"))
        for session, slot in list(self._sessions.items()):
            if now - slot.last_seen > self.abandon_after_s:
                del self._sessions[session]
                self._leave(session, slot)
        still_dying = []
        for process, since in self._dying:
            if process.is_alive():
                if now - since > 2:
                    process.kill()
                still_dying.append((process, since))
            else:
                process.join(timeout=0)
        self._dying = still_dying

    def _run(self) -> None:
        """The dispatcher thread: read worker messages (outside the lock), then update state under it."""
        while True:
            with self._lock:
                if self._closed:
                    return
                conns = {w.conn: w for w in self._workers}
            messages: list[tuple[_Worker, tuple]] = []
            try:
                ready = wait(list(conns), timeout=TICK_S)
            except OSError:
                ready = []
            for conn in ready:
                try:
                    while conn.poll():
                        messages.append((conns[conn], conn.recv()))
                except (EOFError, OSError):
                    pass  # the process is dead or being replaced; _enforce notices
                except Exception as error:  # a result that does not unpickle here
                    messages.append(
                        (conns[conn], ("error", conns[conn].job.id if conns[conn].job else -1, error))
                    )
            with self._lock:
                if self._closed:
                    return
                for worker, message in messages:
                    if worker in self._workers:
                        self._handle(worker, message)
                self._enforce(time.monotonic())
                self._dispatch()
