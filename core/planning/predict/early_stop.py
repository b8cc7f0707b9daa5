"""When a steady-state estimate answers a question about latency targets: the settings of the searches' estimates
(the SLO search's candidates, max_rate's bisection) and the rule that stops one once its verdict is clear.

A verdict is clear when some target is missed with its whole 95% interval above it, or every target is met with its
whole interval below it (`verdict_is_clear`). Intervals are trusted only once each batch spans enough lifetimes
(`SteadyState.long_enough`); before that, only a miss by a margin counts (`verdict_decider`): a replay that
started empty not long before sees less queueing than the steady state, so a miss it shows by a margin is real.
"""

from core.serving.steady_state import SteadyState, SteadyStateSettings

# The searches' estimates: 10% intervals on the targets' percentiles over batches of 3 lifetimes, at most 3,000
# requests (a marginal configuration near capacity needs them; a clear one stops early)
SEARCH_SETTINGS = SteadyStateSettings(
    tolerance=0.1, initial_measured=300, max_requests=3000, batch_lifetimes=3.0
)

# A miss seen before the batches are long enough must clear its target by a margin, its interval above it, or be
# far over it: such a replay started empty not long before and sees less queueing than the steady state.
EARLY_MISS_MARGIN = 1.1
EARLY_MISS_FAR = 1.3


def verdict_is_clear(intervals: dict, targets: dict[str, float], met: dict[str, float] | None = None) -> bool:
    """True when some target is missed with its whole 95% interval above it, or every target is met with its
    whole interval below it (a percentile without an interval decides nothing). met: other thresholds for the
    "met" side (a pool's share of a target, `core.planning.search.slo_disagg`); None: `targets`."""
    met = targets if met is None else met
    known = {key: intervals[key] for key in targets if key in intervals}
    if any(low > targets[key] for key, (low, _) in known.items()):
        return True
    return len(known) == len(targets) and all(high <= met[key] for key, (_, high) in known.items())


def verdict_decider(targets: dict[str, float], met: dict[str, float] | None = None):
    """The `decided` of a steady state asked about `targets` (`steady_prediction`'s rule): with long enough
    batches, `verdict_is_clear(intervals, targets, met)`; before, a miss by EARLY_MISS_MARGIN with the
    interval clear of the target, or by EARLY_MISS_FAR."""

    def decided(estimate: SteadyState) -> bool:
        if estimate.long_enough:
            return verdict_is_clear(estimate.intervals, targets, met)
        m, intervals = estimate.metrics, estimate.intervals
        return any(
            m[key] > EARLY_MISS_FAR * target
            or (intervals[key][0] > target and m[key] > EARLY_MISS_MARGIN * target)
            for key, target in targets.items()
            if key in intervals
        )

    return decided
