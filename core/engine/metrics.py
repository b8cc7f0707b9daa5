"""What the engine records per step: the serving simulator's columns measured on a real run, plus sharing.

`STEP_COLUMNS` = the simulator's `COLUMNS` (same names and meanings, in KV token slots of the pool; `time_s` and
`step_time_ms` are wall-clock here, `swapped` and `allocator_slack` are always 0: the engine preempts by
recompute and its capacity is whole blocks) followed by:
    shared_blocks           blocks held by more than one sequence (ref count > 1) after the step;
    cow_copies              copy-on-write block copies made this step;
    attention_ms            milliseconds in the paged attention kernels this step (all layers);
    blocks_in_use           blocks held by live sequences after the step (num_blocks - free_blocks);
    blocks_without_sharing  blocks the same live sequences would hold if nothing were shared (sum of their
                            block-table lengths).
"""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.paging.block_manager import BlockSnapshot
from core.sched.step_columns import COLUMNS

ENGINE_COLUMNS = ("shared_blocks", "cow_copies", "attention_ms", "blocks_in_use", "blocks_without_sharing")
STEP_COLUMNS = (*COLUMNS, *ENGINE_COLUMNS)
_FLOAT_COLUMNS = ("time_s", "step_time_ms", "attention_ms")


@dataclass(frozen=True, eq=False)
class EngineSnapshot:
    """The pool after one sampled step: the manager's `BlockSnapshot` and, for each of its live sequence ids, the
    request that owns it (`request_of[seq_id]`, the prompt's index in the `generate` call)."""

    step: int
    blocks: BlockSnapshot
    request_of: dict


@dataclass(eq=False)
class EngineRun:
    """Everything recorded by the last `Engine.generate` call.

    steps: one row per step, columns `STEP_COLUMNS` (see the module docstring).
    snapshots: `EngineSnapshot`s at evenly spaced steps (at most `max_snapshots`, the last step always included).
    cow_events: one row per copy-on-write copy: step, request, seq_id, src_block, dst_block.
    requests: one row per prompt: request_id, prompt_len, output_tokens (sum over its outputs), preemptions,
        cached_tokens (prompt tokens served from the prefix cache).
    num_blocks, block_size: the pool's geometry. wall_s: duration of the call in seconds.
    """

    steps: pd.DataFrame
    snapshots: list[EngineSnapshot]
    cow_events: pd.DataFrame
    requests: pd.DataFrame
    num_blocks: int
    block_size: int
    wall_s: float

    def sharing_saving(self) -> float:
        """Memory saved by sharing over the run: the mean over steps of 1 - blocks_in_use / blocks_without_sharing
        (steps holding no block excluded); 0.0 when no step held a block."""
        return sharing_saving(self.steps)


def sharing_saving(steps: pd.DataFrame) -> float:
    """Mean over the steps with blocks_without_sharing > 0 of 1 - blocks_in_use / blocks_without_sharing."""
    held = steps[steps["blocks_without_sharing"] > 0]
    if held.empty:
        return 0.0
    return float((1.0 - held["blocks_in_use"] / held["blocks_without_sharing"]).mean())


@dataclass(eq=False)
class StepRecorder:
    """Rows accumulated during a run, and the snapshot sampling (every `stride` steps, stride doubling to keep at
    most `max_snapshots`)."""

    max_snapshots: int = 100
    rows: list = field(default_factory=list)
    snapshots: list = field(default_factory=list)
    cow_events: list = field(default_factory=list)
    stride: int = 1

    def add(self, row: dict) -> None:
        self.rows.append(row)

    def maybe_snapshot(self, step: int, blocks_fn, force: bool = False) -> None:
        if step % self.stride and not force:
            return
        if self.snapshots and self.snapshots[-1].step == step:
            return
        self.snapshots.append(blocks_fn(step))
        if len(self.snapshots) > self.max_snapshots:
            self.stride *= 2
            last = self.snapshots[-1]
            self.snapshots = [s for s in self.snapshots if s.step % self.stride == 0 or s is last]

    def steps_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.rows, columns=list(STEP_COLUMNS))
        ints = [c for c in STEP_COLUMNS if c not in _FLOAT_COLUMNS]
        return frame.astype(dict.fromkeys(ints, np.int64) | dict.fromkeys(_FLOAT_COLUMNS, np.float64))

    def cow_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            self.cow_events, columns=["step", "request", "seq_id", "src_block", "dst_block"]
        ).astype(np.int64)
