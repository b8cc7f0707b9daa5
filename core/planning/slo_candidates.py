"""The inputs of the SLO planner (`core.planning.slo.plan_slo`): the latency target (`Slo`), the traffic
(`SloWorkload`), the search space (`SloCandidates`) and its enumeration into `Candidate` deployments.

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
from core.errors import InvalidArgumentError
from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from core.planning.hardware import GPUS, GPUSpec, get_gpu
from core.planning.kv_accounting import BLOCK_SIZES, KV_DTYPES, MAX_GPUS, WEIGHT_DTYPES, check_parallelism
from core.planning.models import ModelSpec
from core.serving.workload import Request, fixed, uniform

DEFAULT_SLO_GPUS = ("l40s", "h100-80gb", "h200-141gb")
MAX_SIMULATED_REQUESTS = 2000


@dataclass(frozen=True)
class Slo:
    """The latency target: p95 time to first token and p95 time per output token, seconds (None: no bound on
    that metric; at least one is set). Raises InvalidArgumentError for zero, negative or non-finite targets."""

    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None

    def __post_init__(self):
        if self.ttft_p95_s is None and self.tpot_p95_s is None:
            raise InvalidArgumentError("an SLO needs a TTFT p95 or a TPOT p95 target (seconds), or both")
        for name, what in (("ttft_p95_s", "the TTFT p95 target"), ("tpot_p95_s", "the TPOT p95 target")):
            value = getattr(self, name)
            if value is not None:
                value = check_float(value, f"{name} ({what}, seconds)", minimum=0.0, exclusive_minimum=True)
                if value > 3600:
                    raise InvalidArgumentError(f"{name} must be at most 3,600 seconds, got {value:g}")
                object.__setattr__(self, name, value)

    def targets(self) -> dict[str, float]:
        """The bounded metrics: {"ttft_p95_s": target, "tpot_p95_s": target} (only those set)."""
        return {k: v for k, v in (("ttft_p95_s", self.ttft_p95_s), ("tpot_p95_s", self.tpot_p95_s)) if v}


@dataclass(frozen=True)
class SloWorkload:
    """The traffic: Poisson arrivals at `rate` requests/s (the whole deployment), prompts of `prompt_len` and outputs
    of `output_len` tokens. length_spread 0: every request has exactly these lengths; s in (0, 1): each length is
    uniform in [len x (1 - s), len x (1 + s)] (rounded). The simulation replays `num_requests` requests (at most
    MAX_SIMULATED_REQUESTS; the same seeded draw for every candidate, at its per-replica rate)."""

    rate: float
    prompt_len: int
    output_len: int
    length_spread: float = 0.0
    num_requests: int = 200
    seed: int = 0

    def __post_init__(self):
        rate = check_float(self.rate, "rate (requests/s)", minimum=0.0, exclusive_minimum=True)
        object.__setattr__(self, "rate", rate)
        check_int(self.prompt_len, "prompt_len (tokens)", minimum=1, maximum=1 << 22)
        check_int(self.output_len, "output_len (tokens)", minimum=1, maximum=1 << 22)
        check_float(self.length_spread, "length_spread", minimum=0.0, maximum=0.99)
        check_int(self.num_requests, "num_requests", minimum=10, maximum=MAX_SIMULATED_REQUESTS)
        check_int(self.seed, "seed", minimum=0)

    def _range(self, length: int) -> tuple[int, int]:
        return max(1, round(length * (1 - self.length_spread))), max(
            1, round(length * (1 + self.length_spread))
        )

    @property
    def max_len(self) -> int:
        """The longest request (prompt + output tokens): the deployment's max_model_len."""
        return self._range(self.prompt_len)[1] + self._range(self.output_len)[1]

    def requests(self, rate: float) -> list[Request]:
        """`num_requests` requests arriving at `rate` requests/s (Poisson, seeded: the same lengths at any rate)."""
        if self.length_spread == 0:
            return fixed(
                self.num_requests, self.prompt_len, self.output_len, rate, self.seed, max_len=self.max_len
            )
        prompts, outputs = self._range(self.prompt_len), self._range(self.output_len)
        return uniform(self.num_requests, prompts, outputs, rate, self.seed, max_len=self.max_len)


@dataclass(frozen=True)
class Candidate:
    """One deployment. gpu: the preset slug (or the custom GPU's name); num_gpus = tp x pp x replicas."""

    gpu: str
    spec: GPUSpec = field(repr=False, compare=False)
    tp: int
    pp: int
    replicas: int
    max_num_seqs: int
    kv_dtype: str
    weight_dtype: str

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def cost_proxy(self) -> float:
        """Total memory bandwidth of the deployment in TB/s (num_gpus x the GPU's)."""
        return self.num_gpus * self.spec.memory_bandwidth / 1e12

    def sort_key(self) -> tuple:
        return (self.num_gpus, self.cost_proxy, self.tp * self.pp, self.pp, -self.max_num_seqs, self.kv_dtype)

    def label(self) -> str:
        return (
            f"{self.num_gpus} x {self.spec.name} (tp {self.tp}, pp {self.pp}, {self.replicas} replica(s), "
            f"max_num_seqs {self.max_num_seqs}, KV {self.kv_dtype}, weights {self.weight_dtype})"
        )


def _int_choices(values, name: str, minimum: int, maximum: int) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise InvalidArgumentError(f"{name} needs at least one value")
    return tuple(sorted({check_int(v, name, minimum=minimum, maximum=maximum) for v in values}))


def _choices(values, allowed, name: str) -> tuple[str, ...]:
    values = tuple(values)
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise InvalidArgumentError(f"{name} must be among {', '.join(allowed)}; got {list(values)}")
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class SloCandidates:
    """The search space. gpus: preset slugs (core.planning.hardware.GPUS) or GPUSpec objects; max_gpus: most GPUs
    a deployment may use; tensor_parallel / pipeline_parallel / max_num_seqs / kv_dtypes / weight_dtypes: the
    values tried. max_num_batched_tokens (vLLM's default 8,192, as the capacity planner's), gpu_memory_utilization,
    block_size: vLLM settings shared by all.
    max_meeting: the search stops after the GPU count at which this many configurations met the SLO (every
    cheaper configuration has then been evaluated). step_time: keyword overrides of the step-time model (fitted
    efficiencies and overheads); None uses `core.planning.published.gpu_step_defaults()`."""

    gpus: tuple = DEFAULT_SLO_GPUS
    max_gpus: int = 8
    tensor_parallel: tuple[int, ...] = (1, 2, 4, 8)
    pipeline_parallel: tuple[int, ...] = (1, 2)
    max_num_seqs: tuple[int, ...] = (64, 128, 256)
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    weight_dtypes: tuple[str, ...] = ("auto",)
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_meeting: int = 5
    step_time: Mapping[str, Any] | None = None

    def __post_init__(self):
        if isinstance(self.gpus, str | GPUSpec) or not tuple(self.gpus):
            raise InvalidArgumentError(
                "gpus must be a non-empty sequence of GPU preset slugs or GPUSpec objects"
            )
        object.__setattr__(self, "gpus", tuple(self.gpus))
        for gpu in self.gpus:
            if not isinstance(gpu, GPUSpec):
                get_gpu(gpu)  # raises, listing the presets
        check_int(self.max_gpus, "max_gpus", minimum=1, maximum=MAX_GPUS)
        for name, top in (("tensor_parallel", 64), ("pipeline_parallel", 64), ("max_num_seqs", 65_536)):
            object.__setattr__(self, name, _int_choices(getattr(self, name), name, 1, top))
        object.__setattr__(self, "kv_dtypes", _choices(self.kv_dtypes, KV_DTYPES, "kv_dtypes"))
        object.__setattr__(
            self, "weight_dtypes", _choices(self.weight_dtypes, WEIGHT_DTYPES, "weight_dtypes")
        )
        check_int(self.max_num_batched_tokens, "max_num_batched_tokens", minimum=max(self.max_num_seqs))
        check_float(self.gpu_memory_utilization, "gpu_memory_utilization", minimum=0.01, maximum=1.0)
        if self.block_size not in BLOCK_SIZES:
            raise InvalidArgumentError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size!r}")
        check_int(self.max_meeting, "max_meeting", minimum=1)

    def gpu_specs(self) -> list[tuple[str, GPUSpec]]:
        """(slug or name, spec) of each GPU type."""
        return [(g.name, g) if isinstance(g, GPUSpec) else (g, GPUS[g]) for g in self.gpus]


def enumerate_candidates(model: ModelSpec, candidates: SloCandidates) -> Iterator[Candidate]:
    """Every candidate deployment with a TP/PP layout the model allows (`check_parallelism`) and at most
    max_gpus GPUs, in `Candidate.sort_key` order (GPU count, then the cost proxy)."""
    layouts = []
    for tp in candidates.tensor_parallel:
        for pp in candidates.pipeline_parallel:
            if tp * pp > candidates.max_gpus:
                continue
            try:
                check_parallelism(model, tp, pp)
            except InvalidArgumentError:
                continue
            layouts.append((tp, pp))
    found = [
        Candidate(slug, spec, tp, pp, replicas, seqs, kv, wd)
        for slug, spec in candidates.gpu_specs()
        for tp, pp in layouts
        for replicas in range(1, candidates.max_gpus // (tp * pp) + 1)
        for seqs in candidates.max_num_seqs
        for kv in candidates.kv_dtypes
        for wd in candidates.weight_dtypes
    ]
    return iter(sorted(found, key=Candidate.sort_key))
