"""Plan to a latency SLO: the cheapest deployment that serves a workload within a TTFT / TPOT p95 target.

    plan = plan_slo("llama-3.1-8b", SloWorkload(rate=12, prompt_len=2000, output_len=300),
                    Slo(ttft_p95_s=1.0, tpot_p95_s=0.05), SloCandidates(gpus=("h100-80gb", "l40s")))
    plan.best            # the first configuration that meets the SLO (fewest GPUs, then the cost proxy)
    plan.configs         # every configuration evaluated, ranked; plan.to_dict()["configs"] is the CLI's JSON
    latency_curve("llama-3.1-8b", plan.best, workload, slo, rates=[4, 8, 12, 16])   # p95s against the rate

The search (`core.planning.slo_candidates`): GPU type x tp x pp x replicas x max_num_seqs x KV dtype (x weight
dtype), num_gpus = tp x pp x replicas <= max_gpus, the rate split evenly over the replicas. Candidates are
visited in rank order (GPU count, then the cost proxy: total memory bandwidth) and each is
1. checked for memory by the exact planner (`core.planning.plan.plan`, vLLM's arithmetic, max_model_len = the
   longest request): one that does not fit is infeasible;
2. pruned without simulating when a bound already fails (`slo_eval.analytic_bounds`): the p95 of each
   request's prefill alone exceeds the TTFT target, one decode step of batch 1 exceeds the TPOT target, or
   an upper bound on the replica's sustainable rate is below its share of the rate;
3. otherwise simulated: `workload.num_requests` (200 by default, at most 2,000) Poisson requests through the
   continuous-batching simulator (core.sched's Scheduler, paged KV over the plan's KV tokens), each step priced
   by the step-time model (`core.planning.step_time.from_specs` with the fitted GPU efficiencies of
   `core.planning.published`). The percentiles are over all simulated requests (start-up included).
A run with a larger max_num_seqs is reused for a smaller one when provably identical (`slo_eval.reusable`).
The search stops after the GPU count at which `max_meeting` configurations met the SLO: every configuration
with fewer GPUs has been evaluated, so the first one meeting it is the cheapest. When none meets it,
`SloInfeasibleError` says which target cannot be met and by how much (never an empty answer).
"""

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from core.errors import InvalidArgumentError, SloInfeasibleError
from core.planning.models import ModelSpec, get_model
from core.planning.published import gpu_step_defaults
from core.planning.slo_candidates import Candidate, Slo, SloCandidates, SloWorkload, enumerate_candidates
from core.planning.slo_eval import (
    SloConfig,
    analytic_bounds,
    dominant_part,
    memory_plan,
    reusable,
    run_simulation,
    simulated_binding,
    step_model,
)

METRIC_LABELS = {"ttft_p95_s": "TTFT p95", "tpot_p95_s": "TPOT p95"}

__all__ = ["Slo", "SloCandidates", "SloConfig", "SloPlan", "SloWorkload", "latency_curve", "plan_slo"]


@dataclass(frozen=True, eq=False)
class SloPlan:
    """The answer. configs: every configuration evaluated, ranked: GPU count, cost proxy, then meeting the SLO
    first and the smallest slo_ratio (most headroom). best: the first that meets the SLO (always set: plan_slo
    raises otherwise). num_candidates: deployments in the search space; num_evaluated / num_simulated /
    num_reused: how many were checked, simulated, answered by an identical earlier run; complete: every
    candidate was evaluated (False: the search stopped after max_meeting, see the module docstring).
    step_time: the efficiencies and overheads of the step-time model. elapsed_s: wall seconds of the search."""

    model: str
    slo: Slo
    workload: SloWorkload
    candidates: SloCandidates
    configs: tuple[SloConfig, ...]
    num_candidates: int
    num_evaluated: int
    num_simulated: int
    num_reused: int
    complete: bool
    step_time: dict
    elapsed_s: float

    @property
    def best(self) -> SloConfig | None:
        return next((c for c in self.configs if c.meets_slo), None)

    def to_dict(self) -> dict:
        """JSON-ready: model, slo, workload, best, configs (SloConfig.to_dict each) and the search's counts."""
        best = self.best
        return {
            "model": self.model,
            "slo": asdict(self.slo),
            "workload": asdict(self.workload),
            "best": None if best is None else best.to_dict(),
            "configs": [c.to_dict() for c in self.configs],
            "num_candidates": self.num_candidates,
            "num_evaluated": self.num_evaluated,
            "num_simulated": self.num_simulated,
            "num_reused": self.num_reused,
            "complete": self.complete,
            "simulated_requests": self.workload.num_requests,
            "step_time": dict(self.step_time),
            "elapsed_s": self.elapsed_s,
        }


class _Search:
    """The caches of one search: memory plans, request lists per rate, simulations per deployment."""

    def __init__(self, model: ModelSpec, workload: SloWorkload, slo: Slo, cands: SloCandidates):
        self.model, self.workload, self.slo, self.cands = model, workload, slo, cands
        self.overrides = dict(gpu_step_defaults() if cands.step_time is None else cands.step_time)
        self.requests: dict[float, list] = {}
        self.runs: dict[tuple, list] = {}
        self.simulated = self.reused = 0

    def evaluate(self, cand: Candidate) -> SloConfig:
        workload, cands = self.workload, self.cands
        base = {
            "gpu": cand.gpu, "gpu_name": cand.spec.name, "num_gpus": cand.num_gpus, "tp": cand.tp,
            "pp": cand.pp, "replicas": cand.replicas, "max_num_seqs": cand.max_num_seqs,
            "kv_dtype": cand.kv_dtype, "weight_dtype": cand.weight_dtype,
            "gpus_per_request_per_s": cand.num_gpus / workload.rate, "cost_proxy_tb_per_s": cand.cost_proxy,
        }  # fmt: skip
        capacity = memory_plan(self.model, cand, workload, cands)
        if not capacity.fits:
            return SloConfig(**base, feasible=False, simulated=False, meets_slo=False, binding="memory",
                             reason=capacity.verdict, slo_ratio=None, limiting_metric=None)  # fmt: skip
        step = step_model(self.model, cand, self.overrides)
        rate = workload.rate / cand.replicas
        requests = self.requests.setdefault(rate, workload.requests(rate))
        bounds = analytic_bounds(
            step, requests, cand.max_num_seqs, cands.max_num_batched_tokens, capacity.kv_tokens
        )
        base |= {"feasible": True, "kv_tokens": int(capacity.kv_tokens),
                 "capacity_requests_per_s": bounds.capacity_rps * cand.replicas}  # fmt: skip
        pruned = self._pruned(step, bounds, rate, base)
        if pruned is not None:
            return pruned
        result = self._simulate(step, requests, cand, capacity, base)
        return self._simulated(result, step, cand, base)

    def _pruned(self, step, bounds, rate: float, base: dict) -> SloConfig | None:
        """A config for a candidate whose bound already fails (the worst ratio), or None."""
        targets = self.slo.targets()
        floors = {"ttft_p95_s": bounds.ttft_floor_s, "tpot_p95_s": bounds.tpot_floor_s}
        ratios = {m: floors[m] / t for m, t in targets.items() if floors[m] is not None}
        ratios["rate"] = rate / bounds.capacity_rps
        metric = max(ratios, key=ratios.get)
        if ratios[metric] <= 1.0:
            return None
        chunk = min(self.workload.prompt_len, self.cands.max_num_batched_tokens)
        ctx = self.workload.prompt_len
        if metric == "rate":
            binding = bounds.capacity_binding
            reason = (f"a replica sustains at most {bounds.capacity_rps:,.3g} req/s (upper bound), "
                      f"{rate:,.3g} asked")  # fmt: skip
        elif metric == "ttft_p95_s":
            binding = dominant_part(step, chunk, 0, chunk * (chunk + 1) / 2)
            reason = (
                f"a prompt's prefill alone takes {floors[metric]:.3g} s, over the {targets[metric]:g} s TTFT"
            )
        else:
            binding = dominant_part(step, 1, ctx, ctx + 1)
            reason = (
                f"one decode step alone takes {floors[metric]:.3g} s, over the {targets[metric]:g} s TPOT"
            )
        return SloConfig(**base, simulated=False, meets_slo=False, binding=binding, reason=reason,
                         slo_ratio=ratios[metric], limiting_metric=metric)  # fmt: skip

    def _simulate(self, step, requests, cand: Candidate, capacity, base: dict):
        key = (cand.gpu, cand.tp, cand.pp, cand.replicas, cand.kv_dtype, cand.weight_dtype)
        max_len, block = self.workload.max_len, self.cands.block_size
        for run in self.runs.get(key, []):
            if reusable(run, cand.max_num_seqs, int(capacity.kv_tokens), max_len, block):
                self.reused += 1
                base["reused_simulation"] = True
                return run
        result = run_simulation(step, requests, cand, capacity, self.cands, max_len)
        self.simulated += 1
        self.runs.setdefault(key, []).append(result)
        return result

    def _simulated(self, result, step, cand: Candidate, base: dict) -> SloConfig:
        s = result.summary
        predicted = {"ttft_p95_s": s["ttft_p95_s"], "tpot_p95_s": s.get("tpot_p95_s")}
        ratios = {m: predicted[m] / t for m, t in self.slo.targets().items() if predicted[m] is not None}
        metric = max(ratios, key=ratios.get) if ratios else "ttft_p95_s"
        meets = all(r <= 1.0 for r in ratios.values())
        binding = simulated_binding(result, cand, step, self.workload, metric)
        verb = "meets" if meets else "misses"
        reason = f"{verb} the SLO; {METRIC_LABELS[metric]} at {ratios.get(metric, 0.0):.0%} of its target"
        figures = {k: s.get(k) for k in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "tpot_p95_s",
                                        "tpot_p99_s", "e2e_p95_s", "queue_p95_s")}  # fmt: skip
        return SloConfig(
            **base, simulated=True, meets_slo=meets, binding=binding, reason=reason,
            slo_ratio=max(ratios.values()) if ratios else 0.0, limiting_metric=metric, **figures,
            throughput_tokens_per_s=s["output_throughput_tokens_per_s"] * cand.replicas,
        )  # fmt: skip


def _rank(config: SloConfig) -> tuple:
    ratio = config.slo_ratio if config.slo_ratio is not None else float("inf")
    return (config.num_gpus, config.cost_proxy_tb_per_s, not config.meets_slo, ratio, config.tp * config.pp,
            config.pp, -config.max_num_seqs, config.kv_dtype)  # fmt: skip


def plan_slo(
    model: ModelSpec | str,
    workload: SloWorkload,
    slo: Slo,
    candidates: SloCandidates | None = None,
    progress: Callable[[float], None] | None = None,
) -> SloPlan:
    """The ranked configurations that serve `workload` within `slo` (module docstring). `model`: a ModelSpec or a
    preset slug. progress(fraction): called after each candidate with the fraction of the search space visited.
    Raises SloInfeasibleError (carrying the plan) when no configuration meets the SLO, InvalidArgumentError for
    bad inputs (a non-positive SLO or rate is refused by Slo / SloWorkload)."""
    started = time.perf_counter()
    model = get_model(model) if isinstance(model, str) else model
    cands = SloCandidates() if candidates is None else candidates
    search = _Search(model, workload, slo, cands)
    space = list(enumerate_candidates(model, cands))
    configs, meeting, stop_at = [], 0, None
    for i, cand in enumerate(space):
        if stop_at is not None and cand.num_gpus > stop_at:
            break
        config = search.evaluate(cand)
        configs.append(config)
        meeting += config.meets_slo
        if meeting >= cands.max_meeting and stop_at is None:
            stop_at = cand.num_gpus
        if progress is not None:
            progress((i + 1) / len(space))
    result = SloPlan(
        model.name, slo, workload, cands, tuple(sorted(configs, key=_rank)), len(space), len(configs),
        search.simulated, search.reused, len(configs) == len(space), search.overrides,
        time.perf_counter() - started,
    )  # fmt: skip
    if result.best is None:
        raise _infeasible(result)
    return result


def latency_curve(
    model: ModelSpec | str,
    config: SloConfig,
    workload: SloWorkload,
    slo: Slo,
    rates,
    candidates: SloCandidates | None = None,
) -> list[SloConfig]:
    """One configuration (e.g. a row of `SloPlan.configs`) evaluated at each of `rates` (requests/s, the whole
    deployment), exactly as `plan_slo` evaluates it: a point the bounds already rule out is not simulated
    (`simulated` False, `limiting_metric` "rate" past the throughput bound). The knee where queueing takes over is
    the first point whose binding is "queueing" or that the throughput bound prunes. `candidates` must hold the
    config's GPU (its step_time overrides apply; default `SloCandidates()`)."""
    model = get_model(model) if isinstance(model, str) else model
    cands = SloCandidates() if candidates is None else candidates
    specs = dict(cands.gpu_specs())
    if config.gpu not in specs:
        raise InvalidArgumentError(
            f"GPU {config.gpu!r} is not among the candidates' GPUs ({', '.join(specs)})"
        )
    cand = Candidate(config.gpu, specs[config.gpu], config.tp, config.pp, config.replicas, config.max_num_seqs,
                     config.kv_dtype, config.weight_dtype)  # fmt: skip
    points = []
    for rate in rates:
        point = replace(workload, rate=rate)
        points.append(_Search(model, point, slo, cands).evaluate(cand))
    return points


def _infeasible(plan: SloPlan) -> SloInfeasibleError:
    """The error naming the target no configuration meets, with the closest configuration and its shortfall."""
    rate = plan.workload.rate
    feasible = [c for c in plan.configs if c.feasible]
    if not feasible:
        first = plan.configs[0] if plan.configs else None
        detail = f" The smallest tried, {first.num_gpus} x {first.gpu_name}: {first.reason}" if first else ""
        return SloInfeasibleError(
            f"no candidate fits {plan.model} in memory with requests of {plan.workload.max_len:,} tokens "
            f"(up to {plan.candidates.max_gpus} GPUs of {', '.join(g for g, _ in plan.candidates.gpu_specs())})."
            f"{detail} Allow more GPUs, fp8 weights or shorter requests.",
            "memory",
            None,
            None,
            None,
            plan,
        )
    closest = min(feasible, key=lambda c: c.slo_ratio)
    where = f"{closest.num_gpus} x {closest.gpu_name} (tp {closest.tp}, pp {closest.pp}, max_num_seqs " \
            f"{closest.max_num_seqs}, KV {closest.kv_dtype})"  # fmt: skip
    if closest.limiting_metric == "rate":
        best = closest.capacity_requests_per_s
        return SloInfeasibleError(
            f"no candidate can sustain {rate:g} req/s: the most any holds is {best:,.3g} req/s ({where}; an upper "
            f"bound), {closest.slo_ratio:.2f}x short. Allow more GPUs or lower the rate.",
            "rate",
            rate,
            best,
            closest.slo_ratio,
            plan,
        )
    metric = closest.limiting_metric
    target = plan.slo.targets()[metric]
    best = closest.slo_ratio * target
    return SloInfeasibleError(
        f"{METRIC_LABELS[metric]} <= {target:g} s cannot be met at {rate:g} req/s: the closest configuration, "
        f"{where}, reaches {best:.3g} s, {closest.slo_ratio:.2f}x the target ({closest.binding}-bound: "
        f"{closest.reason}).",
        metric,
        target,
        best,
        closest.slo_ratio,
        plan,
    )
