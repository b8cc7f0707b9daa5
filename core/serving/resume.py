"""A simulation that continues instead of starting over: `SimulationSession.run(requests, until)` gives exactly
what `simulate(requests, ..., until_finished=until)` (or `simulate_fleet`) gives, every step row and every
request row the same to the bit, and when the previous run's requests are the first of the new ones it does so
by resuming the previous run with the new arrivals appended rather than replaying it from scratch.

`core.serving.steady_state` grows its measured window by asking for more requests and a later stop: with a
prefix-stable draw (`Load.requests` at fixed lengths, plain or with shared prefixes) each growth then costs only
its new requests.

Why continuing is exact. The simulator is a discrete-event run whose decisions at clock t read the arrivals up
to t only: which arrivals are queued (those <= t), where a decode-only batch is cut (at the first arrival after
its start, which it reads as "none" past the last one), where a round-robin replica's batch ends (the arrivals
routed to it) and, in a fleet, whether the next event is an arrival or a step. The previous run (n1 requests,
stopped once its first until1 finished) made every decision at a clock no later than where it stopped, the
largest of its replicas' clocks (each clock only moves forward). A run on n2 >= n1 requests whose first n1 are
the same and whose next arrival comes strictly after that clock reads, at every one of those decisions, the
same arrivals, so it makes the same decisions up to that point; it does not stop earlier (its first until2 >=
until1 are not all finished before the first until1 are), and from there the resumed run is the same loop. A
closed loop (`concurrency=`) ignores the arrival times: a finish sends the next request, and a run that had
more finishes than requests to send (the n2 run would have sent request n1 then) cannot continue. Whatever
cannot continue (fewer requests, an earlier stop, a different first n1 such as a `length_spread` or multi-turn
draw, an arrival at or before the clock) runs fresh.
"""

import math
import time
from collections.abc import Sequence

import numpy as np

from core.common import check_int
from core.errors import InvalidArgumentError
from core.serving.fleet import Fleet, FleetRun
from core.serving.memory_policies import Policy
from core.serving.sim_config import SimulatorConfig
from core.serving.sim_result import SimulationResult
from core.serving.simulator import (
    _validate_requests,
    advance,
    check_types,
    simulation_result,
    start_simulation,
)
from core.serving.workload import Request

__all__ = ["SimulationSession"]


class SimulationSession:
    """Runs of one policy and config (a `fleet` of replicas, or one replica with `concurrency` clients in a
    closed loop) that continue each other when they can (module docstring). resumed / fresh: how many runs
    continued the previous one / started over. Raises InvalidArgumentError for a fleet with a closed loop (a
    fleet is open-loop) or as `simulate` / `simulate_fleet` do."""

    def __init__(
        self,
        policy: Policy,
        config: SimulatorConfig,
        concurrency: int | None = None,
        fleet: Fleet | None = None,
    ):
        check_types(policy, config)
        if fleet is not None and concurrency is not None:
            raise InvalidArgumentError(
                "a fleet runs open-loop arrivals: concurrency must be None with a fleet"
            )
        if fleet is not None and not isinstance(fleet, Fleet):
            raise InvalidArgumentError(f"fleet must be a core.serving.fleet.Fleet, got {fleet!r}")
        self.policy, self.config, self.concurrency, self.fleet = policy, config, concurrency, fleet
        self.resumed = 0
        self.fresh = 0
        self._requests: list[Request] = []  # the last run's requests, in arrival order
        self._until = 0
        self._run = None  # the last run: a `_Simulation`, or a `FleetRun`
        self._maker = None  # its groups' maker (one replica's; a FleetRun holds its own)

    def run(self, requests: Sequence[Request], until: int) -> SimulationResult:
        """The run of `requests` until the first `until` (arrival order) finished, as `simulate(requests, policy,
        config, until_finished=until, concurrency=concurrency)` or `simulate_fleet(requests, policy, config,
        fleet, until_finished=until)` returns it (wall_s: this call's seconds)."""
        started = time.perf_counter()
        reqs = _validate_requests(requests, self.config)
        until = check_int(until, "until_finished", minimum=1, maximum=len(reqs))
        resume = self._continues(reqs, until)
        try:
            if resume:
                self._extend(reqs[len(self._requests) :])
            else:
                self._start(reqs)
            run = self._run
            run.until = until
            self._recount(until)
            if self.fleet is None:
                advance(run)
            else:
                run.advance()
        except BaseException:
            self._run, self._requests = None, []  # a run that failed part-way is not continued
            raise
        self._requests, self._until = reqs, until
        self.resumed += resume
        self.fresh += not resume
        wall = time.perf_counter() - started
        return simulation_result(run, self.policy, wall) if self.fleet is None else run.result(wall)

    def _continues(self, reqs: list[Request], until: int) -> bool:
        old = self._requests
        n = len(old)
        if self._run is None or len(reqs) < n or until < self._until or reqs[:n] != old:
            return False
        if len(reqs) == n:
            return True
        if self.fleet is not None:
            clock = max(rep.sim.now for rep in self._run.replicas)
            return reqs[n].arrival_time > clock
        sim = self._run
        if self.concurrency is not None:  # every finish so far sent a request (none past the last one)
            return self.concurrency + sim.finished <= n
        return reqs[n].arrival_time > sim.now

    def _start(self, reqs: list[Request]) -> None:
        if self.fleet is None:
            self._run, self._maker = start_simulation(reqs, self.policy, self.config, self.concurrency)
        else:
            self._run = FleetRun(reqs, self.policy, self.config, self.fleet)

    def _extend(self, new: list[Request]) -> None:
        """Append `new` (arriving after the run's clock) to the run's groups and arrivals."""
        if not new:
            return
        run = self._run
        maker = self._maker if self.fleet is None else run.maker
        groups = maker.make(new, len(run.groups))
        memory = run.memory if self.fleet is None else run.replicas[0].memory
        for group in groups:
            memory.check_fits(group, group.output_len)
        run.groups.extend(groups)  # the one list every replica's simulation reads
        if self.concurrency is not None:  # a closed loop: sent by finishes, not at their times
            times = np.full(len(groups), math.inf)
        else:
            times = np.array([g.request.arrival_time for g in groups], dtype=np.float64)
        run.arrivals = np.concatenate((run.arrivals, times))
        if self.fleet is not None:
            for rep in run.replicas:
                rep.sim.arrivals = run.arrivals
            run.assignment = np.concatenate((run.assignment, np.full(len(groups), -1, dtype=np.int64)))

    def _recount(self, until: int) -> None:
        """Each simulation's finished_first for the new stop: its finished groups among the first `until`."""
        groups = self._run.groups[:until]
        done = [not math.isnan(g.finish_time) for g in groups]
        if self.fleet is None:
            self._run.finished_first = sum(done)
            return
        where = self._run.assignment[:until]
        for r, rep in enumerate(self._run.replicas):
            rep.sim.finished_first = int(np.count_nonzero(np.asarray(done) & (where == r)))
