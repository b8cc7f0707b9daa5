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
