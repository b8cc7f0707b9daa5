"""What one deployment does at one load: steady-state latency percentiles, throughput and whether the KV cache
holds requests back (`predict`), as `python -m core.planning predict` prints it, for a `Deployment`
(`core.planning.predict.deployment`) and a `Load` (`core.planning.predict.load`).

    deployment = Deployment("llama-3.1-8b", "h100-80gb", tp=1, max_num_seqs=256)
    p = predict(deployment, Load(rate=12, prompt_len=1500, output_len=256))
    p.metrics["tpot_p99_s"], p.converged, p.to_dict()

A replica of the deployment (`core.planning.predict.replica_sim`, shared with the staged-ramp replay) is
1. resolved once (`Deployment.resolve`, max_model_len = the longest request) and sized by the exact planner's
   arithmetic on it (`core.planning.memory.plan.replica_memory`, vLLM's memory rules; no whole `CapacityPlan`):
   a deployment that does not fit raises `InvalidArgumentError` with the planner's verdict;
2. priced, from the same resolved deployment, by the step-time model (`core.planning.cost.step_time.from_specs`)
   with the engine's profile
   (`core.planning.cost.fits.engine_profiles`): each step's weights, KV traffic and FLOPs at that engine's fitted
   efficiencies and overheads;
3. simulated (core.sched's Scheduler over the paged KV core, counted blocks) until its percentiles converge
   (`core.serving.steady_state`): warm-up dropped, horizon sized from the load, batch-means intervals. A load
   whose prompts share tokens (`Load.uses_prefix_cache`: shared prefixes, multi-turn chats) runs the paged
   policy with block tables and prefix caching instead, so the real block hashing and LRU eviction decide what
   hits (`prefix_hit_rate`), and its warm-up spans a whole conversation (turns x turn_gap_s).
Several replicas serving a Poisson load run as a fleet (`core.serving.fleet`): each replica its own scheduler
and KV core, a router (`Deployment.routing`, `core.serving.router`: round-robin by default, what a plain load
balancer does) sending each arrival to one of them, one steady-state estimate over the whole fleet (its
percentiles, throughput and prefix hit rate) and a breakdown per replica (`Prediction.per_replica`). A closed
loop (concurrency) keeps its clients pinned, ceil(clients / replicas) to each replica, and simulates one of them
(throughput replicas x one replica's); so does a single replica, whatever the routing.
A closed loop at fixed lengths starts with its first round's outputs drawn at random
(`core.serving.workload.out_of_phase_outputs`, `Load.seed`), so its clients run out of phase, each at a random
phase of the cycle, as a real server's do, not in lockstep. An engine profile with a request-side term
("vllm-cross-model"; `Deployment.request_overhead_s`) adds to each request's TTFT and E2E what it spends outside
the steps (`add_request_side`, the definition the profile's fit replays: docs/slo.md 2c).

A MoE model served with data-parallel attention (`Deployment.data_parallel` D, vLLM's `--data-parallel-size`)
runs D DP ranks per replica, each its own scheduler, requests and KV cache (`Deployment.ranks` = replicas x D
schedulers, simulated as replicas are); its experts are spread over the replica's tp x D GPUs, with
`expert_parallel` (`--enable-expert-parallel`) whole experts per GPU (`core.planning.memory.kv_accounting`).
A rank's step is priced on its own batch, with the experts' weight reads and the DP collectives of the batches
all D ranks run in lockstep (`core.planning.cost.step_time`, module docstring: data-parallel attention).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.cost.speculative import SpeculativeStepTime
from core.planning.cost.step_time import StepTimeModel
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.replica_sim import (
    SizedReplica,
    caches_prefixes,
    replica_config,
    replica_policy,
    routed_fleet,
    sized_replica,
)
from core.serving.fleet import Fleet, replica_breakdown
from core.serving.host_offload import HostOffload
from core.serving.latency import REQUEST_SIDE_COLUMN, request_side_seconds, steps_ended_before
from core.serving.resume import SimulationSession
from core.serving.steady_state import SteadyState, SteadyStateSettings, metric_keys, steady_state
from core.serving.workload import out_of_phase_outputs

__all__ = ["Deployment", "Load", "Prediction", "predict"]


@dataclass(frozen=True, eq=False)
class Prediction:
    """The steady state of a deployment at a load. metrics: `core.serving.steady_state.SteadyState.metrics`
    with throughput_tokens_per_s scaled to the whole deployment; intervals: the 95% interval of each
    percentile; converged / stable / kv_limited as there; kv_tokens: KV slots per replica for the target's
    sequences (after a draft's weights, K/V and lookahead slots when speculating); state: the
    replica's estimate, or the fleet's when routed (its last simulation in state.result); per_replica: each
    replica's load_share, prefix_hit_rate, kv_usage, throughput_tokens_per_s and requests over the measured
    window (`core.serving.fleet.replica_breakdown`), None for a closed loop over several replicas (one simulated
    replica stands for each); replica: the sized replica that was simulated (`replica_sim.sized_replica`, priced
    with predict's step-time overrides)."""

    deployment: Deployment
    load: Load
    metrics: dict
    intervals: dict
    converged: bool
    stable: bool
    kv_limited: bool
    kv_tokens: int
    state: SteadyState = field(repr=False)
    per_replica: list | None = None
    replica: SizedReplica | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        """JSON-ready: every percentile key (ttft_p50_s ... e2e_p99_s; None where undefined), the means,
        throughput_tokens_per_s, mean_running_batch, preemptions, kv_limited, converged, stable, the
        intervals, and what was simulated."""
        m = self.metrics
        out = {"mode": "agg"} | {key: m.get(key) for key in metric_keys()}
        for key in (
            "mean_ttft_s",
            "mean_tpot_s",
            "mean_itl_s",
            "mean_e2e_s",
            "queue_p99_s",
            "throughput_tokens_per_s",
            "request_throughput_per_s",
            "mean_running_batch",
            "mean_waiting",
            "preemptions",
            "preemptions_per_s",
        ):
            out[key] = m.get(key)
        caching = caches_prefixes(self.deployment, self.load)
        for key in (
            "prefix_hit_rate",
            "gpu_hit_rate",
            "host_hit_rate",
        ):  # all tiers, then HBM's and the host's
            out[key] = m.get(key) if caching else None
        spec = self.deployment.speculation
        out["mean_accepted_len"] = spec.mean_accepted_len if spec is not None else None
        out |= {
            "kv_limited": self.kv_limited,
            "converged": self.converged,
            "stable": self.stable,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "kv_tokens": self.kv_tokens,
            "simulated_requests": self.state.simulated_requests,
            "measured_requests": self.state.measured_requests,
            "warmup_requests": self.state.warmup_requests,
            "per_replica": self.per_replica,
            "deployment": self.deployment.flags(),
            "profile_check": self.deployment.profile_check(),
            "load": {
                "rate": self.load.rate,
                "concurrency": self.load.concurrency,
                "prompt_len": self.load.prompt_len,
                "output_len": self.load.output_len,
                "length_spread": self.load.length_spread,
                "seed": self.load.seed,
            },
        }
        if self.load.uses_prefix_cache:
            out["load"] |= {
                "shared_prefix_len": self.load.shared_prefix_len,
                "num_prefixes": self.load.num_prefixes,
                "prefix_zipf": self.load.prefix_zipf,
                "turns": self.load.turns,
                "turn_gap_s": self.load.turn_gap_s,
            }
        return out


def idle_lifetime(step: StepTimeModel | SpeculativeStepTime, load: Load, budget: int) -> float:
    """A request's latency alone on an idle replica: its prefill in `budget`-token chunks, then its decodes."""
    prefill = step.prefill_seconds(load.prompt_len, budget)
    decode = step.decode_step_seconds(1, load.prompt_len + load.output_len / 2)
    return prefill + (load.output_len - 1) * decode


def replica_steady_state(
    deployment: Deployment,
    load: Load,
    step: StepTimeModel | SpeculativeStepTime,
    kv_tokens: int,
    settings: SteadyStateSettings | None = None,
    decided: Callable[[SteadyState], bool] | None = None,
    focus: tuple[str, ...] | None = None,
    fleet: Fleet | None = None,
    offload: HostOffload | None = None,
    request_overhead_s: float | None = None,
) -> SteadyState:
    """The steady state of one replica under `load` (already its share), KV capacity `kv_tokens` slots: counted
    blocks, or block tables with prefix caching when the load's prompts share tokens; settings / decided /
    focus as `core.serving.steady_state.steady_state` takes them. fleet: instead, `load` is the whole fleet's and
    the estimate is that of `fleet`'s replicas behind its router (`core.serving.fleet.simulate_fleet`). offload:
    the replica's host tier (`Deployment.host_offload`), required when the deployment has one.
    request_overhead_s: the profile's request-side seconds (`Deployment.request_overhead_s`; None: none), added
    to every simulated request's TTFT and E2E with the step in flight when it arrives in a closed loop
    (`add_request_side`)."""
    caching = caches_prefixes(deployment, load)
    if deployment.kv_offload_gib and offload is None:
        raise InvalidArgumentError(
            "a deployment with a host KV tier (kv_offload_gib) needs its offload: Deployment.host_offload(memory)"
        )
    config = replica_config(deployment, step, kv_tokens, load.max_len, offload)
    policy = replica_policy(deployment, caching)
    lifetime = (
        idle_lifetime(step, load, deployment.max_num_batched_tokens) + (load.turns - 1) * load.turn_gap_s
    )

    # each growth of the window continues the last run when the draw is prefix-stable (`core.serving.resume`)
    session = SimulationSession(policy, config, None if fleet is not None else load.concurrency, fleet)

    def run(requests, until):
        result = session.run(requests, until)
        if request_overhead_s is not None:
            add_request_side(result, request_overhead_s, closed_loop=load.concurrency is not None)
        return result

    requests = load.requests
    if load.concurrency is not None and load.length_spread == 0 and load.turns == 1:
        requests = _out_of_phase(load)
    return steady_state(
        requests,
        run,
        rate=load.rate,
        concurrency=load.concurrency,
        lifetime_s=lifetime,
        max_num_seqs=deployment.max_num_seqs,
        settings=settings,
        decided=decided,
        focus=focus,
    )


def _out_of_phase(load: Load) -> Callable[[int], list]:
    """`load.requests` with the first round's outputs drawn at random (`core.serving.workload.out_of_phase_outputs`,
    seeded by `load.seed`): a closed loop at fixed lengths then runs with its clients out of phase, each at a
    random phase of the cycle, as a real server's drift apart and as the vLLM profile's fit replays its
    benchmarks, instead of in lockstep (the steady state's warm-up, which is at least one request per client,
    drops that round)."""
    first = out_of_phase_outputs(load.concurrency, load.output_len, load.seed)

    def requests(count: int) -> list:
        drawn = load.requests(count)
        head = [replace(r, output_len=n) for r, n in zip(drawn, first, strict=False)]
        return head + drawn[len(head) :]

    return requests


def add_request_side(result, fixed_s: float, closed_loop: bool) -> None:
    """Write each simulated request's request-side seconds (`core.serving.latency.request_side_seconds`, the one
    definition the vLLM profile's fit replays) into result.requests[REQUEST_SIDE_COLUMN]: fixed_s, plus in a
    closed loop the step that ended when the request arrived (the step in flight when it reaches the engine).
    Its TTFT and E2E then include it (`core.serving.latency.request_latencies`). A fleet's result (several
    replicas' steps interleaved) is only ever an open loop here: fixed_s alone."""
    requests, steps = result.requests, result.steps
    ends = steps["time_s"].to_numpy(np.float64)
    durations = steps["step_time_ms"].to_numpy(np.float64) / 1000.0
    arrival = steps_ended_before(ends, requests["arrival_time"].to_numpy(np.float64))
    requests[REQUEST_SIDE_COLUMN] = request_side_seconds(fixed_s, durations, arrival, closed_loop)


def predict(
    deployment: Deployment,
    load: Load,
    step_time: Mapping | None = None,
    settings: SteadyStateSettings | None = None,
    decided: Callable[[SteadyState], bool] | None = None,
    focus: tuple[str, ...] | None = None,
) -> Prediction:
    """The steady state of `deployment` serving `load` (module docstring). step_time: overrides of the engine
    profile's efficiencies and overheads; decided / focus as `replica_steady_state` takes them (None: grown
    until every percentile is within the tolerance). Raises InvalidArgumentError when a replica does not fit
    in memory."""
    if not isinstance(deployment, Deployment) or not isinstance(load, Load):
        raise InvalidArgumentError("predict needs a Deployment and a Load")
    replica = sized_replica(deployment, load.max_len, step_time)
    routed = deployment.routes(load)
    share = load if routed else load.per_replica(deployment.ranks)
    fleet = routed_fleet(deployment, load.seed) if routed else None
    kv_tokens = replica.kv_tokens
    state = replica_steady_state(
        deployment,
        share,
        replica.step,
        kv_tokens,
        settings,
        decided,
        focus,
        fleet,
        replica.offload,
        replica.request_overhead_s,
    )
    metrics = dict(state.metrics)
    if not routed:
        for key in ("throughput_tokens_per_s", "request_throughput_per_s"):
            if key in metrics:
                metrics[key] *= deployment.ranks
    per_replica = None
    if routed or deployment.ranks == 1:
        first = state.warmup_requests
        per_replica = replica_breakdown(state.result, first, first + state.measured_requests)
    return Prediction(
        deployment,
        load,
        metrics,
        state.intervals,
        state.converged,
        state.stable,
        state.kv_limited,
        kv_tokens,
        state,
        per_replica,
        replica,
    )
