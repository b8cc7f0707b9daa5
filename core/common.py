"""Small helpers every part of core uses: ceiling division, argument checks, the memory-budget check, timing.

Each check raises `InvalidArgumentError` (or `MemoryBudgetError`) with a message naming the argument, what it
was and what is allowed, and returns the value as a plain Python number so callers never carry numpy scalars.
"""

import math
import statistics
import time
from collections.abc import Callable
from numbers import Integral, Real

from core.device import format_bytes, memory_budget_bytes
from core.errors import InvalidArgumentError, MemoryBudgetError


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division of integers: cdiv(17, 16) == 2, cdiv(0, 16) == 0."""
    return -(-numerator // denominator)


# How a value's type is named in messages: JSON's names for the types a parsed JSON body holds (an HTTP
# request's fields and a Python caller's arguments are described alike), the class name for anything else.
JSON_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def json_type_name(value: object) -> str:
    """What `value` is, for a message: "a string", "an array", "null", ... (`JSON_TYPE_NAMES`), else its class."""
    return JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def check_int(value: object, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as a Python int when it is an integer (numpy integers too, never bool) within the bounds."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    result = int(value)
    _check_bounds(result, name, minimum, maximum)
    return result


def check_float(
    value: object,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
) -> float:
    """`value` as a finite Python float (ints and numpy numbers accepted, never bool) within the bounds."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}")
    result = float(value)
    if exclusive_minimum and minimum is not None and result <= minimum:
        raise InvalidArgumentError(f"{name} must be greater than {minimum:g}, got {result:g}")
    _check_bounds(result, name, None if exclusive_minimum else minimum, maximum)
    return result


def _check_bounds(value: float, name: str, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and maximum is not None and not minimum <= value <= maximum:
        raise InvalidArgumentError(f"{name} must be between {minimum:,} and {maximum:,}, got {value:,}")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum:,}, got {value:,}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum:,}, got {value:,}")


def check_budget(requested_bytes: int, what: str, budget: int | None = None) -> None:
    """Raise `MemoryBudgetError` before allocating when `requested_bytes` exceed the budget: `budget` when given,
    else the operator's (`memory_budget_bytes()`, PAGED_LAB_MAX_BYTES). `what` names what was asked for."""
    allowed = memory_budget_bytes() if budget is None else int(budget)
    if requested_bytes > allowed:
        raise MemoryBudgetError(
            f"{what} needs {requested_bytes:,} bytes ({format_bytes(requested_bytes)}), over the memory budget "
            f"of {allowed:,} bytes ({format_bytes(allowed)}; the operator sets it with PAGED_LAB_MAX_BYTES); "
            "choose a smaller configuration",
            requested_bytes=int(requested_bytes),
            allowed_bytes=int(allowed),
        )


def time_ms(
    fn: Callable[[], object], *, repeats: int, warmup: int = 1, sync: Callable[[], None] | None = None
):
    """Median and every sample, in milliseconds, of `repeats` timed calls of `fn` after `warmup` untimed ones.

    `sync` (e.g. `torch.cuda.synchronize`) runs before each clock read so asynchronous device work is counted.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), samples
