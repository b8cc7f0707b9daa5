"""One candidate of the SLO search, evaluated: memory by the exact planner, latency floors and a throughput bound
from the step-time model (to prune before simulating), then the continuous-batching simulator in steady state.

`SloConfig` is one row of the answer; `binding` names the constraint that limits it:
- "memory": the exact planner (`core.planning.memory.plan.plan`) finds no room (weights + activations fill the usable
  memory, or one max_model_len request does not fit: the configuration is infeasible); or, simulated, the KV
  cache limited the batch: a preemption happened, or a step that left requests waiting found the cache >= 90%
  full; or, pruned, the KV cache caps the decode batch (kv_tokens // (prompt + 1) < max_num_seqs) in the
  throughput bound.
- "queueing": simulated, requests waited: the tighter target is a TTFT percentile and the same percentile of
  the queue time (arrival to first admission) is at least half of it, or a step left requests waiting with
  max_num_seqs sequences running.
- "compute" / "bandwidth": otherwise the FLOP/s roof (flops / (peak x flops_efficiency)) or the memory-traffic
  roof (weights + KV bytes / (bandwidth x bandwidth_efficiency)) is the largest part of the time that sets the
  tighter metric: for TTFT, the first prefill chunk of a prompt; for TPOT, the whole simulated run, each step's
  roof counted as the one that binds in it (`time_weighted_part`: decode steps interleaved with prefill chunks
  are what a TPOT or ITL percentile is made of); so also when the load is not served (limiting "rate").
- "interconnect" / "overhead": the tensor/pipeline-parallel traffic or the fixed per-step and per-token host time
  is the largest part of that time instead.
For a pruned candidate the step is the one of the bound that failed (the TTFT or TPOT floor), or the largest part
of the throughput bound. The tighter target is the one with the largest predicted / target ratio.
"""

import math
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.catalog.models import ModelSpec, get_model
from core.planning.cost.step_time import StepTimeModel, from_specs
from core.planning.memory.plan import CapacityPlan
from core.planning.predict.deployment import Deployment
from core.planning.predict.early_stop import (  # noqa: F401 (re-exported)
    SEARCH_SETTINGS,
    Question,
    outranked,
    verdict_decider,
    verdict_is_clear,
)
from core.planning.predict.load import Load
from core.planning.predict.prediction import replica_steady_state
from core.planning.search.slo_candidates import Candidate, SloCandidates, SloWorkload, metric_label
from core.serving.sim_result import SimulationResult
from core.serving.steady_state import SteadyState
from core.serving.workload import Request

BINDINGS = ("memory", "compute", "bandwidth", "interconnect", "overhead", "queueing")
KV_FULL = 0.9  # a waiting request with the cache this full counts as memory-bound


@dataclass(frozen=True)
class SloConfig:
    """One evaluated deployment (seconds, tokens/s; None where not computed).

    gpu: preset slug (or custom name); gpu_name; num_gpus = tp x pp x replicas; max_num_seqs, kv_dtype,
    weight_dtype. feasible: fits in memory by the exact planner (kv_tokens: its KV slots per replica).
    simulated: the simulator ran (else pruned by memory, a latency floor or the throughput bound, see reason).
    {ttft,tpot,itl,e2e}_p{50,90,95,99}_s, queue_p95_s: the steady-state percentiles of one replica at its share
    of the rate (`core.serving.steady_state`); converged: their 95% intervals are within the tolerance or clear
    of every target; outranked: simulated no further once its SLO ratio could not come below that of a
    configuration of the same GPU count and cost proxy already found to meet the SLO (`early_stop.outranked`;
    its percentiles and verdict are then those of a shorter run, converged False); dominated_by: the KV dtype of
    the same deployment (same max_num_seqs) that missed the SLO with fewer KV bytes a token, for a row not
    simulated because of it (its verdict a miss, slo_ratio None, limiting_metric and binding that row's:
    `KvMisses`); stable: the replica serves
    its share (False: overloaded, the percentiles are the horizon's);
    kv_limited: the KV cache held requests back in steady state; simulated_requests: requests simulated.
    throughput_tokens_per_s: output tokens/s of the whole deployment in steady state (replicas x one replica's:
    below capacity, the rate x the mean output length). engine: whose profile priced the steps.
    capacity_requests_per_s: an upper bound on the sustainable rate (replicas x the analytic
    bound). meets_slo: simulated and every target met. binding: module docstring (`BINDINGS`). slo_ratio: the
    largest predicted (or floor) / target over the targets, or rate / capacity when the bound pruned it (or the
    load is not served); None when infeasible or dominated. limiting_metric: which (a target's key, or "rate"). gpus_per_request_per_s:
    num_gpus / rate. cost_proxy_tb_per_s: total memory bandwidth (the rank within equal GPU counts).
    reused_simulation: the run of the same deployment with a larger max_num_seqs, provably identical (the
    larger cap and the KV difference never mattered in it). tokens_per_s_per_gpu: throughput_tokens_per_s /
    num_gpus (simulated rows).
    mode: "agg" (replicas each serving prefill and decode) or "disagg" (`core.planning.search.slo_disagg`: a prefill
    pool of prefill_workers x prefill_tp GPUs and a decode pool of decode_workers x decode_tp, prefill_gpus +
    decode_gpus = num_gpus; tp / replicas are then the decode pool's, pp 1; kv_transfer_s: seconds to move one
    prompt's K/V (kv_bytes_per_request bytes, of a workload.prompt_len prompt) over kv_link; serve_note: why
    the row is not one `vllm serve` command). These are None on aggregated rows.
    data_parallel / expert_parallel: the DP ranks per replica and EP (`Candidate`'s; num_gpus counts the ranks,
    the percentiles are one rank's at its share of the rate); vllm_parallel_flags: their `vllm serve` flags
    (aggregated rows; `core.planning.memory.vllm_command.parallel_flags`). routing: the router's policy in front of the
    replicas (`core.serving.router`), None for one replica (no
    router); a routed row's percentiles, throughput and stability are the whole fleet's (`core.serving.fleet`:
    every replica simulated behind that router at the whole rate) instead of one replica's at its share.
    routing_note: what fronts the replicas, against what a plain load balancer does (None for one replica).
    """

    gpu: str
    gpu_name: str
    num_gpus: int
    tp: int
    pp: int
    replicas: int
    max_num_seqs: int
    kv_dtype: str
    weight_dtype: str
    feasible: bool
    simulated: bool
    meets_slo: bool
    binding: str
    reason: str
    slo_ratio: float | None
    limiting_metric: str | None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_p99_s: float | None = None
    queue_p95_s: float | None = None
    throughput_tokens_per_s: float | None = None
    capacity_requests_per_s: float | None = None
    gpus_per_request_per_s: float = 0.0
    kv_tokens: int = 0
    cost_proxy_tb_per_s: float = 0.0
    reused_simulation: bool = False
    engine: str = "vllm"
    converged: bool | None = None
    stable: bool | None = None
    kv_limited: bool | None = None
    simulated_requests: int = 0
    mode: str = "agg"
    tokens_per_s_per_gpu: float | None = None
    prefill_gpus: int | None = None
    decode_gpus: int | None = None
    kv_transfer_s: float | None = None
    outranked: bool = False
    dominated_by: str | None = None
    kv_bytes_per_request: int | None = None
    kv_link: str | None = None
    prefill_workers: int | None = None
    prefill_tp: int | None = None
    decode_workers: int | None = None
    decode_tp: int | None = None
    serve_note: str | None = None
    routing: str | None = None
    routing_note: str | None = None
    data_parallel: int = 1
    expert_parallel: bool = False
    vllm_parallel_flags: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class Bounds(NamedTuple):
    """Analytic bounds for one replica: ttft_floor_s / tpot_floor_s, p95 over the requests of each one's latency
    alone on an idle replica (a lower bound on the p95); capacity_rps, an upper bound on the requests/s it
    sustains; capacity_binding, the largest part of that bound (a BINDINGS name); floors: per request, its TTFT
    ("ttft": its prefill alone), its time per output token ("tpot": one decode step of a batch of one at its
    prompt's context; empty when no request decodes) and its end-to-end latency ("e2e") alone."""

    ttft_floor_s: float
    tpot_floor_s: float | None
    capacity_rps: float
    capacity_binding: str
    floors: dict


def floor_of(bounds: Bounds, key: str) -> float | None:
    """A lower bound on the percentile `key` (e.g. "ttft_p99_s") from the per-request floors: that percentile of
    the requests' floors; for ITL, pooled over tokens, the smallest decode-step floor. None when undefined."""
    metric, quantile, _ = key.split("_")
    values = bounds.floors["tpot" if metric == "itl" else metric]
    if not len(values):
        return None
    return float(values.min() if metric == "itl" else np.percentile(values, int(quantile[1:])))


def memory_plan(model, candidate: Candidate, workload: SloWorkload, cands: SloCandidates) -> CapacityPlan:
    """The exact planner's verdict for one replica of `candidate` serving requests up to workload.max_len."""
    return candidate.deployment(model, cands).memory_plan(workload.max_len)


def step_model(model, candidate: Candidate, overrides) -> StepTimeModel:
    """The step-time model of one replica of `candidate` with these parameters (`SloCandidates.step_overrides`)."""
    moe = {}
    if candidate.data_parallel > 1 or candidate.expert_parallel:
        moe = {"data_parallel": candidate.data_parallel, "expert_parallel": candidate.expert_parallel}
    return from_specs(
        model,
        candidate.spec,
        candidate.tp,
        candidate.weight_dtype,
        candidate.kv_dtype,
        candidate.pp,
        **dict(overrides),
        **moe,
    )


def dominant_part(step: StepTimeModel, new_tokens, kv_tokens_read, attention_pairs) -> str:
    """The largest part of one step: "compute" or "bandwidth" (the larger roof), "interconnect" or "overhead"."""
    parts = step.breakdown(new_tokens, kv_tokens_read, attention_pairs)
    return _largest(
        float(parts.overhead_s), float(parts.memory_s), float(parts.compute_s), float(parts.comm_s)
    )


def _largest(overhead: float, memory: float, compute: float, comm: float) -> str:
    roof = ("compute", compute) if compute > memory else ("bandwidth", memory)
    return max((roof, ("interconnect", comm), ("overhead", overhead)), key=lambda kv: kv[1])[0]


def _prefill_prior_reads(prompts: np.ndarray, chunk: int) -> np.ndarray:
    """Sum of the chunk starts of each prompt's prefill in chunks of `chunk` (keys read besides the chunk)."""
    full, rest = np.divmod(prompts, chunk)
    return chunk * full * (full - 1) // 2 + np.where(rest > 0, full * chunk, 0)


def analytic_bounds(
    step: StepTimeModel, requests: list[Request], max_num_seqs: int, budget: int, kv_tokens: int
):
    """`Bounds` of one replica for `requests` (their lengths; arrivals ignored).

    Throughput bound: N requests need at least S = max(sum(O - 1) / B, sum(P + O - 1) / budget) steps, B =
    min(max_num_seqs, kv_tokens // (min P + 1)) (a decoding request holds at least P + 1 slots), and since a sum
    of maxima is at least the maximum of the sums, their time is at least
        S x (overhead_s + comm_latency_s) + per-token and traffic terms x tokens
        + max(weights x S + KV bytes of every token read and written, FLOPs) at the fitted roofs
    (x pipeline stages): capacity_rps = N / that. Floors: a prompt's prefill alone in `budget`-token chunks
    (TTFT), one decode step of a batch of one at the prompt's context (TPOT)."""
    prompts = np.array([r.prompt_len for r in requests], dtype=np.float64)
    outputs = np.array([r.output_len for r in requests], dtype=np.float64)
    decodes = outputs - 1
    tokens = float((prompts + decodes).sum())
    kv_read = float((_prefill_prior_reads(prompts.astype(np.int64), budget) + decodes * prompts).sum())
    kv_read += float((decodes * (decodes - 1) / 2).sum())
    pairs = float((prompts * (prompts + 1) / 2 + decodes * prompts + decodes * (decodes + 1) / 2).sum())
    kv_cap = int(kv_tokens // (prompts.min() + 1))
    batch = max(1, min(max_num_seqs, kv_cap))
    steps = max(float(decodes.sum()) / batch, tokens / budget)
    busy, parts = busy_seconds(step, steps, tokens, kv_read, pairs)
    binding = "memory" if kv_cap < max_num_seqs else _largest(*parts)
    ttft = _per_request(prompts, lambda p: step.prefill_seconds(int(p), budget))
    decode = _per_request(prompts, lambda p: step.decode_step_seconds(1, p))
    tpot = decode[outputs > 1]
    floors = {"ttft": ttft, "tpot": tpot, "e2e": ttft + decodes * decode}
    tpot_p95 = float(np.percentile(tpot, 95)) if len(tpot) else None
    return Bounds(float(np.percentile(ttft, 95)), tpot_p95, len(requests) / busy, binding, floors)


def busy_seconds(step: StepTimeModel, steps: float, tokens: float, kv_read: float, pairs: float):
    """A lower bound on the time of `steps` steps that compute `tokens` tokens, read `kv_read` keys and
    attend over `pairs` query-key pairs in all (a sum of maxima is at least the maximum of the sums):
    (busy seconds, (overhead, memory, compute, comm) seconds)."""
    stages = step.pipeline_stages
    memory = stages * (steps * step.weight_bytes + step.kv_bytes_per_token * (kv_read + tokens))
    memory /= step.memory_bandwidth * step.bandwidth_efficiency
    compute = stages * (step.flops_per_token * tokens + step.attention_flops_per_pair * pairs)
    compute /= step.peak_flops * step.flops_efficiency
    overhead = steps * step.overhead_s + step.per_token_overhead_s * tokens
    comm = steps * step.comm_latency_s + step.comm_bytes_per_token * tokens / step.interconnect_bandwidth
    return overhead + comm + max(memory, compute), (overhead, memory, compute, comm)


def _per_request(values: np.ndarray, fn) -> np.ndarray:
    """fn of each value, computed once per distinct value."""
    unique, inverse = np.unique(values, return_inverse=True)
    return np.array([fn(v) for v in unique], dtype=np.float64)[inverse]


def steady_prediction(
    deployment: Deployment,
    share: Load,
    step: StepTimeModel,
    kv_tokens: int,
    question: Question,
    fleet=None,
):
    """The steady state of one replica at its `share` of the load (`core.planning.predict.prediction.replica_steady_state`,
    counted blocks over the plan's KV tokens), simulated until the targets' percentiles' intervals are within
    SEARCH_SETTINGS' tolerance or the verdict on `question.targets` is clear of them (`verdict_is_clear`), or it
    cannot rank above a configuration that met them (`question.beat`, `early_stop.outranked`). A verdict
    needs batches long enough to trust the intervals (`SteadyState.long_enough`), except a miss by
    EARLY_MISS_MARGIN with the interval clear, or by EARLY_MISS_FAR: a shorter replay from an empty system sees
    less queueing than the steady state, so a target it misses by a margin is missed in steady state too.
    fleet: a `core.serving.fleet.Fleet`: `share` is then the whole load and the estimate the routed fleet's."""
    side = deployment.request_overhead_s()  # the engine profile's request-side term, as predict adds it
    focus = tuple(question.targets)
    return replica_steady_state(
        deployment, share, step, kv_tokens, SEARCH_SETTINGS, question.decider(), focus, fleet, None, side
    )


def simulated_binding(state: SteadyState, candidate: Candidate, step, workload, limiting: str) -> str:
    """The binding constraint of a steady-state estimate (module docstring); limiting: the target with the
    largest predicted / target ratio, or "rate" when the load is not served."""
    steps = state.result.steps
    capacity = state.result.capacity_slots or state.result.config.kv_capacity_tokens
    waited = steps["waiting"].to_numpy() > 0
    full = 1.0 - steps["free_slots"].to_numpy() / capacity >= KV_FULL
    if steps["preemptions"].sum() > 0 or (waited & full).any():
        return "memory"
    if limiting == "rate":
        return time_weighted_part(step, steps)
    metric, quantile, _ = limiting.split("_")
    m = state.metrics
    if metric == "ttft" and m.get(f"queue_{quantile}_s", 0.0) >= 0.5 * m[limiting]:
        return "queueing"
    if (waited & (steps["running_seqs"].to_numpy() >= candidate.max_num_seqs)).any():
        return "queueing"
    if metric == "ttft":
        chunk = min(workload.prompt_len, state.result.config.max_num_batched_tokens)
        return dominant_part(step, chunk, 0, chunk * (chunk + 1) / 2)
    return time_weighted_part(step, steps)


def time_weighted_part(step: StepTimeModel, steps) -> str:
    """The part of the step time that takes the most of a simulated run's time, summed over its steps (a step's
    roof counts as compute or bandwidth, whichever binds in it). Each recorded step is re-priced from its row:
    new tokens = prefill_tokens + tokens_generated, keys read = kv_tokens_read, pairs = keys read +
    prefill_tokens^2 / 2 (close enough to rank the parts)."""
    prefill = steps["prefill_tokens"].to_numpy(np.float64)
    new = prefill + steps["tokens_generated"].to_numpy(np.float64)
    kv = steps["kv_tokens_read"].to_numpy(np.float64)
    parts = step.breakdown(new, kv, kv + prefill * prefill / 2)
    compute_binds = parts.compute_s > parts.memory_s
    roof = np.maximum(parts.memory_s, parts.compute_s)
    totals = {
        "compute": float(roof[compute_binds].sum()),
        "bandwidth": float(roof[~compute_binds].sum()),
        "interconnect": float(np.broadcast_to(parts.comm_s, new.shape).sum()),
        "overhead": float(np.broadcast_to(parts.overhead_s, new.shape).sum()),
    }
    return max(totals, key=totals.get)


def reusable(
    cached: SimulationResult, max_num_seqs: int, kv_tokens: int, max_len: int, block_size: int
) -> bool:
    """Whether a run with a larger max_num_seqs is exactly the run this candidate would get (same deployment,
    rate and requests otherwise): its running sequences never exceeded max_num_seqs (so the smaller cap refuses
    nothing it admitted), and its peak KV usage plus the largest request, a block for every sequence the cap
    allows and the watermark fits in both capacities (so no admission either run made depended on memory)."""
    steps = cached.steps
    if int(steps["running_seqs"].max()) > max_num_seqs or int(steps["preemptions"].sum()):
        return False
    config = cached.config
    capacity = config.kv_capacity_tokens
    peak_used = int(capacity - steps["free_slots"].min())
    slack = (
        max_len
        + block_size * (config.max_num_seqs + 1)
        + math.ceil(config.watermark * max(capacity, kv_tokens))
    )
    return peak_used + slack <= min(capacity, kv_tokens)


def config_deployment(
    model: ModelSpec | str, config: SloConfig, candidates: SloCandidates | None = None
) -> Deployment:
    """A configuration (e.g. a row of `SloPlan.configs`) as the `Deployment` that `predict` and `max_rate`
    take, with the search's shared settings and engine; predict(..., step_time=candidates.step_time) then
    prices it as the search did. `candidates` must hold the config's GPU (default `SloCandidates()`)."""
    model = get_model(model) if isinstance(model, str) else model
    cands = SloCandidates() if candidates is None else candidates
    return config_candidate(config, cands).deployment(model, cands)


def config_candidate(config: SloConfig, cands: SloCandidates) -> Candidate:
    """The search candidate an aggregated configuration row stands for (refused for a disaggregated one)."""
    if config.mode != "agg":
        raise InvalidArgumentError(
            "a disaggregated configuration is not one Deployment: predict it with core.planning.predict.disagg "
            "(DisaggDeployment, predict_disagg)"
        )
    specs = dict(cands.gpu_specs())
    if config.gpu not in specs:
        raise InvalidArgumentError(
            f"GPU {config.gpu!r} is not among the candidates' GPUs ({', '.join(specs)})"
        )
    return Candidate(
        config.gpu,
        specs[config.gpu],
        config.tp,
        config.pp,
        config.replicas,
        config.max_num_seqs,
        config.kv_dtype,
        config.weight_dtype,
        config.routing,
        config.data_parallel,
        config.expert_parallel,
    )


def verdict_words(verb: str, metric: str, ratio: float) -> str:
    """ "misses the SLO; TTFT p95 at 106% of its target" (verb "meets" or "misses"): a simulated row's reason."""
    return f"{verb} the SLO; {metric_label(metric)} at {ratio:.0%} of its target"


class KvMisses:
    """The simulated misses of one search, by deployment and max_num_seqs with the KV dtype left out, and the rule
    that skips a wider KV cache where a narrower one missed (`Candidate.sort_key` visits the narrower dtype first).

    The KV dtype enters the step-time model only through the K/V bytes a step reads and writes
    (`StepTimeModel.kv_bytes_per_token`), so a wider cache makes every step at least as long, and with no more
    slots it admits no more requests: it meets no target the narrower one missed."""

    def __init__(self):
        # a candidate with its KV dtype blanked -> (KV bytes a token, KV slots, config) of each simulated miss
        self._missed: dict[Candidate, list[tuple[float, int, SloConfig]]] = {}

    def record(self, cand: Candidate, kv_bytes_per_token: float, kv_tokens: int, config: SloConfig) -> None:
        """Keep `config`, the simulated row of `cand`, when it misses the SLO."""
        if not config.meets_slo:
            self._missed.setdefault(replace(cand, kv_dtype=""), []).append(
                (kv_bytes_per_token, kv_tokens, config)
            )

    def dominated(
        self, cand: Candidate, kv_bytes_per_token: float, kv_tokens: int, base: dict
    ) -> SloConfig | None:
        """A miss for `cand` without simulating it (`base`: its row's fields) when the same deployment at the same
        max_num_seqs already missed with no more KV bytes a token and no fewer slots; else None. How far it
        misses is not estimated: slo_ratio None, limiting_metric and binding that miss's, `dominated_by` its KV
        dtype."""
        for kv_bytes, slots, missed in self._missed.get(replace(cand, kv_dtype=""), ()):
            if kv_bytes <= kv_bytes_per_token and slots >= kv_tokens:
                verdict = (
                    verdict_words("misses", missed.limiting_metric, missed.slo_ratio)
                    if missed.stable
                    else f"does not serve its load ({missed.reason})"
                )
                return SloConfig(
                    **base,
                    simulated=False,
                    meets_slo=False,
                    binding=missed.binding,
                    reason=(
                        f"misses the SLO, not simulated: with KV cache dtype {missed.kv_dtype} (fewer bytes a "
                        f"token, more slots) the same deployment {verdict}, and a wider cache only lengthens its "
                        "steps"
                    ),
                    slo_ratio=None,
                    limiting_metric=missed.limiting_metric,
                    dominated_by=missed.kv_dtype,
                )
        return None
