"""The run driver: one scheduler step, the same shape for both drivers of the `Scheduler`, the serving simulator
(`core.serving.simulator`) and the engine (`core.engine.engine`); nano-vllm's `LLMEngine.step` (schedule, run,
postprocess) with the scheduler's phases named (`core.sched.scheduler`):

    step = scheduler.schedule()                       # decisions; admission and preemption memory
    (a stuck step raises executor.stuck_error(step))
    step.load = step_load(step, scheduler.memory)    # what the step reads and computes (priced, recorded)
    num_steps = executor.plan(step)                   # identical steps this record stands for (1 but for the
                                                      # simulator's decode-only replay)
    scheduler.allocate(step, num_steps)               # every decoding sequence's KV slots
    executed = executor.execute(step)                 # the only varying part: the engine runs the model and
                                                      # samples, the simulator prices the step (modeled seconds)
    outcome = scheduler.postprocess(step)             # computed tokens, forks and frees, finished groups released
    result = executor.finish(step, outcome, executed) # what the caller returns: request outputs, or the clock
    observer.on_step(step, outcome, result)           # recording: one step row (or a batch of them), snapshots

Every step goes through every phase, an empty one (it only preempted or swapped in: nothing runs) included; an
observer may record it (the engine: one row per `Engine.step` call) or not (the simulator: rows are steps that
ran). Invariants: only the scheduler's phases write KV memory; the executor writes none (the engine's sampler
leaves forks and ends for `postprocess`), the observer reads and writes nothing but its record.

Both observers record each step with `core.sched.step_columns.StepRows.record`, from the scheduled step (its
`load`, `core.sched.step_load`, set here once: what the simulator prices and what both record as
`kv_tokens_read`), its outcome, the memory's metrics and the executor's `StepMeasures` (the engine adds columns
after `COLUMNS`), so a step row means the same thing in `EngineRun.steps` and `SimulationResult.steps`.
"""

from __future__ import annotations

from typing import Protocol

from core.sched.scheduler import ScheduledStep, Scheduler, StepOutcome
from core.sched.step_load import step_load


class StepExecutor(Protocol):
    """What a driver plugs into `run_step`: how a scheduled step runs."""

    def stuck_error(self, step: ScheduledStep) -> Exception:
        """The error to raise for a stuck step (`ScheduledStep.is_stuck`): `SchedulerStuckError.nothing_fits`."""

    def plan(self, step: ScheduledStep) -> int:
        """Before `allocate`: how many identical steps (>= 1) this step stands for (> 1 only when decode-only)."""

    def execute(self, step: ScheduledStep) -> object:
        """Run the allocated step (a forward pass, or its modeled cost); returns what `finish` reads."""

    def finish(self, step: ScheduledStep, outcome: StepOutcome, executed: object) -> object:
        """After `postprocess`: the caller's bookkeeping; returns `run_step`'s result (the observer sees it too)."""


class StepObserver(Protocol):
    """Records a step once the scheduler postprocessed it; reads the run, writes only its own record."""

    def on_step(self, step: ScheduledStep, outcome: StepOutcome, result: object) -> None: ...


def run_step(scheduler: Scheduler, executor: StepExecutor, observer: StepObserver) -> object:
    """One step: schedule -> plan -> allocate -> execute -> postprocess -> finish -> observe (module docstring).
    Returns `executor.finish`'s result. Raises `executor.stuck_error(step)` when nothing can run or move."""
    step = scheduler.schedule()
    if step.is_stuck:
        raise executor.stuck_error(step)
    step.load = step_load(step, scheduler.memory)
    scheduler.allocate(step, executor.plan(step))
    executed = executor.execute(step)
    outcome = scheduler.postprocess(step)
    result = executor.finish(step, outcome, executed)
    observer.on_step(step, outcome, result)
    return result
