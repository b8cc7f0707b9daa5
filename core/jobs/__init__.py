"""Heavy work off the server process: a bounded pool of worker processes, a result cache, and the job errors.

Public API: `JobPool` (submit / poll / cancel / stats / close), `JobStatus`, `ResultCache`, `job_key`, and the
errors `JobError`, `QueueFullError`, `JobTimeoutError`, `JobFailedError`, `JobCancelledError`.
"""

from core.jobs.cache import MISSING, ResultCache
from core.jobs.pool import (
    JobError,
    JobFailedError,
    JobPool,
    JobStatus,
    JobTimeoutError,
    QueueFullError,
    job_key,
)
from core.jobs.worker import JobCancelledError

__all__ = [
    "MISSING",
    "JobCancelledError",
    "JobError",
    "JobFailedError",
    "JobPool",
    "JobStatus",
    "JobTimeoutError",
    "QueueFullError",
    "ResultCache",
    "job_key",
]
