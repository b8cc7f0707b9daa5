"""The continuous-batching scheduler and the slim memory protocol it drives, below both of its drivers: the
serving simulator (`core.serving`) and the engine (`core.engine`). It imports neither.

- `scheduler`: `Scheduler` (FCFS admission with a watermark, chunked prefill, newest-first preemption by
  recompute or swap), `ScheduledStep`, `StepOutcome`, the `SequenceGroup` protocol, `PREEMPTION_MODES`.
- `memory`: `SchedulerMemory` (admit, prefill, grow, release, metrics and the checks around them),
  `MemoryMetrics`, `Admission`.
- `driver`: `run_step`, one step (schedule -> allocate -> execute -> postprocess -> observe) for both drivers,
  with the `StepExecutor` / `StepObserver` protocols they plug in.
- `step_columns`: `COLUMNS`, the per-step record both drivers keep, `StepRows`, the buffer they keep it in, and
  `StepMeasures`, what an executor measured of a step (`StepRows.record` builds the row).
- `step_load`: `step_load` / `StepLoad`, the load of a scheduled step that a step-time model prices (its
  `kv_tokens_read` is the one count of keys read, priced and recorded).
- `snapshots`: `StepSnapshot`, the one snapshot type of both drivers, `SnapshotSampler` and `take_snapshot`.
"""

from core.sched.driver import StepExecutor, StepObserver, run_step
from core.sched.memory import Admission, MemoryMetrics, SchedulerMemory
from core.sched.scheduler import PREEMPTION_MODES, ScheduledStep, Scheduler, SequenceGroup, StepOutcome
from core.sched.step_columns import COLUMNS, StepMeasures, StepRows
from core.sched.step_load import StepLoad, step_load

__all__ = [
    "COLUMNS",
    "PREEMPTION_MODES",
    "Admission",
    "MemoryMetrics",
    "ScheduledStep",
    "Scheduler",
    "SchedulerMemory",
    "SequenceGroup",
    "StepExecutor",
    "StepLoad",
    "StepMeasures",
    "StepObserver",
    "StepOutcome",
    "StepRows",
    "run_step",
    "step_load",
]
