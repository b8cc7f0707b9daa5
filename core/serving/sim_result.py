"""What a simulation returns: `SimulationResult` (per-step rows, per-request rows, the summary, sampled
`StepSnapshot`s, `core.sched.snapshots`'s, the engine's too) and `summarize`, the Figure 2 breakdown and serving metrics over a window of steps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.sched.snapshots import StepSnapshot
from core.serving.latency import latency_summary
from core.serving.memory_policies import Policy
from core.serving.sim_config import SimulatorConfig


@dataclass(eq=False)
class SimulationResult:
    """steps: one row per step, columns `COLUMNS` (slots are KV token positions; `time_s` is the end of the step;
    `free_blocks` is the free-list size: free blocks for paged, free buddy blocks for contiguous;
    `external_fragmentation` is the allocator slack, real fragmentation only, and `free_slots` the free memory:
    token_states + reservation + internal_fragmentation + external_fragmentation + free_slots == capacity).
    requests: one row per request (arrival_time, admit_time (first admission by the scheduler), first_token_time,
    finish_time in seconds; lengths in tokens; prefix_hit_tokens: prompt tokens the prefix cache served at
    its first admission).
    summary: see `summarize`. snapshots: sampled `StepSnapshot`s in step order. capacity_slots: the slots the
    memory columns sum to (the KV capacity; for a hybrid policy, group slots, see `core.serving.paged_memory`)."""

    policy: Policy
    config: SimulatorConfig
    steps: pd.DataFrame
    requests: pd.DataFrame
    summary: dict
    snapshots: list[StepSnapshot]
    wall_s: float
    capacity_slots: int | None = None

    def summarize(self, t_start: float | None = None, t_end: float | None = None) -> dict:
        capacity = self.capacity_slots or self.config.kv_capacity_tokens
        return summarize(self.steps, self.requests, capacity, t_start, t_end)


def summarize(
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    capacity: int,
    t_start: float | None = None,
    t_end: float | None = None,
) -> dict:
    """Figure 2 breakdown and serving metrics over the steps that end in [t_start, t_end] (default: all).

    The five `*_pct` are shares of the whole KV capacity averaged over time (each step weighted by its duration)
    and sum to 100: token states, reservation, internal fragmentation, external fragmentation (allocator slack
    only: slots no request can use although they are not free, e.g. a buddy allocator's rounding; a paged pool's
    is capacity % block_size) and free (slots nobody holds: memory a fuller load would use, not waste). The
    paper's Figure 2 "external fragmentation & others" is external_fragmentation_pct + free_pct (its runs were
    memory-bound, so its free share was small). avg_batched_requests: mean requests in the batch per step. throughput: generated
    tokens / simulated seconds. mean_normalized_latency_s: mean over finished requests of (finish - arrival) /
    output_len, seconds per token. preemptions: preemption events in the window.
    Latency under load over the finished requests (`core.serving.latency.latency_summary`): ttft / tpot / e2e /
    queue at p50, p90, p95, p99 (`ttft_p95_s`, ...) and their means, output_throughput_tokens_per_s and
    request_throughput_per_s over the requests' span (first arrival to last finish: what a client measures,
    unlike throughput_tokens_per_s, which is over the busy time of the window's steps).
    """
    sel = steps
    if t_start is not None:
        sel = sel[sel["time_s"] >= t_start]
    if t_end is not None:
        sel = sel[sel["time_s"] <= t_end]
    out: dict = {"num_steps": len(sel)}
    if len(sel) == 0:
        return out | {
            "token_states_pct": 0.0,
            "reservation_pct": 0.0,
            "internal_fragmentation_pct": 0.0,
            "external_fragmentation_pct": 0.0,
            "free_pct": 100.0,
            "avg_batched_requests": 0.0,
            "preemptions": 0,
        }
    weight = sel["step_time_ms"].to_numpy()
    total = weight.sum() * capacity

    def share(values) -> float:
        return float(100.0 * (np.asarray(values, dtype=np.float64) * weight).sum() / total)

    out["token_states_pct"] = share(sel["token_states"])
    out["reservation_pct"] = share(sel["reservation"])
    out["internal_fragmentation_pct"] = share(sel["internal_fragmentation"])
    out["external_fragmentation_pct"] = share(sel["allocator_slack"])
    out["free_pct"] = share(sel["free_slots"])
    out["avg_batched_requests"] = float(sel["running"].mean())
    out["avg_batched_seqs"] = float(sel["running_seqs"].mean())
    out["preemptions"] = int(sel["preemptions"].sum())
    duration = float(weight.sum() / 1000.0)
    out["duration_s"] = duration
    generated = float(sel["tokens_generated"].sum())
    out["tokens_generated"] = int(generated)
    out["throughput_tokens_per_s"] = generated / duration if duration > 0 else 0.0
    out["mean_step_time_ms"] = float(weight.mean())
    done = requests.dropna(subset=["finish_time"])
    if t_start is not None:
        done = done[done["finish_time"] >= t_start]
    if t_end is not None:
        done = done[done["finish_time"] <= t_end]
    out["requests_finished"] = len(done)
    if len(done):
        latency = done["finish_time"] - done["arrival_time"]
        out["requests_per_s"] = len(done) / duration if duration > 0 else 0.0
        out["mean_latency_s"] = float(latency.mean())
        out["mean_normalized_latency_s"] = float((latency / done["output_len"]).mean())
        out["mean_ttft_s"] = float((done["first_token_time"] - done["arrival_time"]).mean())
        out |= latency_summary(done)
    queries = float(sel["prefill_tokens"].sum() + sel["prefix_hit_tokens"].sum())
    out["prefix_hit_tokens"] = int(sel["prefix_hit_tokens"].sum())
    out["prefix_hit_rate"] = float(sel["prefix_hit_tokens"].sum() / queries) if queries else 0.0
    return out
