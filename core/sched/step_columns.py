"""`COLUMNS`: the per-step record both drivers of the scheduler keep, the serving simulator
(`core.serving.simulator`) and the engine (`core.engine.metrics`, which adds its own columns after these), and
`StepRows`, the one buffer both record them in (`core.sched.driver`: the observer's record).

One row per step. Memory columns are `core.sched.memory.MemoryMetrics` in KV token slots (plus
`external_fragmentation`, the allocator slack: free memory is not waste); `time_s` is the end of the step in
seconds and `step_time_ms` its duration; counts are of requests (`running`, `waiting`, `swapped`), sequences
(`running_seqs`) or tokens (`tokens_generated`, `prefill_tokens`, `kv_tokens_read`, `prefix_hit_tokens`).
"""

import numpy as np
import pandas as pd

from core.errors import InvalidArgumentError

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

    def add(self, row: dict) -> None:
        """Record one row given as {column: value} (every column)."""
        self.rows(1)[0] = [row[name] for name in self.columns]

    def frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.buf[: self.size], columns=list(self.columns))
        ints = [c for c in self.columns if c not in self.float_columns]
        return frame.astype(dict.fromkeys(ints, np.int64))
