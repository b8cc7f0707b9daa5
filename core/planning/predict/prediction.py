"""What one deployment does at one load: steady-state latency percentiles, throughput and whether the KV cache
holds requests back (`predict`), as `python -m core.planning predict` prints it.

    deployment = Deployment("llama-3.1-8b", "h100-80gb", tp=1, max_num_seqs=256)
    p = predict(deployment, Load(rate=12, prompt_len=1500, output_len=256))
    p.metrics["tpot_p99_s"], p.converged, p.to_dict()

A replica of the deployment is
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
A closed loop at fixed lengths starts with its first round's outputs staggered
(`core.serving.workload.out_of_phase_outputs`), so its clients run out of phase as a real server's do, not in
lockstep. An engine profile with a request-side term ("vllm-cross-model"; `Deployment.request_overhead_s`) adds
to each request's TTFT and E2E what it spends outside the steps (`add_request_side`, the definition the profile's
fit replays: docs/slo.md 2c).

A MoE model served with data-parallel attention (`Deployment.data_parallel` D, vLLM's `--data-parallel-size`)
runs D DP ranks per replica, each its own scheduler, requests and KV cache (`Deployment.ranks` = replicas x D
schedulers, simulated as replicas are); its experts are spread over the replica's tp x D GPUs, with
`expert_parallel` (`--enable-expert-parallel`) whole experts per GPU (`core.planning.memory.kv_accounting`).
A rank's step is priced on its own batch, with the experts' weight reads and the DP collectives of the batches
all D ranks run in lockstep (`core.planning.cost.step_time`, module docstring: data-parallel attention).
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from core.common import check_int
from core.errors import InvalidArgumentError
from core.fields import check_fields
from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from core.planning.catalog.hardware import GPUSpec, get_gpu
from core.planning.catalog.models import ModelSpec, get_model
from core.planning.cost.fits.engine_profiles import (
    DEFAULT_ENGINE,
    engine_request_overhead_s,
    engine_step_defaults,
    split_request_term,
)
from core.planning.cost.speculative import (
    Speculation,
    SpeculativeStepTime,
    draft_pass_model,
    eagle_head_bytes,
    eagle_head_model,
    speculative_kv_tokens,
)
from core.planning.cost.step_time import StepTimeModel, from_specs
from core.planning.memory.kv_accounting import (
    BLOCK_SIZES,
    check_moe_parallel,
    check_parallelism,
)
from core.planning.memory.offload import check_offload_gib, host_kv_tier, offload_flags
from core.planning.memory.plan import CapacityPlan, PlanInputs, ReplicaMemory, plan_from, replica_memory
from core.planning.memory.resolved import ResolvedDeployment, resolve_deployment
from core.planning.memory.vllm_command import parallel_flags
from core.planning.predict.deployment_fields import CHECKED_FIELDS
from core.planning.predict.load import Load
from core.serving.fleet import Fleet, replica_breakdown
from core.serving.host_offload import DEFAULT_OFFLOAD_BANDWIDTH, HostOffload
from core.serving.latency import REQUEST_SIDE_COLUMN, request_side_seconds, steps_ended_before
from core.serving.memory_policies import paged
from core.serving.resume import SimulationSession
from core.serving.router import DEFAULT_ROUTING, check_routing
from core.serving.sim_config import SimulatorConfig
from core.serving.steady_state import SteadyState, SteadyStateSettings, metric_keys, steady_state
from core.serving.workload import out_of_phase_outputs

__all__ = ["Deployment", "Load", "Prediction", "predict"]


@dataclass(frozen=True)
class Deployment:
    """One way to serve a model: `replicas` copies (data parallel) of a tp x pp group of one GPU type, each
    running `engine` with these vLLM settings. model / gpu: preset slugs or ModelSpec / GPUSpec objects.
    speculation: speculative decoding (`core.planning.cost.speculative`), None for none. data_parallel /
    expert_parallel: a MoE model's DP ranks per replica (each tp x pp GPUs, its own requests and KV cache) and
    whole experts per GPU (module docstring; a dense model's DP ranks are independent, as replicas).
    routing: the policy that sends each request to a replica (a DP rank) (`core.serving.router.ROUTING_POLICIES`; module docstring).
    Raises InvalidArgumentError for an unknown model, GPU, dtype, engine or block size, or a TP/PP layout the
    model does not allow (tp must divide the attention heads); RoutingError for an unknown routing policy."""

    model: str | ModelSpec
    gpu: str | GPUSpec
    tp: int = 1
    pp: int = 1
    replicas: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    engine: str = DEFAULT_ENGINE
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    speculation: Speculation | None = None
    kv_offload_gib: float = 0.0  # host-memory KV tier per replica (vLLM's --kv-offloading-size), 0: none
    offload_policy: str = "lru"  # its eviction: "lru" | "arc"
    offload_bandwidth_gbps: float = DEFAULT_OFFLOAD_BANDWIDTH / 1e9  # host -> GPU GB/s per GPU
    routing: str = DEFAULT_ROUTING
    data_parallel: int = 1  # DP ranks per replica (vLLM's --data-parallel-size; MoE: data-parallel attention)
    expert_parallel: bool = False  # vLLM's --enable-expert-parallel (MoE)

    def __post_init__(self):
        check_routing(self.routing)
        model = get_model(self.model) if isinstance(self.model, str) else self.model
        gpu = get_gpu(self.gpu) if isinstance(self.gpu, str) else self.gpu
        if not isinstance(model, ModelSpec) or not isinstance(gpu, GPUSpec):
            raise InvalidArgumentError("model and gpu must be preset slugs or ModelSpec / GPUSpec objects")
        object.__setattr__(self, "model_spec", model)
        object.__setattr__(self, "gpu_spec", gpu)
        check_fields(self, CHECKED_FIELDS)  # tp, pp, replicas, DP ranks, max_num_seqs, dtypes, host bandwidth
        check_int(self.max_num_batched_tokens, "--max-num-batched-tokens", minimum=self.max_num_seqs)
        check_parallelism(model, self.tp, self.pp)
        check_moe_parallel(model, self.tp, self.data_parallel, self.expert_parallel)
        engine_step_defaults(self.engine)  # raises for an unknown engine, naming the known ones
        if self.block_size not in BLOCK_SIZES:
            raise InvalidArgumentError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size!r}")
        if self.speculation is not None and not isinstance(self.speculation, Speculation):
            raise InvalidArgumentError(
                "speculation must be a core.planning.cost.speculative.Speculation or None"
            )
        check_offload_gib(self.kv_offload_gib, "kv_offload_gib")
        HostOffload(0, self.offload_policy, self.offload_bandwidth_gbps * 1e9)

    def host_offload(self, capacity: CapacityPlan | ReplicaMemory) -> HostOffload | None:
        """The simulator's host tier for one replica of `capacity` (a plan, or a replica's memory: vLLM's
        arithmetic, `host_kv_tier`), None without one."""
        if not self.kv_offload_gib:
            return None
        tier = host_kv_tier(capacity, self.kv_offload_gib)
        return HostOffload(tier.host_kv_tokens, self.offload_policy, self.offload_bandwidth_gbps * 1e9)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.data_parallel * self.replicas

    @property
    def ranks(self) -> int:
        """The schedulers serving the load, each with its own KV cache: replicas x data_parallel (a DP rank
        schedules its own requests, as a replica does; module docstring)."""
        return self.replicas * self.data_parallel

    def routes(self, load: Load) -> bool:
        """Whether `load` runs on the ranks (`ranks`) as a routed fleet: more than one and Poisson arrivals
        (module docstring)."""
        return self.ranks > 1 and load.rate is not None

    def plan_inputs(self, max_len: int) -> PlanInputs:
        """The capacity planner's inputs for one replica serving requests of up to `max_len` tokens."""
        return PlanInputs(
            self.model_spec,
            self.gpu_spec,
            num_gpus=self.tp * self.pp * self.data_parallel,
            data_parallel=self.data_parallel,
            expert_parallel=self.expert_parallel,
            tensor_parallel=self.tp,
            pipeline_parallel=self.pp,
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            gpu_memory_utilization=self.gpu_memory_utilization,
            block_size=self.block_size,
            max_model_len=max_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )

    def resolve(self, max_len: int) -> ResolvedDeployment:
        """One replica serving requests of up to `max_len` tokens, resolved once (`resolve_deployment`: checked,
        dtypes concrete, the model's KV layer specs derived): the one deployment its memory
        (`replica_memory(resolved)`) and its step cost (`step_model(resolved=resolved)`) both read."""
        return resolve_deployment(self.plan_inputs(max_len))

    def memory_plan(self, max_len: int) -> CapacityPlan:
        """The exact planner's whole plan for one replica serving requests of up to `max_len` tokens (verdict,
        notes, `vllm serve` flags: what the SLO search shows); `predict` asks only `replica_memory`."""
        return plan_from(self.plan_inputs(max_len))

    def step_model(
        self, overrides: Mapping | None = None, resolved: ResolvedDeployment | None = None
    ) -> StepTimeModel:
        """The step-time model of one replica: the engine's profile, then `overrides` on top. resolved: this
        deployment resolved (`resolve`), whose model, GPU, parallelism and concrete dtypes it is priced with
        (the same figures as the deployment's own: "auto" resolves to the same dtype either way). A request-side
        term among the overrides is not a step parameter: `request_overhead_s` reads it."""
        kwargs = engine_step_defaults(self.engine) | split_request_term(overrides)[0]
        if self.data_parallel > 1 or self.expert_parallel:
            kwargs |= {"data_parallel": self.data_parallel, "expert_parallel": self.expert_parallel}
        if resolved is None:
            return from_specs(
                self.model_spec, self.gpu_spec, self.tp, self.weight_dtype, self.kv_dtype, self.pp, **kwargs
            )
        r = resolved
        return from_specs(
            r.model, r.gpu, r.tensor_parallel, r.weight_dtype, r.kv_dtype, r.pipeline_parallel, **kwargs
        )

    def request_overhead_s(self, overrides: Mapping | None = None) -> float | None:
        """The request-side seconds TTFT gains (module docstring): the overrides' request term
        (`engine_profiles.REQUEST_TERM`) when they have one, else the engine profile's; None: neither has one."""
        term = split_request_term(overrides)[1]
        return engine_request_overhead_s(self.engine) if term is None else term

    def step_cost(
        self, step: StepTimeModel, kv_tokens: int
    ) -> tuple[StepTimeModel | SpeculativeStepTime, int]:
        """(what a step costs, KV slots left for the target's sequences): `step` and `kv_tokens` as they are
        without speculation; with it the speculative step cost and the slots the draft and the lookahead leave.
        Raises InvalidArgumentError when the draft leaves no KV memory or is not servable at this tp."""
        spec = self.speculation
        if spec is None:
            return step, kv_tokens
        draft, draft_bytes = None, (0.0, 0.0)
        if spec.method == "eagle":
            draft, draft_bytes = (
                eagle_head_model(step, self.model_spec),
                eagle_head_bytes(step, self.model_spec),
            )
        elif spec.method == "draft-model":
            model = get_model(spec.draft_model)
            check_parallelism(model, self.tp, 1)
            full = from_specs(
                model,
                self.gpu_spec,
                self.tp,
                self.weight_dtype,
                self.kv_dtype,
                1,
                **engine_step_defaults(self.engine),
            )
            draft, draft_bytes = draft_pass_model(full), (full.weight_bytes, full.kv_bytes_per_token)
        slots = speculative_kv_tokens(kv_tokens, step, draft_bytes, spec, self.max_num_seqs)
        if slots < self.block_size:
            raise InvalidArgumentError(
                f"speculation ({spec.method}, {spec.num_tokens} tokens) leaves no KV memory: the draft's weights "
                f"and the lookahead slots take all {kv_tokens:,} slots"
            )
        return SpeculativeStepTime(step, spec, draft), slots

    def flags(self) -> dict:
        """The deployment as the CLI's JSON echoes it (with speculation's flags when set)."""
        spec = {} if self.speculation is None else self.speculation.flags()
        return (
            spec
            | {
                "model": self.model_spec.name,
                "gpu": self.gpu_spec.name,
                "tp": self.tp,
                "pp": self.pp,
                "replicas": self.replicas,
                "num_gpus": self.num_gpus,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "weight_dtype": self.weight_dtype,
                "kv_dtype": self.kv_dtype,
                "engine": self.engine,
                "block_size": self.block_size,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "routing": self.routing,
            }
            | self._offload_flags()
            | self._moe_flags()
        )

    def _moe_flags(self) -> dict:
        """data_parallel / expert_parallel and their `vllm serve` flags, when either is set."""
        if self.data_parallel == 1 and not self.expert_parallel:
            return {}
        return {
            "data_parallel": self.data_parallel,
            "expert_parallel": self.expert_parallel,
            "vllm_parallel_flags": parallel_flags(self.tp, self.pp, self.data_parallel, self.expert_parallel),
        }

    def _offload_flags(self) -> dict:
        if not self.kv_offload_gib:
            return {}
        return {
            "kv_offload_gib": self.kv_offload_gib,
            "offload_policy": self.offload_policy,
            "offload_bandwidth_gbps": self.offload_bandwidth_gbps,
            "vllm_serve_flags": offload_flags(self.kv_offload_gib),
        }


@dataclass(frozen=True, eq=False)
class Prediction:
    """The steady state of a deployment at a load. metrics: `core.serving.steady_state.SteadyState.metrics`
    with throughput_tokens_per_s scaled to the whole deployment; intervals: the 95% interval of each
    percentile; converged / stable / kv_limited as there; kv_tokens: KV slots per replica for the target's
    sequences (after a draft's weights, K/V and lookahead slots when speculating); state: the
    replica's estimate, or the fleet's when routed (its last simulation in state.result); per_replica: each
    replica's load_share, prefix_hit_rate, kv_usage, throughput_tokens_per_s and requests over the measured
    window (`core.serving.fleet.replica_breakdown`), None for a closed loop over several replicas (one simulated
    replica stands for each)."""

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
        caching = self.load.uses_prefix_cache or bool(self.deployment.kv_offload_gib)
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
    caching = load.uses_prefix_cache or bool(deployment.kv_offload_gib)  # a host tier runs with the cache on
    if deployment.kv_offload_gib and offload is None:
        raise InvalidArgumentError(
            "a deployment with a host KV tier (kv_offload_gib) needs its offload: Deployment.host_offload(memory)"
        )
    config = SimulatorConfig(
        kv_capacity_tokens=int(kv_tokens),
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        max_seq_len=load.max_len,
        step_time=step,
        max_snapshots=1,
        offload=offload,
    )
    policy = paged(deployment.block_size, enable_prefix_caching=caching, counted=not caching)
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
    """`load.requests` with the first round's outputs staggered (`core.serving.workload.out_of_phase_outputs`): a
    closed loop at fixed lengths then runs with its clients out of phase, as a real server's drift apart and as
    the vLLM profile's fit replays its benchmarks, instead of in lockstep (the steady state's warm-up, which is
    at least one request per client, drops the staggered round)."""
    first = out_of_phase_outputs(load.concurrency, load.output_len)

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
    resolved = deployment.resolve(load.max_len)
    memory = replica_memory(resolved)
    if not memory.fits:
        raise InvalidArgumentError(f"the deployment does not fit: {memory.verdict}")
    routed = deployment.routes(load)
    share = load if routed else load.per_replica(deployment.ranks)
    cost, kv_tokens = deployment.step_cost(deployment.step_model(step_time, resolved), memory.kv_tokens)
    fleet = Fleet(deployment.ranks, deployment.routing, load.seed) if routed else None
    offload = deployment.host_offload(memory)
    request_side = deployment.request_overhead_s(step_time)
    state = replica_steady_state(
        deployment, share, cost, kv_tokens, settings, decided, focus, fleet, offload, request_side
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
    )


def _finite(value) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
