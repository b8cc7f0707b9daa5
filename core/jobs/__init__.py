"""Heavy work off the server process: a bounded pool of worker processes and a result cache.

Public API: `JobPool` (submit / poll / cancel / stats / close), `JobStatus`, `ResultCache`, `job_key`. Its
errors (`JobError`, `QueueFullError`, `JobTimeoutError`, `JobFailedError`, `JobCancelledError`) live in
`core.errors` with every other error.

The pool runs the module-level functions it is given (by object, pickled by module path); the jobs the pages
submit are in `core.page_models.tasks`, a layer above. Nothing here imports a domain package
(tests/test_layers.py).
"""

from core.jobs.cache import MISSING, ResultCache
from core.jobs.pool import JobPool
from core.jobs.status import JobStatus, job_key

__all__ = [
    "MISSING",
    "JobPool",
    "JobStatus",
    "ResultCache",
    "job_key",
]
