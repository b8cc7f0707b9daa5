"""A Prometheus histogram as scraped: cumulative bucket counts, with Prometheus's percentile estimate.

Invariants of `Histogram`: `bounds` strictly increasing and ending with +inf; `cumulative[i]` = observations
<= bounds[i], non-decreasing, and `cumulative[-1] == count`. Values are floats, as Prometheus sends them.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Histogram:
    bounds: tuple[float, ...]  # upper bounds (`le`), ascending, the last one +inf
    cumulative: tuple[float, ...]  # observations <= each bound
    sum: float
    count: float

    @classmethod
    def from_buckets(cls, buckets: Sequence[tuple[float, float]], total: float, count: float) -> "Histogram":
        """From (le, cumulative count) pairs in any order. A histogram without a +Inf bucket takes `count`."""
        ordered = sorted(buckets)
        if not ordered or not math.isinf(ordered[-1][0]):
            ordered.append((math.inf, count))
        return cls(tuple(b for b, _ in ordered), tuple(c for _, c in ordered), total, count)

    @property
    def mean(self) -> float | None:
        """Mean observation, None with no observations."""
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus's `histogram_quantile(q)`: the bucket holding rank q x count, linearly interpolated between
        its lower and upper bound (the first bucket starts at 0). A rank in the +Inf bucket gives the highest
        finite bound. None with no observations. The true quantile lies in the same bucket as the estimate."""
        if not 0 <= q <= 1:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        if self.count <= 0:
            return None
        rank = q * self.count
        for i, (bound, cum) in enumerate(zip(self.bounds, self.cumulative, strict=True)):
            if cum >= rank and cum > 0:
                if math.isinf(bound):
                    return self.bounds[i - 1] if i > 0 else None
                lower = self.bounds[i - 1] if i > 0 else min(0.0, bound)
                below = self.cumulative[i - 1] if i > 0 else 0.0
                in_bucket = cum - below
                return bound if in_bucket <= 0 else lower + (bound - lower) * (rank - below) / in_bucket
        return self.bounds[-2] if len(self.bounds) > 1 else None

    def minus(self, older: "Histogram") -> "Histogram":
        """The observations made since `older` (an earlier scrape of the same series): a window's histogram.
        When the server restarted (a count went down) the whole of `self` is the window."""
        if older.bounds != self.bounds or any(
            new < old for new, old in zip(self.cumulative, older.cumulative, strict=True)
        ):
            return self
        return Histogram(
            self.bounds,
            tuple(new - old for new, old in zip(self.cumulative, older.cumulative, strict=True)),
            self.sum - older.sum,
            self.count - older.count,
        )


def merge_histograms(histograms: Sequence[Histogram]) -> Histogram | None:
    """The sum of several series (engines, replicas): counts added at the bounds they all share (exact there;
    +inf is always shared). None for an empty sequence."""
    if not histograms:
        return None
    shared = set(histograms[0].bounds)
    for h in histograms[1:]:
        shared &= set(h.bounds)
    bounds = tuple(sorted(shared))
    cumulative = tuple(sum(h.cumulative[h.bounds.index(b)] for h in histograms) for b in bounds)
    return Histogram(bounds, cumulative, sum(h.sum for h in histograms), sum(h.count for h in histograms))
