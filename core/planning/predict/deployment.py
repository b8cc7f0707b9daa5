"""`Deployment`: one way to serve a model (a preset or spec of model and GPU, its parallelism, replicas, vLLM
settings, engine profile, speculation, host KV tier and router), checked when made, and what a replica of it is:
its capacity planner's inputs (`plan_inputs`), resolved once (`resolve`), its memory plan, its step-time model and
step cost, its request-side seconds and the flags the CLI's JSON echoes. What a prediction does with it (the
replicas as a routed fleet, a MoE model's data-parallel ranks, the request-side term) is
`core.planning.predict.prediction`'s module docstring, which the notes "(module docstring)" below refer to.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from core.common import check_int
from core.errors import InvalidArgumentError
from core.fields import check_fields
from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from core.planning.catalog.hardware import GPUSpec, get_gpu
from core.planning.catalog.models import ModelSpec, get_model
from core.planning.cost.fits.engine_profiles import (
    DEFAULT_ENGINE,
    check_engine_release,
    engine_request_overhead_s,
    engine_step_defaults,
    split_request_term,
)
from core.planning.cost.fits.profile_checks import profile_check
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
from core.planning.memory.plan import CapacityPlan, PlanInputs, ReplicaMemory, plan_from
from core.planning.memory.resolved import ResolvedDeployment, resolve_deployment
from core.planning.memory.vllm_command import parallel_flags
from core.planning.predict.deployment_fields import CHECKED_FIELDS
from core.planning.predict.load import Load
from core.serving.host_offload import DEFAULT_OFFLOAD_BANDWIDTH, HostOffload
from core.serving.router import DEFAULT_ROUTING, PrefixHistory, check_routing


@dataclass(frozen=True)
class Deployment:
    """One way to serve a model: `replicas` copies (data parallel) of a tp x pp group of one GPU type, each
    running `engine` with these vLLM settings. model / gpu: preset slugs or ModelSpec / GPUSpec objects.
    speculation: speculative decoding (`core.planning.cost.speculative`), None for none. data_parallel /
    expert_parallel: a MoE model's DP ranks per replica (each tp x pp GPUs, its own requests and KV cache) and
    whole experts per GPU (module docstring; a dense model's DP ranks are independent, as replicas).
    routing: the policy that sends each request to a replica (a DP rank) (`core.serving.router.ROUTING_POLICIES`; module docstring).
    prefix_history: what an `approximate-prefix` router remembers (`core.serving.router.PrefixHistory`; None:
    llm-d's defaults).
    vllm_version: the vLLM release whose kernels price the steps (`from_specs`; None, or "" as a page's empty box
    gives it: today's vLLM); refused beside an engine profile that is not vLLM's.
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
    prefix_history: PrefixHistory | None = None
    vllm_version: str | None = None  # the vLLM release its kernels are priced at (None: today's)

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
        object.__setattr__(self, "vllm_version", check_engine_release(self.engine, self.vllm_version))
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
        if self.vllm_version:
            kwargs["vllm_version"] = self.vllm_version
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
            | ({"vllm_version": self.vllm_version} if self.vllm_version else {})
        )

    def profile_check(self) -> dict | None:
        """How far the engine profile's answers have been from published vLLM runs on this GPU and for this
        model (`core.planning.cost.fits.profile_checks.profile_check`; None for a profile without such a check)."""
        return profile_check(self.engine, self.model_spec, self.gpu_spec, self.vllm_version)

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
