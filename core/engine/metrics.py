"""What the engine records per step: the serving simulator's columns measured on a real run, plus sharing.

`STEP_COLUMNS` = the simulator's `COLUMNS` (same names and meanings, in KV token slots of the pool; `time_s` and
`step_time_ms` are wall-clock here, `swapped` and `allocator_slack` are always 0: the engine preempts by
recompute and its capacity is whole blocks) followed by:
    shared_blocks           blocks held by more than one sequence (ref count > 1) after the step;
    cow_copies              copy-on-write block copies made this step;
    attention_ms            milliseconds in the paged attention kernels this step (all layers);
    blocks_in_use           blocks held by live sequences after the step (num_blocks - free_blocks);
    blocks_without_sharing  blocks the same live sequences would hold if nothing were shared (sum of their
                            block-table lengths);
    rest_of_model_ms        milliseconds of the forward pass outside attention (embedding, norms, projections,
                            RoPE, K/V writes, MLP, LM head);
    host_ms                 milliseconds of the step outside the forward pass: scheduling, block allocation,
                            building the batch and block tables, sampling, postprocessing, these metrics.
Per step, step_time_ms = attention_ms + rest_of_model_ms + host_ms (the whole `Engine.step`, wall clock, the
snapshot excepted). One-time costs (building the C attention kernel, first-call dispatch) are paid by a warm-up
forward pass when the engine is built (`Engine.warmup_ms`), so the first step's time is a real step's.
"""

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.sched.snapshots import SnapshotSampler, StepSnapshot, take_snapshot
from core.sched.step_columns import COLUMNS, StepMeasures, StepRows

ENGINE_COLUMNS = (
    "shared_blocks",
    "cow_copies",
    "attention_ms",
    "blocks_in_use",
    "blocks_without_sharing",
    "rest_of_model_ms",
    "host_ms",
)
STEP_COLUMNS = (*COLUMNS, *ENGINE_COLUMNS)
REQUEST_COLUMNS = ("request_id", "prompt_len", "output_tokens", "preemptions", "cached_tokens")
# wall-clock columns: they change from run to run, everything else is a pure function of the requests
TIMED_COLUMNS = ("time_s", "step_time_ms", "attention_ms", "rest_of_model_ms", "host_ms")


@dataclass(eq=False)
class EngineRun:
    """Everything recorded by the last `Engine.generate` call.

    steps: one row per step, columns `STEP_COLUMNS` (see the module docstring).
    snapshots: `core.sched.snapshots.StepSnapshot`s (the simulator's type: `pool`, the KV cache manager's
        `KVCacheSnapshot` whose holders are the live sequences; `holder_request`, the request (prompt index in a
        `generate` call) of each) at evenly spaced steps (at most `max_snapshots`, the last step included).
    cow_events: one row per copy-on-write copy: step, request, seq_id, src_block, dst_block.
    requests: one row per prompt: request_id, prompt_len, output_tokens (sum over its outputs), preemptions,
        cached_tokens (prompt tokens served from the prefix cache).
    num_blocks, block_size: the pool's geometry. wall_s: duration of the call in seconds.
    """

    steps: pd.DataFrame
    snapshots: list[StepSnapshot]
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
    """Rows accumulated during a run, and the snapshots (`sampler`: `core.sched.snapshots.SnapshotSampler`, the
    simulator's too, keeping at most `max_snapshots`). rows: the `STEP_COLUMNS` step rows
    (`core.sched.step_columns.StepRows`, the simulator's too); requests: one REQUEST_COLUMNS row per finished request, in the order they finished;
    started: the run's start (`time.perf_counter()`); preemptions_base: the scheduler's preemption count then."""

    max_snapshots: int = 100
    rows: StepRows = field(default_factory=lambda: StepRows(STEP_COLUMNS, TIMED_COLUMNS))
    cow_events: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    preemptions_base: int = 0

    def __post_init__(self):
        self.sampler = SnapshotSampler(self.max_snapshots)

    def steps_frame(self) -> pd.DataFrame:
        return self.rows.frame()

    def run(self, num_blocks: int, block_size: int) -> "EngineRun":
        """The `EngineRun` of every step recorded so far (wall time: from `started` to now)."""
        return EngineRun(
            self.steps_frame(),
            list(self.sampler.snapshots),
            self.cow_frame(),
            pd.DataFrame(self.requests, columns=list(REQUEST_COLUMNS)),
            num_blocks,
            block_size,
            time.perf_counter() - self.started,
        )

    def cow_frame(self) -> pd.DataFrame:
        """One row per copy; `request` is int64 when every request id is an int (ids given as strings stay)."""
        frame = pd.DataFrame(self.cow_events, columns=["step", "request", "seq_id", "src_block", "dst_block"])
        ints = ["step", "seq_id", "src_block", "dst_block"]
        if all(isinstance(r, int) for r in frame["request"]):
            ints.append("request")
        return frame.astype(dict.fromkeys(ints, np.int64))


class StepObserver:
    """The engine's `core.sched.driver.StepObserver`: records each step once the scheduler postprocessed it (an
    empty one too: one row per `Engine.step` that ran the driver): the step's row, its copy-on-write events, the
    requests that finished and the snapshots (`core.sched.snapshots.take_snapshot`), into `recorder` (a
    `StepRecorder`, replaced by `Engine.reset_metrics`). It reads the memory, the scheduler and the runner and writes none of them (the
    memory's copy-on-write log is drained here: a log, not KV memory). step_started: when the step being run
    began (`time.perf_counter()`, set by `Engine.step` before the driver runs)."""

    def __init__(self, memory, scheduler, runner, recorder: StepRecorder):
        self.memory = memory
        self.scheduler = scheduler
        self.runner = runner
        self.recorder = recorder
        self.step_started = time.perf_counter()

    def on_step(self, scheduled, outcome, outputs: list) -> None:
        """Record the step that began at `step_started` and returned `outputs`."""
        rec, mem, runner, started = self.recorder, self.memory, self.runner, self.step_started
        step = rec.rows.size
        rec.cow_events += [(step, *event) for event in mem.cow_log]
        cows = len(mem.cow_log)
        mem.cow_log.clear()
        for out in outputs:
            if out.finished:
                generated = sum(len(c.token_ids) for c in out.outputs)
                prompt_len = len(out.prompt_token_ids)
                rec.requests.append(
                    (out.request_id, prompt_len, generated, out.num_preemptions, out.num_cached_tokens)
                )
        usage = mem.usage(mem.live_seqs())
        now = time.perf_counter()
        step_ms, forward_ms, attention_ms = (
            (now - started) * 1e3,
            runner.last_forward_ms,
            runner.last_attention_ms,
        )
        measured = StepMeasures(
            step, now - rec.started, step_ms, self.scheduler.num_preemptions - rec.preemptions_base
        )
        extra = (
            usage["shared_blocks"],
            cows,
            attention_ms,
            usage["blocks_in_use"],
            usage["blocks_without_sharing"],
            forward_ms - attention_ms,
            step_ms - forward_ms,
        )  # ENGINE_COLUMNS
        rec.rows.record(scheduled, outcome, mem.metrics(usage), measured, extra)
        running = self.scheduler.running
        rec.sampler.sample(
            step,
            lambda: take_snapshot(step, measured.time_s, running, mem),
            force=not self.scheduler.has_unfinished,  # the run's last step
        )
