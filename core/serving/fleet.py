"""A fleet: N replicas of one engine, each its own `Scheduler` over its own KV core, behind a router
(`core.serving.router`) that sends every arriving request to one of them.

`simulate_fleet` runs the replicas on one simulated timeline, as discrete events in time order: the next thing to
happen is either the next arrival (routed, then queued at its replica) or the step of the busy replica whose clock
is furthest behind (each replica's steps are `core.serving.simulator`'s, through `core.sched.driver.run_step`). A
replica's decode-only batch always ends at the next arrival, whatever its queue, since that arrival may be routed
to it; under round-robin routing (the j-th arrival to replica j % N, N > 1) with one full-attention pool and no
host tier, it ends only at the next arrival routed to it, its rows the same to the last bit
(`_Simulation._own_cut`: the batch is timed as the batches cut at every arrival would be).

Invariants:
- Every replica has its own memory policy (`make_memory`: its own block pool and prefix cache); nothing is shared
  between replicas but the arrival times and the request objects, each run by exactly one replica.
- A request is routed when every busy replica's clock has reached its arrival: the router sees each replica as it
  stands at the end of its step that spans the arrival (what its KV events would have told a router by then,
  give or take one step), and the request joins that replica's queue for its next step.
- One replica (N = 1) under any policy schedules exactly what `core.serving.simulator.simulate` schedules, but
  for decode-only batches cut at every arrival (the same steps, recorded as more rows).
- The result's `requests` frame is every request in arrival order with the replica that ran it (`replica`, -1
  for requests that arrived after the run stopped), and its `steps` every replica's step rows merged in time
  order with a `replica` column; `replica_results[r]` is replica r's own result.
"""

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.common import check_int
from core.errors import InvalidArgumentError, RoutingError
from core.kv.block_hash import extend_block_hashes
from core.sched import driver
from core.serving.memory_policies import Policy, make_memory
from core.serving.router import DEFAULT_ROUTING, PROMPT_KEYED, PrefixHistory, Router, check_routing
from core.serving.sim_config import SimulatorConfig
from core.serving.sim_groups import GroupMaker
from core.serving.sim_result import SimulationResult, summarize
from core.serving.simulator import _Simulation, _validate_requests, attach_offload, check_types
from core.serving.workload import Request

__all__ = ["Fleet", "FleetResult", "replica_breakdown", "simulate_fleet"]


@dataclass(frozen=True)
class Fleet:
    """`replicas` copies of one engine behind a router of policy `routing` (`core.serving.router`); seed drives the
    `random` policy; history: what `approximate-prefix` remembers (None: llm-d's defaults). Raises RoutingError
    for an unknown policy or fewer than one replica."""

    replicas: int = 1
    routing: str = DEFAULT_ROUTING
    seed: int = 0
    history: PrefixHistory | None = None

    def __post_init__(self):
        check_routing(self.routing)
        if type(self.replicas) is not int or self.replicas < 1:
            raise RoutingError(f"a fleet needs at least one replica, got {self.replicas!r}", self.routing)
        check_int(self.seed, "seed", minimum=0)


@dataclass(eq=False)
class FleetResult(SimulationResult):
    """A fleet's run (`SimulationResult` over the whole fleet: module docstring), with `fleet` and each
    replica's own result in `replica_results`."""

    fleet: Fleet | None = None
    replica_results: list = field(default_factory=list)


class _Replica:
    """One replica: its simulation, what its router reads (`core.serving.router.ReplicaView`), and the observer
    its steps report to (its own record, then the router's in-flight tally of the requests that finished)."""

    def __init__(self, sim: _Simulation):
        self.sim = sim
        self.memory = sim.memory
        self.uncached_in_flight = 0
        self._uncached: dict[int, int] = {}  # group index -> uncached prompt tokens counted in flight
        kv = getattr(sim.memory, "kv", None)
        self._kv = kv if kv is not None and kv.enable_prefix_caching else None

    @property
    def num_waiting(self) -> int:
        scheduler = self.sim.scheduler
        return len(scheduler.waiting) + len(scheduler.swapped)

    @property
    def num_running(self) -> int:
        return len(self.sim.scheduler.running)

    @property
    def kv_usage(self) -> float:
        memory = self.memory  # any policy's metrics: the contiguous ones count no blocks
        return 1.0 - memory.metrics().free_slots / memory.capacity

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        return 0 if self._kv is None or not block_hashes else self._kv.num_cached_prefix_blocks(block_hashes)

    def take(self, group, uncached: int) -> None:
        """Queue `group` here; it counts `uncached` prompt tokens in flight until it finishes."""
        sim = self.sim
        if not sim.scheduler.has_unfinished:
            sim.now = max(sim.now, group.request.arrival_time)  # idle: the clock jumps to the arrival
        sim.scheduler.add(group)
        self._uncached[group.index] = uncached
        self.uncached_in_flight += uncached

    def on_step(self, step, outcome, priced) -> None:
        self.sim.record.on_step(step, outcome, priced)
        for group in outcome.finished:
            self.uncached_in_flight -= self._uncached.pop(group.index, 0)


class _PromptKeys:
    """The chained full-block keys of each prompt (what the replicas' caches are keyed by), the shared prefix's
    keys computed once per prefix."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._prefix: dict = {}

    def __call__(self, group) -> list[int]:
        bs = self.block_size
        blocks = (group.prompt_len - 1) // bs  # the last prompt token is never a hit (`KVCacheManager`)
        keys: list[int] = []
        head = min(group.request.prefix_len // bs, blocks) if group.prefix_index is not None else 0
        if head:
            known = self._prefix.get((group.prefix_index, head))
            if known is None:
                known = []
                extend_block_hashes(known, group.token_ids(0, 0, head * bs), bs, head)
                self._prefix[(group.prefix_index, head)] = known
            keys = list(known)
        if blocks > head:
            extend_block_hashes(keys, group.token_ids(0, 0, blocks * bs), bs, blocks)
        return keys


def simulate_fleet(
    requests: Sequence[Request],
    policy: Policy,
    config: SimulatorConfig,
    fleet: Fleet,
    until_finished: int | None = None,
) -> FleetResult:
    """Run the workload on `fleet.replicas` replicas of `policy` and `config` (each its own KV capacity
    `config.kv_capacity_tokens`) behind `fleet.routing` (module docstring); deterministic for given requests.
    until_finished: as `core.serving.simulator.simulate` takes it (stop once the first that many requests in
    arrival order finished, over the whole fleet). Raises InvalidArgumentError as `simulate` does, RoutingError
    for a bad fleet."""
    started = time.perf_counter()
    if not isinstance(fleet, Fleet):
        raise InvalidArgumentError(f"fleet must be a core.serving.fleet.Fleet, got {fleet!r}")
    check_types(policy, config)
    run = FleetRun(_validate_requests(requests, config), policy, config, fleet)
    if until_finished is not None:
        run.until = check_int(until_finished, "until_finished", minimum=1, maximum=len(run.groups))
    run.advance()
    return run.result(time.perf_counter() - started)


class FleetRun:
    """`simulate_fleet`'s run: its replicas, router and arrivals so far (`arrived`, routed as `assignment`);
    `advance` runs it until the first `until` groups (arrival order) have finished, `result` reads it. Its
    groups' maker (`maker`) continues them over later requests (`core.serving.resume`)."""

    def __init__(self, reqs: list, policy: Policy, config: SimulatorConfig, fleet: Fleet):
        self.policy, self.config, self.fleet = policy, config, fleet
        self.maker = GroupMaker(policy.is_paged and not policy.counted)
        self.groups = groups = self.maker.make(reqs)
        self.until = len(groups)
        n = fleet.replicas
        capacity = int(config.kv_capacity_tokens)
        self.replicas = []
        self.arrivals = np.array([g.request.arrival_time for g in groups], dtype=np.float64)
        for r in range(n):
            memory = make_memory(policy, capacity, config.watermark, config.max_seq_len)
            attach_offload(
                memory, policy, config
            )  # each replica its own host tier (--kv-offload-gib per replica)
            if r == 0:
                for group in groups:
                    memory.check_fits(group, group.output_len)
            sim = _Simulation(groups, memory, config)
            sim.arrivals = (
                self.arrivals
            )  # one timeline: every replica cuts its decode batches at the next arrival
            sim.cut_every_arrival = True
            if fleet.routing == "round-robin" and n > 1 and _runs_past_arrivals(policy, config):
                sim.round_robin = (r, n)  # the j-th arrival goes to replica j % n, whatever the replicas hold
            self.replicas.append(_Replica(sim))
        self.router = Router(fleet.routing, n, config.max_num_batched_tokens, fleet.seed, fleet.history)
        caching = policy.is_paged and policy.enable_prefix_caching and not policy.counted
        keyed = fleet.routing in PROMPT_KEYED
        self.keys = _PromptKeys(policy.block_size) if caching and keyed else None
        self.assignment = np.full(len(groups), -1, dtype=np.int64)
        self.arrived = 0

    def advance(self) -> None:
        """Route the arrivals and step the replicas in time order until the first `until` groups finished."""
        groups, arrivals, replicas, keys = self.groups, self.arrivals, self.replicas, self.keys
        policy, router, total = self.policy, self.router, self.until
        for rep in replicas:
            rep.sim.until = total
        arrived = self.arrived
        while sum(rep.sim.finished_first for rep in replicas) < total:
            t_next = arrivals[arrived] if arrived < len(groups) else math.inf
            busy = [rep for rep in replicas if rep.sim.scheduler.has_unfinished]
            behind = min(busy, key=lambda rep: rep.sim.now) if busy else None
            if behind is None or t_next <= behind.sim.now:
                if arrived == len(groups):
                    break  # nothing left to run or arrive (cannot happen before `total` finished)
                group = groups[arrived]
                hashes = keys(group) if keys is not None else ()
                chosen, cached = router.route(
                    replicas, group.prompt_len, hashes, policy.block_size, group.request.conversation
                )
                replicas[chosen].take(group, group.prompt_len - cached)
                self.assignment[arrived] = chosen
                arrived += 1
                self.arrived = arrived
                for rep in replicas:
                    rep.sim.arrived = arrived
                continue
            driver.run_step(behind.sim.scheduler, behind.sim, behind)

    def result(self, wall: float) -> "FleetResult":
        """The run as it stands (its frames built anew: a later `advance` changes none of them)."""
        return _result(self.policy, self.config, self.fleet, self.replicas, self.assignment.copy(), wall)


def _runs_past_arrivals(policy: Policy, config: SimulatorConfig) -> bool:
    """Whether a replica's decode-only batch may run on past arrivals routed elsewhere
    (`_Simulation.round_robin`): one full-attention pool and no host tier, whose k-step prediction does not
    depend on where a batch starts (free blocks only fall while nothing but decodes run)."""
    return policy.is_paged and policy.kv_groups is None and config.offload is None


def _result(policy, config, fleet, replicas, assignment, wall) -> FleetResult:
    frames = []
    for r, rep in enumerate(replicas):
        frame = rep.sim.record.rows.frame()
        frame["replica"] = r
        frames.append(frame)
    steps = pd.concat(frames, ignore_index=True).sort_values("time_s", kind="stable", ignore_index=True)
    requests = replicas[0].sim.requests_frame()
    requests["replica"] = assignment
    capacity = replicas[0].memory.capacity
    per_replica = []
    for r, (rep, frame) in enumerate(zip(replicas, frames, strict=True)):
        mine = requests[requests["replica"] == r].reset_index(drop=True)
        per_replica.append(
            SimulationResult(
                policy,
                config,
                frame,
                mine,
                summarize(frame, mine, capacity),
                list(rep.sim.record.snapshots),
                wall,
                capacity,
            )
        )
    summary = summarize(steps, requests, capacity)
    return FleetResult(policy, config, steps, requests, summary, [], wall, capacity, fleet, per_replica)


def replica_breakdown(result: SimulationResult, first: int, stop: int) -> list[dict]:
    """Per replica of a fleet's result (a plain `SimulationResult` is one replica), over the requests first..stop-1 in arrival order (a steady state's measured window) and the
    steps that ended between the first and the last of their arrivals: load_share (its share of those requests),
    prefix_hit_rate (prompt tokens its prefix cache served / its prompt tokens; 0 without prefix caching),
    kv_usage (the fraction of its KV capacity held, averaged over its steps' time), throughput_tokens_per_s (output tokens of its
    steps / the window) and requests."""
    window = result.requests.iloc[first:stop]
    steps = result.steps
    if "replica" not in window:  # a plain simulation: one replica
        window, steps = window.assign(replica=0), steps.assign(replica=0)
    arrivals = window["arrival_time"].to_numpy()
    t0, t1 = float(arrivals.min()), float(arrivals.max())
    span = t1 - t0
    capacity = result.capacity_slots or result.config.kv_capacity_tokens
    out = []
    for r in range(result.fleet.replicas if isinstance(result, FleetResult) else 1):
        mine = window[window["replica"] == r]
        sel = steps[(steps["replica"] == r) & (steps["time_s"] > t0) & (steps["time_s"] <= t1)]
        dt = sel["step_time_ms"].to_numpy()
        used = 1.0 - sel["free_slots"].to_numpy() / capacity
        prompts = float(mine["prompt_len"].sum())
        out.append(
            {
                "replica": r,
                "requests": len(mine),
                "load_share": len(mine) / len(window) if len(window) else 0.0,
                "prefix_hit_rate": float(mine["prefix_hit_tokens"].sum() / prompts) if prompts else 0.0,
                "kv_usage": float((used * dt).sum() / dt.sum()) if dt.sum() > 0 else 0.0,
                "throughput_tokens_per_s": float(sel["tokens_generated"].sum() / span) if span > 0 else 0.0,
            }
        )
    return out
