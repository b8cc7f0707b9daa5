"""Replay a serving workload through the continuous-batching `Scheduler` under a paged or a contiguous KV policy,
on a simulated clock, and record step by step where the KV memory goes.

The scheduling rules are `core.sched.scheduler`'s (FCFS admission with a watermark, chunked prefill within
`max_num_batched_tokens`, newest-first preemption by recompute or swap). The simulator owns what the scheduler
leaves to its caller: arrivals (a request joins the waiting queue once the clock reaches its arrival time), the
step cost (`SimulatorConfig.step_time`, the roofline `StepTimeModel` or anything with its `step_seconds` /
`step_time` / `kv_bytes_per_token` / `swap_bandwidth`), the clock, and one recorded row per step. Each step goes
through `core.sched.driver.run_step`, the engine's driver too: `_Simulation` is its executor (a step's execution
is its modeled cost on the clock), `_SimRecord` its observer (`core.serving.sim_record`: rows in
`core.sched.step_columns.StepRows`).

Steps in which nothing but decoding happens are replayed in one batch (`Scheduler.allocate(step, k)`: identical
bookkeeping, recorded per step from `MemoryPolicy.decode_metrics`), which is what makes 10,000-request runs take
seconds; the paged policy still appends every token of every sequence to its `core.kv` manager.
"""

import heapq
import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from core.common import check_int
from core.errors import InvalidArgumentError, SchedulerStuckError
from core.sched import (
    COLUMNS,
    MemoryMetrics,
    ScheduledStep,
    Scheduler,
    StepOutcome,
    driver,
)
from core.sched.step_load import decode_starts
from core.serving.memory_policies import MemoryPolicy, Policy, make_memory
from core.serving.sim_config import PAPER_KV_TOKENS, SimulatorConfig
from core.serving.sim_groups import GroupMaker, SimulatedGroup
from core.serving.sim_record import _SimRecord
from core.serving.sim_result import SimulationResult, StepSnapshot, summarize
from core.serving.workload import Request

__all__ = ["COLUMNS", "PAPER_KV_TOKENS", "SimulationResult", "SimulatorConfig", "StepSnapshot", "simulate"]

MAX_BATCHED_DECODE_STEPS = 8192  # decode-only steps replayed at once, at most


def fitting_steps(ahead, queued: bool = False) -> int:
    """Leading steps (at least 1) of a `MemoryPolicy.decode_metrics` prediction that may run as one batch: their
    free blocks stay >= 0, and, when groups are `queued` (waiting or swapped), stay at most the free blocks after
    the first step, so no queued group could have been admitted in between (a sliding window frees blocks as it
    moves: free blocks need not fall monotonically)."""
    free = ahead.free_blocks
    fits = free >= 0
    if queued:
        fits &= free <= free[0]
    return max(1, len(fits) if fits.all() else int(fits.argmin()))


def _validate_requests(requests: Sequence[Request], config: SimulatorConfig) -> list[Request]:
    if len(requests) == 0:
        raise InvalidArgumentError("the workload has no requests")
    for req in requests:
        if not isinstance(req, Request):
            raise InvalidArgumentError(
                f"requests must be core.serving.workload.Request objects, got {type(req)}"
            )
        if req.prompt_len + req.output_len > config.max_seq_len:
            raise InvalidArgumentError(
                f"request {req.request_id}: prompt {req.prompt_len} + output {req.output_len} tokens exceeds "
                f"max_seq_len {config.max_seq_len}"
            )
        if req.n > config.max_num_seqs or req.n > 1024:
            raise InvalidArgumentError(
                f"request {req.request_id}: n={req.n} parallel samples exceeds max_num_seqs "
                f"{config.max_num_seqs} (or 1,024)"
            )
    return sorted(requests, key=lambda r: r.arrival_time)


class _Priced(NamedTuple):
    """A step (or a decode-only batch of k identical steps) as the simulator ran it: start, the clock before it;
    end, after it; end_times / dts: float64 [k], each step's end and seconds; ahead: the memory policy's
    predicted metrics of a batch (k > 1), else None; reads: a batch's kv_tokens_read [k] (each step's
    `core.sched.step_load` count), else None. A single step's dts is the one-tuple (seconds,) and its end_times
    None (its end is `end`). step_ms: a batch's recorded step_time_ms [k] when not dts x 1000 (`_own_cut`)."""

    start: float
    end: float
    end_times: np.ndarray | None
    dts: np.ndarray | tuple[float]
    ahead: MemoryMetrics | None
    reads: np.ndarray | None = None
    step_ms: np.ndarray | None = None


class _Simulation:
    """The clock and the arrivals around one `Scheduler` run, and its executor for `core.sched.driver.run_step`:
    a step's execution is its modeled cost on the clock (`SimulatorConfig.step_time`). `record` (`_SimRecord`)
    is the run's observer: its rows and snapshots."""

    def __init__(
        self,
        groups: list[SimulatedGroup],
        memory: MemoryPolicy,
        config: SimulatorConfig,
        concurrency: int | None = None,
    ):
        self.groups = groups
        self.memory = memory
        self.config = config
        self.model = config.step_time
        # a step-time model that prices the step's parts (speculative decoding), looked up once, not per step
        self._price_load = getattr(self.model, "step_load_seconds", None)
        self.scheduler = Scheduler(
            memory,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.preemption_mode,
            config.swap_capacity_blocks(memory.block_size),
        )
        self.arrivals = np.array([g.request.arrival_time for g in groups], dtype=np.float64)
        self.closed_loop = concurrency is not None
        if self.closed_loop:  # C clients: the first C at 0, each later one when an earlier request finishes
            self.arrivals[:concurrency] = 0.0
            self.arrivals[concurrency:] = np.inf
        self.next_closed = concurrency or 0  # closed loop: the next request a finish sends
        self.record = _SimRecord(self)
        self.now = 0.0
        self.arrived = 0
        self.finished = 0
        self.until = len(groups)  # stop once the first `until` groups (arrival order) have finished
        self.finished_first = 0  # how many of those have
        # plan -> execute: a decode-only batch's (predicted metrics, dts, keys read, end times and step_ms or None)
        self._planned: tuple = (None, None, None, None, None)
        # the keys a step reads are asked through the memory's window rule (`core.sched.step_load`)
        self._windowed = getattr(memory, "windowed", False)
        self._loads: list[
            tuple[float, int, SimulatedGroup]
        ] = []  # host-tier loads in flight: (done, index, group)
        self._link_free = 0.0  # when the host link finishes its queued loads
        # a fleet's replica (`core.serving.fleet`): any arrival may be routed here, so a decode-only batch
        # always ends at the next one, queue or not (alone, a queued request is admitted by memory, not time)
        self.cut_every_arrival = False
        # a replica of a fleet that routes the j-th arrival to replica j % N (`core.serving.fleet`): (its index,
        # N). Its decode-only batch then runs on past the arrivals routed elsewhere (`_own_cut`)
        self.round_robin: tuple[int, int] | None = None

    @property
    def step(self) -> int:
        """Steps run so far (the index of the next one): the rows recorded."""
        return self.record.rows.size

    def admit_arrivals(self) -> bool:
        """Queue the groups that arrived by now; when nothing is queued or running, jump the clock to the next
        arrival and return False."""
        total = len(self.groups)
        while self.arrived < total and self.arrivals[self.arrived] <= self.now:
            self.scheduler.add(self.groups[self.arrived])
            self.arrived += 1
        self._release_loads()
        if not self.scheduler.has_unfinished:
            self.now = float(self.arrivals[self.arrived])
            return False
        return True

    def _release_loads(self) -> None:
        """Host-tier loads done by now: their groups may prefill from the next step on."""
        while self._loads and self._loads[0][0] <= self.now:
            self.scheduler.loaded(heapq.heappop(self._loads)[2])

    # ---- the executor (`core.sched.driver.StepExecutor`) -----------------------------------------------------

    def stuck_error(self, step: ScheduledStep) -> Exception:
        return SchedulerStuckError.nothing_fits(step.num_waiting, step=self.step)

    def plan(self, step: ScheduledStep) -> int:
        """Stamp the admissions' time; a decode-only step may stand for k identical ones (`_decode_run`)."""
        self._planned = (None, None, None, None, None)
        for group, tokens in step.loads:  # queued on the host link; the group prefills once it is done
            if math.isnan(group.admit_time):  # a preempted group's reload costs the link, not its first hits
                group.admit_time = self.now
                group.prefix_hit_tokens = group.prompt_len - group.num_prefill_total
                group.host_hit_tokens = tokens
            start = max(self.now, self._link_free)
            self._link_free = start + tokens * self.model.kv_bytes_per_token / self.memory.host_bandwidth
            heapq.heappush(self._loads, (self._link_free, group.index, group))
        for group, start, _ in step.prefill_chunks:
            if start == 0 and math.isnan(group.admit_time):
                group.admit_time = self.now  # admitted at the start of this step
                group.prefix_hit_tokens = group.prompt_len - group.num_prefill_total  # what the cache served
        if not step.is_decode_only:
            return 1
        k, *planned = self._decode_run(step)
        self._planned = tuple(planned)
        return k

    def execute(self, step: ScheduledStep) -> _Priced | None:
        """The step's modeled time (None for an empty step: nothing ran, the clock stands)."""
        if step.is_empty:  # it preempted or swapped in: memory moved, the next step may run
            if not (step.preempted or step.swapped_in) and self._loads:  # only loads in flight: wait for one
                self.now = max(
                    self.now,
                    min(
                        self._loads[0][0],
                        float(self.arrivals[self.arrived]) if self.arrived < len(self.groups) else math.inf,
                    ),
                )
                self._release_loads()
            return None
        ahead, dts, reads, end_times, step_ms = self._planned
        if dts is None:  # one step: plain floats (no arrays to build for each of the run's many single steps)
            dt = float(self._step_seconds(step))
            return _Priced(self.now, self.now + dt, None, (dt,), ahead)
        if end_times is None:
            end_times = self.now + np.cumsum(dts)
        return _Priced(self.now, float(end_times[-1]), end_times, dts, ahead, reads, step_ms)

    def finish(self, step: ScheduledStep, outcome: StepOutcome, priced: _Priced | None) -> _Priced | None:
        """Stamp first tokens and finishes, send the closed loop's next requests, move the clock to the end."""
        if priced is None:
            return None
        end = priced.end
        for group in outcome.first_token:
            if math.isnan(group.first_token_time):
                group.first_token_time = end
        for group in outcome.finished:
            group.finish_time = end
            self.finished_first += group.index < self.until
        if self.closed_loop:
            self._send_next(len(outcome.finished), end)
        self.finished += len(outcome.finished)
        self.now = end
        self._release_loads()
        return priced

    def _send_next(self, count: int, now: float) -> None:
        """Closed loop: each of `count` clients whose request just finished sends its next one at `now`."""
        stop = min(self.next_closed + count, len(self.groups))
        self.arrivals[self.next_closed : stop] = now
        self.next_closed = stop

    def _decode_run(self, step: ScheduledStep):
        """How many identical decode-only steps run at once: until a group finishes, the next snapshot step,
        the memory runs out or (with empty queues) a request arrives. Returns (k, predicted metrics, step times,
        keys read: each step's `core.sched.step_load` kv_tokens_read, the window rule asked through the memory)."""
        k = min(g.output_len - g.num_output_tokens for g in step.decoding)
        record = self.record
        stride = record.sampler.stride  # a batch ends on the next row due for a snapshot
        k = min(k, (-record.rows.size) % stride + 1)  # rows.size: self.step
        capped = k > MAX_BATCHED_DECODE_STEPS
        k = min(k, MAX_BATCHED_DECODE_STEPS)
        if k == 1:
            return 1, None, None, None, None, None
        queued = bool(step.num_waiting or step.num_swapped)
        if self.round_robin is not None:  # timed first: the memory is then predicted for the batch only
            return self._own_run(step, k, capped, queued)
        ahead = self.memory.decode_metrics(step.decoding, k)
        fit = fitting_steps(ahead, queued)
        k = min(k, fit)
        if k == 1:
            return 1, None, None, None, None, None
        reads, dts = self._decode_times(step, k)
        quiet = self.cut_every_arrival or not (step.num_waiting or step.num_swapped)
        if quiet and self.arrived < len(self.groups):
            ends = self.now + np.cumsum(dts)
            k = min(k, int(np.searchsorted(ends, self.arrivals[self.arrived], side="left")) + 1)
            dts, reads = dts[:k], reads[:k]
        if self._loads:  # a host-tier load ends: its prefill joins the next step
            ends = self.now + np.cumsum(dts)
            k = min(k, int(np.searchsorted(ends, self._loads[0][0], side="left")) + 1)
            dts, reads = dts[:k], reads[:k]
        return k, ahead, dts, reads, None, None

    def _decode_times(self, step: ScheduledStep, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys read, seconds) of the next k decode-only steps of `step`."""
        n_decode = step.num_decode_tokens
        ctx = step.decode_context_tokens
        j = np.arange(k, dtype=np.float64)
        if self._windowed:
            reads = self.memory.num_keys_read(decode_starts(step) + np.arange(k, dtype=np.int64)[:, None])
        else:
            reads = ctx + j * n_decode
        return reads, self.model.step_time(n_decode, reads, ctx + (j + 1) * n_decode)

    def _own_run(self, step: ScheduledStep, k: int, capped: bool, queued: bool):
        """`_decode_run` of a round-robin replica (`_own_cut`). The steps' times do not depend on the memory, so
        the batch is cut at the arrivals first and the memory predicted for its steps only (the k-step
        prediction of fewer steps is the same prefix: nothing but decodes run, free blocks only fall)."""
        reads, dts = self._decode_times(step, k)
        k, end_times, step_ms = self._own_cut(dts, capped)
        ahead = self.memory.decode_metrics(step.decoding, k)
        fit = fitting_steps(ahead, queued)
        if fit < k:  # the memory runs out first: the batch ends there, a limit of every segment
            if fit == 1:
                return 1, None, None, None, None, None
            k, end_times, step_ms = self._own_cut(dts[:fit], False)
        return k, ahead, dts[:k], reads[:k], end_times, step_ms

    def _own_cut(self, dts: np.ndarray, capped: bool) -> tuple[int, np.ndarray, np.ndarray]:
        """A round-robin replica's decode-only batch (`round_robin`): its length (the steps up to the one that
        spans an arrival routed here), the steps' end times and their recorded step_time_ms. The batches the
        replica would run if it cut at every arrival (`cut_every_arrival`) are its segments, each cut at the
        step that spans the first arrival after its start and timed from that start (start + the cumulative sum
        of its steps' seconds; a segment of one step is recorded as a single step, end - start), so every
        row is the same to the last bit; nothing else changes at an arrival routed elsewhere (the replica's
        queue, memory and steps are its own, and routing by turn reads no replica). `capped`: the batch was cut
        to MAX_BATCHED_DECODE_STEPS (a segment's own limit): it then ends where its last segment starts."""
        arrivals = self.arrivals
        total = len(arrivals)
        me, replicas = self.round_robin
        k = len(dts)
        ms = dts * 1000.0
        pieces = []  # each segment's end times
        pos, start = 0, self.now
        while pos < k:
            nxt = int(np.searchsorted(arrivals, start, side="right"))  # the first arrival after the start
            segment = start + np.cumsum(dts[pos : min(k, pos + MAX_BATCHED_DECODE_STEPS)])
            cut, spans = len(segment), False
            if nxt < total:  # the first step that ends at or after it spans it
                first = int(np.searchsorted(segment, arrivals[nxt], side="left"))
                if first < cut:
                    cut, spans = first + 1, True
            if capped and pos and pos + cut == k and cut < MAX_BATCHED_DECODE_STEPS and not spans:
                break  # cut short by the cap, not by its own limits: the batch ends where this segment starts
            pieces.append(segment[:cut])
            if cut == 1:  # a batch of one step is recorded as a single step: end - start
                ms[pos] = (float(segment[0]) - start) * 1000.0
            pos += cut
            start = float(segment[cut - 1])
            if spans:  # the arrivals up to its end are routed before the replica's next step
                after = int(np.searchsorted(arrivals, start, side="right"))
                if after - nxt >= replicas or any(j % replicas == me for j in range(nxt, after)):
                    break  # one is routed here: it joins the next step
        ends = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return pos, ends, ms[:pos]

    def _swap_bytes(self, step: ScheduledStep) -> float:
        blocks = step.swap_out_blocks + step.swap_in_blocks
        return blocks * self.memory.block_size * self.model.kv_bytes_per_token

    def _step_seconds(self, step: ScheduledStep) -> float:
        """The cost of one step (its `core.sched.step_load`, `step.load`: decodes attend to their context, each
        prefill chunk to its prior context and causally to itself); a step that only swaps in costs the transfer."""
        load = step.load
        swap_bytes = self._swap_bytes(step)
        if self._price_load is not None:  # a cost that needs the step's parts (speculative decoding)
            return self._price_load(load, swap_bytes)
        dt = self.model.step_seconds(
            load.new_tokens,
            load.kv_tokens_read,
            load.attention_pairs,
            swap_bytes,
            output_tokens=load.output_tokens,
        )
        if dt == 0.0:  # only a swap-in: the transfer alone
            dt = swap_bytes / self.model.swap_bandwidth
        return dt

    def requests_frame(self) -> pd.DataFrame:
        groups = self.groups
        return pd.DataFrame(
            {
                "request_id": [g.request_id for g in groups],
                "arrival_time": self.arrivals,
                "admit_time": [g.admit_time for g in groups],
                "first_token_time": [g.first_token_time for g in groups],
                "finish_time": [g.finish_time for g in groups],
                "prompt_len": [g.prompt_len for g in groups],
                "output_len": [g.output_len for g in groups],
                "n": [g.num_seqs for g in groups],
                "preemptions": [g.num_preemptions for g in groups],
                "prefix_hit_tokens": [g.prefix_hit_tokens for g in groups],
                "host_hit_tokens": [g.host_hit_tokens for g in groups],
            }
        )


def attach_offload(memory: MemoryPolicy, policy: Policy, config: SimulatorConfig) -> None:
    """Put `config.offload`'s host KV tier behind `memory` (nothing without one). Raises InvalidArgumentError
    unless the policy is paged with prefix caching and block tables."""
    if config.offload is None:
        return
    if not (policy.is_paged and policy.enable_prefix_caching and not policy.counted):
        raise InvalidArgumentError("a host KV tier needs the paged policy with prefix caching")
    memory.attach_host_tier(config.offload)


def simulate(
    requests: Sequence[Request],
    policy: Policy,
    config: SimulatorConfig,
    progress: Callable[[float], None] | None = None,
    until_finished: int | None = None,
    concurrency: int | None = None,
) -> SimulationResult:
    """Run the workload under `policy` with `config` (its step_time prices each step); deterministic for given
    requests.

    until_finished: stop once the first `until_finished` requests in arrival order have finished (the later ones
    still arrive on time and load the system, so the first ones are measured under a load that does not drain;
    requests unfinished at the stop have NaN finish_time). None: run every request to completion.
    concurrency: a closed loop of that many clients (`vllm bench serve --max-concurrency` at an unbounded rate):
    the requests' arrival times are ignored; the first `concurrency` requests arrive at 0 and each later one the
    moment an earlier one finishes (its recorded arrival_time). None: the requests arrive at their times.
    progress(fraction) is called with the fraction of those requests finished (at most ~100 times, last 1.0).
    Raises InvalidArgumentError for a request that can never run (longer than max_seq_len, or larger than the
    cache alone) or a bad config.
    """
    started = time.perf_counter()
    sim = start_simulation(requests, policy, config, concurrency)[0]
    if until_finished is not None:
        sim.until = check_int(until_finished, "until_finished", minimum=1, maximum=len(sim.groups))
    advance(sim, progress)
    return simulation_result(sim, policy, time.perf_counter() - started)


def check_types(policy: Policy, config: SimulatorConfig) -> None:
    """Raise InvalidArgumentError unless `policy` and `config` are a Policy and a SimulatorConfig."""
    if not isinstance(config, SimulatorConfig):
        raise InvalidArgumentError(f"config must be a core.serving.simulator.SimulatorConfig, got {config!r}")
    if not isinstance(policy, Policy):
        raise InvalidArgumentError(f"policy must be a core.serving.memory_policies.Policy, got {policy!r}")


def start_simulation(
    requests: Sequence[Request], policy: Policy, config: SimulatorConfig, concurrency: int | None = None
) -> tuple[_Simulation, GroupMaker]:
    """`simulate`'s run before its first step (every request checked, until: all of them), and the maker of its
    groups (`GroupMaker`, which later requests continue: `core.serving.resume`)."""
    check_types(policy, config)
    reqs = _validate_requests(requests, config)
    capacity = int(config.kv_capacity_tokens)
    memory = make_memory(policy, capacity, config.watermark, config.max_seq_len)
    attach_offload(memory, policy, config)
    maker = GroupMaker(policy.is_paged and not policy.counted)
    groups = maker.make(reqs)
    for group in groups:
        memory.check_fits(group, group.output_len)
    if concurrency is not None:
        concurrency = check_int(concurrency, "concurrency (clients)", minimum=1, maximum=len(groups))
    return _Simulation(groups, memory, config, concurrency), maker


def advance(sim: _Simulation, progress: Callable[[float], None] | None = None) -> None:
    """Run `sim` until the first `sim.until` groups (arrival order) have finished; progress as `simulate`'s."""
    total = sim.until
    next_report = 1  # percent
    while sim.finished_first < total:
        if not sim.admit_arrivals():
            continue
        driver.run_step(sim.scheduler, sim, sim.record)  # one step, or a batch of decode-only ones
        if progress is not None and sim.finished_first * 100 >= next_report * total:
            progress(sim.finished_first / total)
            next_report = sim.finished_first * 100 // total + 1
    if progress is not None:
        progress(1.0)


def simulation_result(sim: _Simulation, policy: Policy, wall: float) -> SimulationResult:
    """The result of `sim` as it stands (its frames built anew: a later `advance` changes none of them)."""
    steps_frame = sim.record.rows.frame()
    requests_frame = sim.requests_frame()
    capacity = sim.memory.capacity
    summary = summarize(steps_frame, requests_frame, capacity)
    snapshots = list(sim.record.snapshots)
    return SimulationResult(
        policy, sim.config, steps_frame, requests_frame, summary, snapshots, wall, capacity
    )
