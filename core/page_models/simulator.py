"""The Simulator page's parameters and the comparison run behind it (no streamlit: the bench times it too).

`SimulatorParams` is frozen and hashable, so the page caches one run per parameter set.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from core.errors import InvalidArgumentError
from core.kv.host_tier import host_tier_num_blocks
from core.kv.layout import kv_cache_layout
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.step_time import from_specs
from core.planning.memory.offload import GIB, check_offload_gib
from core.planning.memory.plan import plan
from core.serving.host_offload import HostOffload
from core.serving.memory_policies import POLICY_NAMES, Policy
from core.serving.paged_memory import KV_GROUP_KINDS, ONE_FULL_GROUP, PagedKVGroup, check_kv_groups
from core.serving.simulator import PAPER_KV_TOKENS, SimulationResult, SimulatorConfig, simulate
from core.serving.workload import Request, alpaca, fixed, sharegpt, uniform

DATASETS = ("sharegpt", "alpaca", "fixed", "uniform", "trace")
CAPACITY_SOURCES = ("paper", "model", "raw")


def model_kv_groups(model: str, max_model_len: int = 2048) -> tuple[PagedKVGroup, ...] | None:
    """The preset model's KV cache groups for the paged policy, from vLLM's layout (`kv_cache_layout`); None
    when the model has one group kind only or a kind the hybrid allocator does not simulate (MLA, chunked
    local, Mamba)."""
    layout = kv_cache_layout(MODELS[model], 1 << 34, max_model_len=max_model_len)
    kinds = {g.kind for g in layout.groups}
    if len(kinds) < 2 or not kinds <= set(KV_GROUP_KINDS):
        return None
    return tuple(PagedKVGroup.from_layout(g) for g in layout.groups)


@dataclass(frozen=True)
class SimulatorParams:
    """Everything one comparison depends on. Lengths in tokens, rate in requests/s (inf: all at t = 0),
    capacity in token slots, swap space in GiB, overhead in ms. kv_groups: None (every layer full attention), or
    the model's KV cache groups for the paged policy's hybrid allocator (`core.serving.paged_memory`).
    kv_offload_gib: GiB of host memory for a host KV tier behind the paged policy's pool (vLLM's
    `--kv-offloading-size`, one GPU), 0: none; it needs prefix caching. offload_policy: its eviction, lru | arc."""

    dataset: str = "sharegpt"
    num_requests: int = 1000
    rate: float = 2.0
    seed: int = 0
    n: int = 1
    prefix_len: int = 0
    prefix_fraction: float = 0.0
    prompt_len: int = 512
    output_len: int = 128
    prompt_range: tuple[int, int] = (16, 512)
    output_range: tuple[int, int] = (16, 512)
    model: str = "opt-13b"
    gpu: str = "a100-40gb"
    capacity_source: str = "paper"
    raw_capacity_tokens: int = PAPER_KV_TOKENS
    gpu_memory_utilization: float = 0.9
    policies: tuple[str, ...] = POLICY_NAMES
    block_size: int = 16
    enable_prefix_caching: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_seq_len: int = 2048
    preemption_mode: str = "recompute"
    swap_space_gib: float = 4.0
    overhead_ms: float = 15.0
    kv_groups: tuple[PagedKVGroup, ...] | None = None  # the paged policy's KV cache groups: hybrid
    kv_offload_gib: float = 0.0
    offload_policy: str = "lru"

    def __post_init__(self) -> None:
        if self.kv_groups is not None:  # (kind, num_layers, window) triples become groups here, once
            object.__setattr__(self, "kv_groups", check_kv_groups(self.kv_groups))

    def kv_capacity_tokens(self) -> int:
        """Token slots of the KV cache: the paper's 15,728, vLLM's rule for the model on the GPU, or raw."""
        if self.capacity_source == "paper":
            return PAPER_KV_TOKENS
        if self.capacity_source == "raw":
            return int(self.raw_capacity_tokens)
        if self.capacity_source == "model":
            capacity = plan(
                MODELS[self.model],
                GPUS[self.gpu],
                gpu_memory_utilization=self.gpu_memory_utilization,
                block_size=self.block_size,
                max_model_len=min(self.max_seq_len, MODELS[self.model].max_position_embeddings),
            )
            if capacity.kv_tokens < 1:
                raise InvalidArgumentError(
                    f"{MODELS[self.model].name} leaves no KV memory on one {GPUS[self.gpu].name}: {capacity.verdict}"
                )
            return int(capacity.kv_tokens)
        raise InvalidArgumentError(
            f"capacity_source must be one of {CAPACITY_SOURCES}, got {self.capacity_source!r}"
        )

    def host_offload(self, kv_bytes_per_token: float) -> HostOffload | None:
        """The host tier of `kv_offload_gib` GiB (None for 0): vLLM's capacity arithmetic on one GPU
        (`host_tier_num_blocks` of blocks of `block_size` tokens x `kv_bytes_per_token`). Raises
        InvalidArgumentError for a negative, infinite or NaN size, an unknown policy, or a tier without prefix
        caching."""
        gib = check_offload_gib(self.kv_offload_gib, "host KV tier (GiB)")
        if not gib:
            return None
        if not self.enable_prefix_caching:
            raise InvalidArgumentError(
                "a host KV tier needs prefix caching on (vLLM's offloading stores and finds blocks by their "
                "prefix-cache hash); turn prefix caching on or set the host tier to 0 GiB"
            )
        block_bytes = max(1, math.ceil(kv_bytes_per_token * self.block_size))
        blocks = host_tier_num_blocks(gib * GIB, block_bytes)
        return HostOffload(blocks * self.block_size, self.offload_policy)

    def config(self) -> SimulatorConfig:
        if self.model not in MODELS or self.gpu not in GPUS:
            raise InvalidArgumentError(f"unknown model {self.model!r} or GPU {self.gpu!r}")
        step_time = from_specs(MODELS[self.model], GPUS[self.gpu], overhead_s=self.overhead_ms / 1000.0)
        return SimulatorConfig(
            kv_capacity_tokens=self.kv_capacity_tokens(),
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_seq_len=self.max_seq_len,
            preemption_mode=self.preemption_mode,
            swap_space_bytes=self.swap_space_gib * 1024**3,
            step_time=step_time,
            offload=self.host_offload(step_time.kv_bytes_per_token),
        )

    def requests(self) -> list[Request]:
        common = {
            "rate": self.rate,
            "seed": self.seed,
            "n": self.n,
            "prefix_len": self.prefix_len,
            "prefix_fraction": self.prefix_fraction,
            "max_len": self.max_seq_len,
        }
        if self.dataset == "sharegpt":
            return sharegpt(self.num_requests, **common)
        if self.dataset == "alpaca":
            return alpaca(self.num_requests, **common)
        if self.dataset == "fixed":
            return fixed(self.num_requests, self.prompt_len, self.output_len, **common)
        if self.dataset == "uniform":
            return uniform(self.num_requests, self.prompt_range, self.output_range, **common)
        raise InvalidArgumentError(f"dataset must be one of {DATASETS[:-1]} (or an uploaded trace)")

    def policy_objects(self) -> list[Policy]:
        if not self.policies:
            raise InvalidArgumentError("choose at least one policy")
        return [
            Policy(
                name, self.block_size, self.enable_prefix_caching, self.kv_groups if name == "paged" else None
            )
            for name in self.policies
        ]


DEFAULT_PARAMS = SimulatorParams()
SATURATION = 1.2  # a saturating burst asks for this many times the pool's tokens
MAX_SATURATING_SEQS = 1_024  # requests running at once at most: beyond, a run takes minutes on the page


@dataclass(frozen=True)
class SaturatingLoad:
    """A burst meant to fill the KV pool: num_requests arrive at t = 0 and run together (max_num_seqs lets them);
    at the busiest step of their decoding they would hold peak_tokens = SATURATION x capacity_tokens if nothing
    were preempted. MAX_SATURATING_SEQS (a bound on the page's run time) can keep it below the pool: `saturates`
    is then False (num_requests is then what runs at once), and the page keeps the load set by the user. max_num_batched_tokens is at least max_num_seqs, as the scheduler requires.
    peak_per_request: tokens held per request at that busiest step, from `peak_tokens_per_request`."""

    num_requests: int
    max_num_seqs: int
    max_num_batched_tokens: int
    peak_per_request: float
    peak_tokens: int
    capacity_tokens: int

    @property
    def saturates(self) -> bool:
        return self.peak_tokens > self.capacity_tokens

    def apply(self, params: SimulatorParams) -> SimulatorParams:
        """`params` with this load: the requests arrive at once; the other settings are kept."""
        return replace(
            params,
            num_requests=self.num_requests,
            rate=math.inf,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )


def peak_tokens_per_request(
    requests: Sequence[Request], kv_groups: tuple[PagedKVGroup, ...] | None = None
) -> float:
    """KV tokens held per request at the busiest step when all `requests` start together and each sequence
    emits one token per step: max over t of the sum over unfinished requests (output_len > t), divided by the
    number of requests (a finished request frees its tokens). A request holds prompt + n x t tokens of every
    layer; with `kv_groups` (`PagedKVGroup`s) a sliding-window group's layers hold at most n x window
    of them, and the layers' average is taken, in the pool's unit (a token of every layer)."""
    prompts = np.array([r.prompt_len for r in requests], dtype=np.float64)[:, None]
    outputs = np.array([r.output_len for r in requests], dtype=np.int64)[:, None]
    samples = np.array([r.n for r in requests], dtype=np.float64)[:, None]
    t = np.arange(int(outputs.max()), dtype=np.float64)[None, :]  # [1, steps]
    full = prompts + samples * t  # [requests, steps]
    groups = kv_groups or ONE_FULL_GROUP
    layers = sum(g.num_layers for g in groups)
    held = sum(
        g.num_layers / layers * (full if g.window is None else np.minimum(full, samples * g.window))
        for g in groups
    )
    held = np.where(outputs > t, held, 0.0)
    return float(held.sum(axis=0).max()) / len(requests)


def saturating_load(params: SimulatorParams) -> SaturatingLoad:
    """The burst of `params`' workload (dataset, lengths, n, seed) whose busiest step would hold SATURATION times
    the KV capacity (`peak_tokens_per_request` on 1,000 requests of the workload, with the paged policy's KV
    groups when it is hybrid), within the page's limits. Raises InvalidArgumentError for bad parameters."""
    capacity = params.kv_capacity_tokens()
    sample = replace(params, num_requests=1_000, rate=math.inf).requests()
    per_request = peak_tokens_per_request(sample, params.kv_groups)
    count = math.ceil(SATURATION * capacity / per_request)
    seqs = min(MAX_SATURATING_SEQS, max(params.max_num_seqs, count * params.n))
    count = min(count, seqs // params.n)  # more than run at once would only lengthen the run
    tokens = max(params.max_num_batched_tokens, seqs)
    return SaturatingLoad(count, seqs, tokens, per_request, round(count * per_request), capacity)


def run_comparison(
    params: SimulatorParams,
    requests: Sequence[Request] | None = None,
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, SimulationResult]:
    """Simulate `requests` (default: generated from params) under every chosen policy, in order.

    progress(fraction, label) reports the overall fraction done. Raises InvalidArgumentError for bad
    parameters or a workload that cannot run.
    """
    if requests is None:
        requests = params.requests()
    config = params.config()
    policies = params.policy_objects()
    results: dict[str, SimulationResult] = {}
    for index, policy in enumerate(policies):

        def report(fraction: float, index: int = index, label: str = policy.label) -> None:
            if progress is not None:
                progress((index + fraction) / len(policies), label)

        # the host tier sits behind the paged pool only (Orca's contiguous allocators have no prefix cache)
        used = config if policy.name == "paged" else replace(config, offload=None)
        results[policy.name] = simulate(requests, policy, used, progress=report)
    return results


def steady_summary(result: SimulationResult, requests: Sequence[Request]) -> dict:
    """The summary over the steady state, as bench/paper.py reports it: steps ending between 10% and 100% of the
    last arrival. When every request arrives at once: from t = 0 until half the requests have finished (the
    median finish time), before the drain, where the batch shrinks because requests run out, whatever the policy.
    The whole run when the window holds no step."""
    last = max(r.arrival_time for r in requests)
    if last > 0:
        summary = result.summarize(0.1 * last, last)
        if summary["num_steps"] > 0:
            return summary
        return result.summary
    half = float(result.requests["finish_time"].quantile(0.5, interpolation="lower"))
    summary = result.summarize(None, half)
    return summary if summary["num_steps"] > 0 else result.summary
