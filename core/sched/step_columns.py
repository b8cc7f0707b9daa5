"""`COLUMNS`: the per-step record both drivers of the scheduler keep, the serving simulator
(`core.serving.simulator`) and the engine (`core.engine.metrics`, which adds its own columns after these);
`StepRows`, the one buffer both record them in; and `StepRows.record`, the one place a row is built, from the
scheduled step (`core.sched.scheduler.ScheduledStep`, with its `core.sched.step_load` load), its
`StepOutcome`, the memory's `MemoryMetrics` after it and the executor's `StepMeasures` (the run driver's
observer, `core.sched.driver`, records each step with it). A new column is one entry of `COLUMNS` and one value
in `StepRows.record`.

One row per step. Memory columns are `core.sched.memory.MemoryMetrics` in KV token slots (plus
`external_fragmentation`, the allocator slack: free memory is not waste); `time_s` is the end of the step in
seconds and `step_time_ms` its duration; counts are of requests (`running`, `waiting`, `swapped`), sequences
(`running_seqs`) or tokens (`tokens_generated`, `prefill_tokens`, `kv_tokens_read`: the step load's count of
keys read besides the step's own tokens, `prefix_hit_tokens`).
"""

from typing import NamedTuple

import numpy as np
import pandas as pd

from core.errors import InvalidArgumentError
from core.sched.memory import MemoryMetrics

COLUMNS = (
    "step",
    "time_s",
    "step_time_ms",
    "running",
    "running_seqs",
    "waiting",
    "swapped",
    "preemptions",
    "preemptions_total",
    "free_blocks",
    "free_slots",
    "token_states",
    "reservation",
    "internal_fragmentation",
    "allocator_slack",
    "external_fragmentation",
    "tokens_generated",
    "prefill_tokens",
    "kv_tokens_read",
    "prefix_hit_tokens",
)

FLOAT_COLUMNS = ("time_s", "step_time_ms")  # every other column of COLUMNS holds integers


class StepMeasures(NamedTuple):
    """What the executor measured of a step: its row's `step` number, its end (`time_s`, seconds since the run
    began) and duration (`step_time_ms`), and the preemptions so far. For a batch of k identical decode-only
    steps (the simulator's replay) these are arrays of k, and so are the overrides: `waiting` (the step's
    num_waiting plus the arrivals meanwhile), `kv_tokens_read` (each step's load) and `tokens_generated` (each
    step's share of the outcome); None: the step's, the load's and the outcome's own value."""

    step: int | np.ndarray
    time_s: float | np.ndarray
    step_time_ms: float | np.ndarray
    preemptions_total: int
    waiting: np.ndarray | None = None
    kv_tokens_read: np.ndarray | None = None
    tokens_generated: np.ndarray | None = None


_HITS = COLUMNS.index("prefix_hit_tokens")


class StepRows:
    """Step rows in a growing float64 buffer [steps, len(columns)]: `columns` starts with `COLUMNS` (a driver
    may add its own after them); `float_columns` stay float64 in the frame, every other column is int64 (the
    values are integers below 2**53, so the float buffer holds them exactly). `size`: rows recorded."""

    def __init__(self, columns: tuple = COLUMNS, float_columns: tuple = FLOAT_COLUMNS):
        if columns[: len(COLUMNS)] != COLUMNS:
            raise InvalidArgumentError("step rows start with core.sched.step_columns.COLUMNS")
        self.columns = columns
        self.float_columns = float_columns
        self.buf = np.empty((4096, len(columns)))
        self.size = 0

    def rows(self, count: int) -> np.ndarray:
        """The next `count` rows (a view to fill), counted as recorded."""
        if self.size + count > len(self.buf):
            grown = np.empty((max(2 * len(self.buf), self.size + count), len(self.columns)))
            grown[: self.size] = self.buf[: self.size]
            self.buf = grown
        self.size += count
        return self.buf[self.size - count : self.size]

    def record(
        self, step, outcome, metrics: MemoryMetrics, measured: StepMeasures, extra: tuple = ()
    ) -> None:
        """Record the row of `step` (a `ScheduledStep` whose `load` the driver set) after its `outcome`, the
        memory's `metrics` after it and what the executor `measured`; `extra`: the values of the columns after
        `COLUMNS`. A batch of k decode-only steps (`measured.step` an array of k; metrics arrays of k, or
        numbers alike for every row) records k rows; the step's admissions (`prefix_hit_tokens`) count once,
        in its first row."""
        values = (
            measured.step,
            measured.time_s,
            measured.step_time_ms,
            step.num_running,
            step.num_running_seqs,
            step.num_waiting if measured.waiting is None else measured.waiting,
            step.num_swapped,
            len(step.preempted),
            measured.preemptions_total,
            metrics.free_blocks,
            metrics.free_slots,
            metrics.token_states,
            metrics.reservation,
            metrics.internal_fragmentation,
            metrics.allocator_slack,
            metrics.allocator_slack,  # external_fragmentation: real fragmentation only, free is not waste
            outcome.tokens_generated if measured.tokens_generated is None else measured.tokens_generated,
            outcome.prefill_tokens,
            step.load.kv_tokens_read if measured.kv_tokens_read is None else measured.kv_tokens_read,
            step.prefix_hit_tokens,
            *extra,
        )
        if isinstance(measured.step, np.ndarray):
            rows = self.rows(len(measured.step))
            for column, value in enumerate(values):
                rows[:, column] = value
            rows[1:, _HITS] = 0
        else:
            self.rows(1)[0] = values

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame: `float_columns` float64, the others int64 (built column by column: a
        float frame cast afterwards took ~10x longer)."""
        buf, floats = self.buf[: self.size], self.float_columns
        columns = {
            name: buf[:, i].copy() if name in floats else buf[:, i].astype(np.int64)
            for i, name in enumerate(self.columns)
        }
        return pd.DataFrame(columns, copy=False)
