"""The simulator's observer (`_SimRecord`, `core.sched.driver.StepObserver`): one `core.sched.COLUMNS` row per step
that ran and the sampled snapshots of a `core.serving.simulator` run."""

import numpy as np

from core.sched import MemoryMetrics, ScheduledStep, StepMeasures, StepOutcome, StepRows
from core.sched.snapshots import SnapshotSampler, take_snapshot
from core.serving.sim_result import StepSnapshot


class _SimRecord:
    """The simulation's observer (`core.sched.driver.StepObserver`): one `COLUMNS` row per step that ran (an
    empty step, which only preempted or swapped in, has none) in `rows` (`StepRows`), and the sampled
    `snapshots` (`core.sched.snapshots.SnapshotSampler`: rows whose index is a multiple of its stride, which
    doubles to keep at most max_snapshots). It reads the simulation, the scheduler and the memory policy and
    writes none of them. A step arrives priced: `core.serving.simulator._Priced`, None for an empty step."""

    def __init__(self, sim):
        self.sim = sim
        self.rows = StepRows()
        self.sampler = SnapshotSampler(sim.config.max_snapshots)

    @property
    def snapshots(self) -> list[StepSnapshot]:
        return self.sampler.snapshots

    def on_step(self, step: ScheduledStep, outcome: StepOutcome, priced) -> None:
        if priced is None:
            return
        if len(priced.dts) == 1:
            self._record_one(step, outcome, priced)
        else:
            self._record_decode_run(step, outcome, priced)
        self._snapshot(priced.end)

    def _record_one(self, step: ScheduledStep, outcome: StepOutcome, priced) -> None:
        sim = self.sim
        measured = StepMeasures(
            self.rows.size, priced.end, (priced.end - priced.start) * 1000.0, sim.scheduler.num_preemptions
        )
        self.rows.record(step, outcome, sim.memory.metrics(), measured)

    def _record_decode_run(self, step: ScheduledStep, outcome: StepOutcome, priced) -> None:
        """k rows of one decode-only batch: memory from the policy's prediction, the last row after the frees."""
        sim = self.sim
        end_times, dts = priced.end_times, priced.dts
        k = len(dts)
        n_decode = step.num_decode_tokens
        first = self.rows.size
        if sim.round_robin is None:
            arrived_meanwhile = np.searchsorted(sim.arrivals, end_times - dts, side="right") - sim.arrived
        else:  # a batch ends at the arrival routed here: none joined its queue meanwhile
            arrived_meanwhile = 0
        ms = dts * 1000.0 if priced.step_ms is None else priced.step_ms
        generated = n_decode  # every step's tokens alike (decode-only: the outcome is k x n_decode)
        if outcome.tokens_generated != n_decode * k:
            generated = np.full(k, n_decode)
            generated[-1] = outcome.tokens_generated - n_decode * (k - 1)
        predicted = np.array(priced.ahead)[:, :k]  # [metrics, k]; the last row is after the frees
        predicted[:, -1] = sim.memory.metrics()
        metrics = MemoryMetrics(*predicted)
        measured = StepMeasures(
            np.arange(first, first + k),
            end_times,
            ms,
            sim.scheduler.num_preemptions,
            waiting=step.num_waiting + arrived_meanwhile,
            kv_tokens_read=priced.reads,
            tokens_generated=generated,
        )
        self.rows.record(step, outcome, metrics, measured)

    def _snapshot(self, now: float) -> None:
        """Sample the state after the step just recorded (it ended at `now`), if its row is due."""
        sim, step = self.sim, self.rows.size - 1
        self.sampler.sample(step, lambda: take_snapshot(step, now, sim.scheduler.running, sim.memory))
