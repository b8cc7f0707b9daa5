"""Axis settings shared by the figure builders: counts get whole-number ticks."""

import math


def integer_ticks(max_value: float, max_ticks: int = 8) -> dict:
    """Axis settings for a count whose values lie in [0, max_value]: ticks at multiples of the smallest step of 1,
    2 or 5 x 10^k (at least 1) that gives at most `max_ticks` intervals, printed as whole numbers. Never a 0.5."""
    span = max(float(max_value), 1.0)
    step = 1
    for exponent in range(0, 16):
        for mantissa in (1, 2, 5):
            step = mantissa * 10**exponent
            if span / step <= max_ticks:
                return {"tick0": 0, "dtick": step, "tickformat": ",d"}
    return {"tick0": 0, "dtick": 10 ** math.ceil(math.log10(span)), "tickformat": ",d"}
