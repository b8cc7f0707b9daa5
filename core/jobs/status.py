"""What a job is called and what it reports: the key a job's result is cached and shared under (`job_key`), the
status a session reads (`JobStatus`), and a worker's error as the LabError a page shows (`as_lab_error`)."""

import pickle
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from core.errors import InvalidArgumentError, JobFailedError, LabError


@dataclass(frozen=True)
class JobStatus:
    """What a session's job is doing. state: "idle" (no job), "queued", "running", "done" or "failed".

    position: 1-based place in the queue while queued, else 0. fraction in [0, 1] and message: the worker's
    last progress report. result: the job's return value when done (shared, read-only). error: a LabError when
    failed. cached: the result came from the cache without running. queued / running: jobs in the whole pool.
    estimate_s: seconds until the result is expected while queued or running (None when unknown).
    """

    state: str
    position: int = 0
    fraction: float = 0.0
    message: str = ""
    result: object = None
    error: LabError | None = None
    cached: bool = False
    queued: int = 0
    running: int = 0
    estimate_s: float | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


def job_key(fn: Callable, args: tuple) -> Hashable:
    """(module, qualified name, args): what a result is cached under. Raises InvalidArgumentError when `fn` is
    not a module-level function or `args` are not hashable and picklable."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    qualname = getattr(fn, "__qualname__", "")
    if module is None or getattr(module, qualname, None) is not fn:
        raise InvalidArgumentError(f"a job must be a module-level function, got {fn!r}")
    try:
        hash(args)
        pickle.dumps(args)
    except Exception as error:
        raise InvalidArgumentError(f"job arguments must be hashable and picklable: {error}") from None
    return (fn.__module__, qualname, args)


def as_lab_error(error) -> LabError:
    """A worker's error as a LabError: the original when it travelled and is one, else JobFailedError."""
    if isinstance(error, LabError):
        return error
    if isinstance(error, BaseException):
        return JobFailedError(f"the job failed: {type(error).__name__}: {error}", type(error).__name__)
    name, message, is_lab_error = error
    text = message if is_lab_error else f"the job failed: {name}: {message}"
    return JobFailedError(text, name)
