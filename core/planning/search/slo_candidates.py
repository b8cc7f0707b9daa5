"""The inputs of the SLO planner (`core.planning.search.slo.plan_slo`): the latency target (`Slo`), the traffic
(`SloWorkload`), the search space (`SloCandidates`, checked by
`core.planning.search.search_fields.SEARCH_FIELDS`) and its enumeration into `Candidate` deployments.

A candidate is one way to serve the model: `replicas` copies (data parallel) of a tp x pp GPU group of one GPU
type, each copy running vLLM with `max_num_seqs` and a KV cache dtype; num_gpus = tp x pp x replicas and the
request rate is split evenly over the replicas. The cost proxy ranks candidates of equal GPU count: no GPU price
is cited here (public prices vary by provider and month), so the proxy is the total memory bandwidth
(num_gpus x datasheet bandwidth, TB/s), which orders the presets as their prices do (L40S < H100 < H200).
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.common import check_float, check_int
from core.errors import InvalidArgumentError, RoutingError
from core.fields import check_fields
from core.planning.catalog.hardware import GPUS, GPUSpec, get_gpu
from core.planning.catalog.models import ModelSpec
from core.planning.cost.fits.engine_profiles import (
    DEFAULT_ENGINE,
    REQUEST_TERM,
    check_engine_release,
    engine_step_defaults,
    split_request_term,
)
from core.planning.memory.kv_accounting import (
    BLOCK_SIZES,
    DTYPE_BITS,
    check_moe_parallel,
    check_parallelism,
)
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.target_fields import TARGET_FIELDS
from core.planning.search.search_fields import SEARCH_FIELDS
from core.serving.router import DEFAULT_ROUTING, ROUTING_POLICIES, check_routing
from core.serving.steady_state import metric_keys

# those `SloCandidates` holds by name and checks by their fields (gpus: presets or GPUSpecs, checked apart; the
# router's policies: `routing_policies` and `check_routing`; the switches: their own checks, below)
_CHECKED_FIELDS = tuple(
    f
    for f in SEARCH_FIELDS[1:]
    if f.name not in ("routing_candidates", "routing", "disagg", "expert_parallel")
)
_DEFAULTS = {f.name: f.default for f in SEARCH_FIELDS}


@dataclass(frozen=True)
class Slo:
    """The latency targets, seconds: any percentile (p50, p90, p95, p99) of time to first token, time per output
    token, inter-token latency or end-to-end latency, as the keys of a steady-state estimate
    (`core.serving.steady_state.metric_keys`). None: no bound on that one; at least one is set.
    `Slo(1.0, 0.05)` is TTFT p95 1 s and TPOT p95 50 ms; `Slo(ttft_p99_s=0.5, itl_p99_s=0.1)` MLPerf-style.
    Raises InvalidArgumentError for zero, negative, non-finite or over-an-hour targets (`TARGET_FIELDS`' check,
    naming the flag: "--ttft-p95 (seconds) must be greater than 0, got -1.0")."""

    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_p99_s: float | None = None

    def __post_init__(self):
        if all(getattr(self, key) is None for key in metric_keys()):
            raise InvalidArgumentError(
                "an SLO needs at least one latency target in seconds (e.g. ttft_p95_s, tpot_p99_s, itl_p99_s)"
            )
        check_fields(self, TARGET_FIELDS)  # each by its flag's field: the message `slo` and the page show

    def targets(self) -> dict[str, float]:
        """The bounded percentiles: {key: seconds} of those set, in `metric_keys()` order."""
        return {key: getattr(self, key) for key in metric_keys() if getattr(self, key) is not None}

    @classmethod
    def of(cls, targets: Mapping[str, float]) -> "Slo":
        """The SLO of a {key: seconds} mapping; an unknown key raises, naming the keys allowed."""
        unknown = [key for key in targets if key not in metric_keys()]
        if unknown:
            raise InvalidArgumentError(
                f"unknown target {unknown[0]!r}; targets are {', '.join(metric_keys())}"
            )
        return cls(**dict(targets))


def metric_label(key: str) -> str:
    """ "ttft_p95_s" -> "TTFT p95", "e2e_p99_s" -> "E2E p99"."""
    metric, quantile, _ = key.split("_")
    return f"{metric.upper()} {quantile}"


# The traffic of an SLO question is the traffic of any prediction: Poisson arrivals (or closed-loop clients) and
# the requests' lengths. The planner simulates each candidate to its steady state, so no request count is asked.
SloWorkload = Load


@dataclass(frozen=True)
class Candidate:
    """One deployment. gpu: the preset slug (or the custom GPU's name); num_gpus = tp x pp x data_parallel x
    replicas (data_parallel / expert_parallel: `core.planning.predict.deployment.Deployment`'s)."""

    gpu: str
    spec: GPUSpec = field(repr=False, compare=False)
    tp: int
    pp: int
    replicas: int
    max_num_seqs: int
    kv_dtype: str
    weight_dtype: str
    routing: str | None = None  # the router's policy in front of the replicas; None: one replica, no router
    data_parallel: int = 1  # DP ranks per replica (vLLM's --data-parallel-size; MoE: data-parallel attention)
    expert_parallel: bool = False  # vLLM's --enable-expert-parallel

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.data_parallel * self.replicas

    @property
    def ranks(self) -> int:
        """Schedulers sharing the load, each its own KV cache: replicas x data_parallel (`Deployment.ranks`)."""
        return self.replicas * self.data_parallel

    @property
    def cost_proxy(self) -> float:
        """Total memory bandwidth of the deployment in TB/s (num_gpus x the GPU's)."""
        return self.num_gpus * self.spec.memory_bandwidth / 1e12

    def sort_key(self) -> tuple:
        """The search's visiting order: GPU count, the cost proxy, then the most parallel layout first (at equal
        cost it has the shortest steps, so it most often sets the SLO ratio the group's other layouts must beat,
        `core.planning.search.slo`), the larger max_num_seqs first (whose run a smaller cap may reuse), the
        narrower KV dtype first (`auto` counted as 16 bits: a wider one is not simulated where the narrower one
        of the same deployment misses, `slo_eval.KvMisses`, which compares the actual bytes a token)."""
        return (
            self.num_gpus,
            self.cost_proxy,
            -self.tp * self.pp,
            self.pp,
            -self.max_num_seqs,
            DTYPE_BITS.get(self.kv_dtype, 16),
            self.kv_dtype,
            _routing_rank(self.routing),
            self.data_parallel,
        )

    def deployment_key(self) -> tuple:
        """The deployment apart from its scheduler cap: GPU, tp, pp, replicas, KV and weight dtypes, routing, DP
        ranks and EP."""
        return (
            self.gpu,
            self.tp,
            self.pp,
            self.replicas,
            self.kv_dtype,
            self.weight_dtype,
            self.routing,
            self.data_parallel,
            self.expert_parallel,
        )

    def deployment(self, model: ModelSpec, candidates: "SloCandidates") -> Deployment:
        """This candidate as a `Deployment` (what `predict` and `max_rate` take), with the search's shared vLLM
        settings and engine."""
        return Deployment(
            model,
            self.spec,
            self.tp,
            self.pp,
            self.replicas,
            self.max_num_seqs,
            candidates.max_num_batched_tokens,
            self.weight_dtype,
            self.kv_dtype,
            candidates.engine,
            candidates.block_size,
            candidates.gpu_memory_utilization,
            routing=self.routing or DEFAULT_ROUTING,
            data_parallel=self.data_parallel,
            expert_parallel=self.expert_parallel,
            vllm_version=candidates.vllm_version,
        )

    def label(self) -> str:
        routed = f", {self.routing} routing" if self.routing else ""
        dp = f", dp {self.data_parallel}" if self.data_parallel > 1 else ""
        dp += ", expert parallel" if self.expert_parallel else ""
        return (
            f"{self.num_gpus} x {self.spec.name} (tp {self.tp}, pp {self.pp}{dp}, {self.replicas} replica(s){routed}, "
            f"max_num_seqs {self.max_num_seqs}, KV {self.kv_dtype}, weights {self.weight_dtype})"
        )


def _routing_rank(routing: str | None) -> int:
    return -1 if routing is None else ROUTING_POLICIES.index(routing)


# What the router in front of a routed row's replicas is, against a plain load balancer (`routing_note`).
ROUTING_NOTES = {
    "round-robin": "{n} `vllm serve` replicas behind a plain load balancer (a Kubernetes Service, round-robin): "
    "every prefix is scattered over every replica",
    "random": "{n} `vllm serve` replicas behind a plain load balancer picking at random (the other thing a "
    "Kubernetes Service does)",
    "least-loaded": "{n} `vllm serve` replicas behind a load-aware router (queue and KV usage, blind to what each "
    "caches: llm-d's load-only scorers), not a plain load balancer (that is the round-robin row)",
    "prefix-aware": "{n} `vllm serve` replicas behind a prefix-aware router reading each replica's KV events "
    "(llm-d's precise prefix-cache scorer), not a plain load balancer (that is the round-robin row): it "
    "partitions prefixes over the replicas",
    "session": "{n} `vllm serve` replicas behind a sticky-session router (each conversation pinned to one "
    "replica), not a plain load balancer (that is the round-robin row)",
    "approximate-prefix": "{n} `vllm serve` replicas behind a router guessing each replica's prefix cache from "
    "its own routing history (llm-d's approximate prefix-cache scorer with its load scorers), not a plain load "
    "balancer (that is the round-robin row): it partitions prefixes less tightly than one reading KV events",
}


def routing_note(routing: str | None, replicas: int) -> str | None:
    """What serves a row of `replicas` replicas routed by `routing` (None for one replica)."""
    return None if routing is None else ROUTING_NOTES[routing].format(n=replicas)


def routing_policies(routing: str | None, routing_candidates: str | None) -> tuple[str, ...]:
    """The router policies of `slo`'s --routing POLICY / --routing-candidates P1,P2,... (one of them at most;
    neither: ()). Raises RoutingError for both, or an empty part (an unknown policy: `SloCandidates`)."""
    if routing is not None and routing_candidates is not None:
        raise RoutingError("give --routing POLICY or --routing-candidates P1,P2,..., not both", routing)
    if routing_candidates is not None:
        parts = [part.strip() for part in routing_candidates.split(",")]
        if not all(parts):
            raise RoutingError(
                f"--routing-candidates must be comma-separated policies among {', '.join(ROUTING_POLICIES)}, "
                f"got {routing_candidates!r}",
                routing_candidates,
            )
        return tuple(parts)
    return () if routing is None else (routing,)


def candidates_from(values: Mapping[str, Any], **settings: Any) -> "SloCandidates":
    """The `SloCandidates` of a values dict keyed by `SEARCH_FIELDS`' names (`slo`'s `vars(args)`, the page's
    values; a key left out takes its field's default) and "routing" (one policy or None), with `settings`
    (`SloCandidates`' other fields: engine, disagg, max_num_batched_tokens, ...). Each value is checked by its
    field in `SloCandidates`."""
    v = {f.name: values.get(f.name, f.default) for f in SEARCH_FIELDS}
    routing = routing_policies(v.pop("routing"), v.pop("routing_candidates"))
    return SloCandidates(**v, routing=routing, **settings)


@dataclass(frozen=True)
class SloCandidates:
    """The search space. gpus: preset slugs (core.planning.catalog.hardware.GPUS) or GPUSpec objects; max_gpus: most GPUs
    a deployment may use; tensor_parallel / pipeline_parallel / max_num_seqs / kv_dtypes / weight_dtypes: the
    values tried. max_num_batched_tokens (vLLM's default 8,192, as the capacity planner's), gpu_memory_utilization,
    block_size: vLLM settings shared by all.
    max_meeting: the search stops once this many deployments (`Candidate.deployment_key`: any max_num_seqs)
    met the SLO (every cheaper configuration has then been evaluated). engine: the serving engine whose profile prices the steps
    (`core.planning.cost.fits.engine_profiles.ENGINES`; default DEFAULT_ENGINE, "vllm-cross-model": vLLM, whose flags
    the planner prints, priced with the fit across models; "vllm" the single-model fit); vllm_version: the vLLM
    release whose MoE kernels price the steps (None: today's; `core.planning.cost.step_time.from_specs`); step_time:
    keyword overrides of that profile's efficiencies and overheads (None: the profile as fitted).
    disagg: also search disaggregated prefill / decode deployments (`core.planning.search.slo_disagg`; max_num_seqs
    there is the largest value only); needs max_gpus >= 2.
    routing: the router policies tried in front of every deployment of several replicas
    (`core.serving.router.ROUTING_POLICIES`; each (deployment, policy) pair is a candidate, simulated as a routed
    fleet as `predict` does); default (): no router, each replica serves 1 / N of the load as its own Poisson
    stream (the search's model before routing, 3-4x cheaper than a fleet simulation). A string is one policy.
    data_parallel: the DP ranks per replica tried (vLLM's --data-parallel-size; for a MoE model data-parallel
    attention, `Deployment.data_parallel`); expert_parallel: every candidate with --enable-expert-parallel (a MoE
    model only). Raises RoutingError for an unknown policy."""

    gpus: tuple = _DEFAULTS["gpus"]
    max_gpus: int = _DEFAULTS["max_gpus"]
    tensor_parallel: tuple[int, ...] = _DEFAULTS["tensor_parallel"]
    pipeline_parallel: tuple[int, ...] = _DEFAULTS["pipeline_parallel"]
    max_num_seqs: tuple[int, ...] = _DEFAULTS["max_num_seqs"]
    kv_dtypes: tuple[str, ...] = _DEFAULTS["kv_dtypes"]
    weight_dtypes: tuple[str, ...] = _DEFAULTS["weight_dtypes"]
    max_num_batched_tokens: int = _DEFAULTS["max_num_batched_tokens"]
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_meeting: int = _DEFAULTS["max_meeting"]
    step_time: Mapping[str, Any] | None = None
    engine: str = DEFAULT_ENGINE
    disagg: bool = _DEFAULTS["disagg"]
    routing: tuple[str, ...] = ()
    data_parallel: tuple[int, ...] = _DEFAULTS["data_parallel"]
    expert_parallel: bool = _DEFAULTS["expert_parallel"]
    vllm_version: str | None = None

    def __post_init__(self):
        if isinstance(self.gpus, str | GPUSpec):
            raise InvalidArgumentError("gpus must be a sequence of GPU preset slugs or GPUSpec objects")
        if not tuple(self.gpus):
            raise InvalidArgumentError(f"{SEARCH_FIELDS[0].flag} needs at least one value")
        object.__setattr__(self, "gpus", tuple(self.gpus))
        for gpu in self.gpus:
            if not isinstance(gpu, GPUSpec):
                get_gpu(gpu)  # raises, listing the presets
        check_fields(self, _CHECKED_FIELDS)  # by their flags' fields (gpus: presets or GPUSpecs)
        if not isinstance(self.expert_parallel, bool):
            raise InvalidArgumentError(f"expert_parallel must be True or False, got {self.expert_parallel!r}")
        check_int(self.max_num_batched_tokens, "max_num_batched_tokens", minimum=max(self.max_num_seqs))
        check_float(self.gpu_memory_utilization, "gpu_memory_utilization", minimum=0.01, maximum=1.0)
        if self.block_size not in BLOCK_SIZES:
            raise InvalidArgumentError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size!r}")
        engine_step_defaults(self.engine)  # raises for an unknown engine, naming the known ones
        object.__setattr__(self, "vllm_version", check_engine_release(self.engine, self.vllm_version))
        if split_request_term(self.step_time)[1] is not None:
            raise InvalidArgumentError(
                f"{REQUEST_TERM} is an engine profile's request-side term, not a step_time override in the SLO "
                "search: choose the engine whose profile has it (engine='vllm-cross-model')"
            )
        if self.disagg not in (True, False):
            raise InvalidArgumentError(f"disagg must be True or False, got {self.disagg!r}")
        if self.disagg and self.max_gpus < 2:
            raise InvalidArgumentError(
                f"--disagg needs --max-gpus of at least 2 GPUs (a prefill and a decode GPU), got {self.max_gpus}"
            )
        routing = (self.routing,) if isinstance(self.routing, str) else self.routing
        try:
            routing = tuple(routing)
        except TypeError:
            routing = (routing,)
        object.__setattr__(self, "routing", tuple(dict.fromkeys(check_routing(r) for r in routing)))

    def step_overrides(self) -> dict:
        """The step-time keyword overrides of every candidate: the engine's profile, `step_time` on top (as
        `Deployment.step_model` layers them), and the vLLM release whose kernels price them when one is set."""
        release = {"vllm_version": self.vllm_version} if self.vllm_version else {}
        return engine_step_defaults(self.engine) | release | dict(self.step_time or {})

    def gpu_specs(self) -> list[tuple[str, GPUSpec]]:
        """(slug or name, spec) of each GPU type."""
        return [(g.name, g) if isinstance(g, GPUSpec) else (g, GPUS[g]) for g in self.gpus]


def enumerate_candidates(model: ModelSpec, candidates: SloCandidates) -> Iterator[Candidate]:
    """Every candidate deployment with a TP/PP/DP layout the model allows (`check_parallelism`,
    `check_moe_parallel`) and at most max_gpus GPUs, in `Candidate.sort_key` order (GPU count, then the cost
    proxy). Raises InvalidArgumentError when expert_parallel is asked of a dense model."""
    ep = candidates.expert_parallel
    if ep and not model.is_moe:
        check_moe_parallel(model, 1, 1, ep)  # raises, naming the dense model
    layouts = []
    for tp in candidates.tensor_parallel:
        for pp in candidates.pipeline_parallel:
            for dp in candidates.data_parallel:
                if tp * pp * dp > candidates.max_gpus:
                    continue
                try:
                    check_parallelism(model, tp, pp)
                    check_moe_parallel(model, tp, dp, ep)
                except InvalidArgumentError:
                    continue
                layouts.append((tp, pp, dp))
    found = [
        Candidate(slug, spec, tp, pp, replicas, seqs, kv, wd, routing, dp, ep)
        for slug, spec in candidates.gpu_specs()
        for tp, pp, dp in layouts
        for replicas in range(1, candidates.max_gpus // (tp * pp * dp) + 1)
        for seqs in candidates.max_num_seqs
        for kv in candidates.kv_dtypes
        for wd in candidates.weight_dtypes
        for routing in ((None,) if replicas * dp == 1 or not candidates.routing else candidates.routing)
    ]
    return iter(sorted(found, key=Candidate.sort_key))
