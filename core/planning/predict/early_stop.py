"""When a steady-state estimate answers a question about latency targets: the settings of the searches' estimates
(the SLO search's candidates, max_rate's bisection) and the rule that stops one once its verdict is clear.

A verdict is clear when some target is missed with its whole 95% interval above it, or every target is met with its
whole interval below it (`verdict_is_clear`). Intervals are trusted only once each batch spans enough lifetimes
(`SteadyState.long_enough`); before that, only a miss by a margin counts (`verdict_decider`): a replay that
started empty not long before sees less queueing than the steady state, so a miss it shows by a margin is real.
A search comparing configurations also stops one once it cannot rank above a configuration it already found
(`ratio_floor` over `beat`): its targets' interval low ends, over the targets, already exceed that
configuration's SLO ratio.
"""

from typing import NamedTuple

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


class Question(NamedTuple):
    """What a search asks of one steady state: targets (key -> seconds), and beat, the lowest SLO ratio a
    configuration it would have to rank above already met (None: none yet)."""

    targets: dict[str, float]
    beat: float | None = None

    def decider(self):
        """`verdict_decider(targets, beat=beat)`."""
        return verdict_decider(self.targets, beat=self.beat)

    def stopped_outranked(self, estimate: SteadyState) -> bool:
        """True when `decider()` stopped `estimate` only because it is `outranked`: unconverged, and the
        verdict on the targets alone not yet clear."""
        return (
            estimate.decided
            and not estimate.converged
            and outranked(estimate.intervals, self.targets, self.beat)
            and not verdict_decider(self.targets)(estimate)
        )


def ratio_floor(intervals: dict, targets: dict[str, float]) -> float | None:
    """The smallest SLO ratio (a percentile / its target, the largest over the targets) the 95% intervals leave
    possible: the largest low end / target. None while some target's percentile has no interval."""
    if not targets or any(key not in intervals for key in targets):
        return None
    return max(intervals[key][0] / target for key, target in targets.items())


def outranked(intervals: dict, targets: dict[str, float], beat: float | None) -> bool:
    """True when the estimate's SLO ratio cannot come below `beat` (`ratio_floor` > beat); False for no beat."""
    floor = None if beat is None else ratio_floor(intervals, targets)
    return floor is not None and bool(floor > beat)


def verdict_decider(
    targets: dict[str, float], met: dict[str, float] | None = None, beat: float | None = None
):
    """The `decided` of a steady state asked about `targets` (`steady_prediction`'s rule): with long enough
    batches, `verdict_is_clear(intervals, targets, met)`; before, a miss by EARLY_MISS_MARGIN with the
    interval clear of the target, or by EARLY_MISS_FAR. beat: the SLO ratio of a configuration the estimate
    would have to rank above (a search's best of equal cost); once `outranked`, the question is answered at
    any batch length (an early replay sees less queueing, so its interval's low end is, if anything, low)."""

    def decided(estimate: SteadyState) -> bool:
        if outranked(estimate.intervals, targets, beat):
            return True
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
