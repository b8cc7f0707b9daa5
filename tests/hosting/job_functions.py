"""Small, real job functions for the pool tests (module-level, so worker processes can import them)."""

import os
import time

from core.errors import MemoryBudgetError
from core.limits import Limits


def sleep_steps(steps: int, step_s: float, value: object, progress) -> tuple:
    """Sleep `steps` times `step_s`, reporting progress after each; returns (value, steps, this process's pid)."""
    for index in range(steps):
        time.sleep(step_s)
        progress((index + 1) / steps, f"step {index + 1} of {steps}")
    return (value, steps, os.getpid())


def sleep_forever(progress) -> None:
    """Never reports progress and never returns: only terminating the worker stops it."""
    while True:
        time.sleep(0.05)


def raise_budget(num_bytes: int, progress) -> None:
    raise MemoryBudgetError(f"needs {num_bytes:,} bytes", requested_bytes=num_bytes, allowed_bytes=1)


def raise_bug(progress) -> None:
    return 1 // 0


def worker_limits(progress) -> Limits:
    """The limits as the worker process reads them from its environment."""
    return Limits.from_env()


def unpicklable_result(progress):
    return lambda: None


def churn_heap(mib: int, progress) -> int:
    """Allocate and free `mib` MiB in 1 MiB pieces under the kernel timer's malloc settings (freed memory stays
    in the heap); returns this process's pid."""
    from core.kernels.timer import tune_malloc

    tune_malloc()
    pieces = [bytearray(1 << 20) for _ in range(mib)]
    progress(0.5, f"{len(pieces)} MiB held")
    del pieces
    return os.getpid()


_MEMO: list = []  # what this worker process's jobs memoised (as a page's job memoises a model's weights)


def memoise(value: object, progress) -> tuple[int, int]:
    """Keep `value` in this worker's memo; returns (items in the memo now, this process's pid)."""
    _MEMO.append(value)
    return len(_MEMO), os.getpid()


def collector_sight(progress) -> tuple[int, int]:
    """(objects the collector no longer walks: `gc.get_freeze_count()`, objects it still tracks) in this worker."""
    import gc

    return gc.get_freeze_count(), len(gc.get_objects())
