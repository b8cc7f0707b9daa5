"""Plan to a latency SLO: the cheapest deployment that serves a workload within latency targets, in steady state.

    plan = plan_slo("llama-3.1-8b", SloWorkload(rate=12, prompt_len=2000, output_len=300),
                    Slo(ttft_p99_s=1.0, tpot_p99_s=0.05), SloCandidates(gpus=("h100-80gb", "l40s")))
    plan.best            # the first configuration that meets the SLO (fewest GPUs, then the cost proxy)
    plan.configs         # every configuration evaluated, ranked; plan.to_dict()["configs"] is the CLI's JSON
    latency_curve("llama-3.1-8b", plan.best, workload, slo, rates=[4, 8, 12, 16])   # percentiles against rate

The search (`core.planning.search.slo_candidates`): GPU type x tp x pp x replicas x max_num_seqs x KV dtype (x weight
dtype) (x the routing policies, `SloCandidates.routing`, for several replicas), num_gpus = tp x pp x replicas
<= max_gpus; several replicas run as a routed fleet (`core.serving.fleet`, as `predict` runs them). Candidates are
visited in rank order (GPU count, then the cost proxy: total memory bandwidth) and each is
1. checked for memory by the exact planner (`Deployment.memory_plan`, vLLM's arithmetic, max_model_len = the
   longest request): one that does not fit is infeasible;
2. pruned without simulating when a bound already fails (`slo_eval.analytic_bounds`, over a seeded sample of
   the load's requests): a target's percentile of each request's latency alone on an idle replica exceeds the
   target (`slo_eval.floor_of`), or an upper bound on the replica's sustainable rate is below its share;
3. otherwise simulated to its steady state (`slo_eval.steady_prediction`: core.sched's Scheduler over counted
   paged blocks, each step priced by the step-time model with the engine's fitted profile,
   `core.planning.cost.fits.engine_profiles`; warm-up dropped, batch-means intervals, `core.serving.steady_state`) until
   every percentile's interval is within the tolerance or the verdict on every target is clear of it. The
   answer therefore does not depend on a request count: a longer simulation gives the same verdict. Once a
   configuration of some GPU count and cost proxy meets the SLO, a later one of the same count and cost is
   simulated only until its SLO ratio cannot come below the lowest met there (`early_stop.outranked`): it can
   no longer rank above it, so how far it misses or meets is not asked (`SloConfig.outranked`: its verdict is
   that shorter run's, as a run stopped at the request cap gives its own). The most parallel layouts are
   visited first in each such group (`Candidate.sort_key`): at equal cost they have the shortest steps and most
   often set that ratio. A candidate whose deployment (same max_num_seqs) already missed the SLO with a KV dtype
   of fewer bytes a token and no fewer slots is not simulated (`slo_eval.KvMisses`): a wider KV cache only
   lengthens the steps, so its row is that miss's verdict (`SloConfig.dominated_by`).
With `SloCandidates(disagg=True)` (`slo --disagg`) disaggregated prefill / decode deployments join the same
order and stop rule (`core.planning.search.slo_disagg`: what they cover, their bounds, their per-pool stopping).
A steady state of the same deployment with a larger max_num_seqs is reused for a smaller one when its run is
provably the one the smaller cap would get (`slo_eval.reusable`).
The search stops once `max_meeting` deployments (any max_num_seqs) met the SLO: every configuration ranked
before the last of them (fewer GPUs, or as many at a lower cost proxy) has been evaluated, so the first one meeting it is the
cheapest (configurations of equal GPU count and cost proxy are visited in `Candidate.sort_key` order). When none meets it,
`SloInfeasibleError` says which target cannot be met and by how much (never an empty answer).
"""

import heapq
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from core.planning.catalog.models import ModelSpec, get_model
from core.planning.cost.fits.profile_checks import search_check
from core.planning.memory.vllm_command import parallel_flags
from core.planning.predict.early_stop import Question
from core.planning.search.slo_candidates import (
    Candidate,
    Slo,
    SloCandidates,
    SloWorkload,
    enumerate_candidates,
    metric_label,
    routing_note,
)
from core.planning.search.slo_disagg import DisaggCandidate, DisaggEvaluator, enumerate_disagg
from core.planning.search.slo_eval import (
    KvMisses,
    SloConfig,
    analytic_bounds,
    config_candidate,
    config_deployment,
    dominant_part,
    floor_of,
    reusable,
    simulated_binding,
    steady_prediction,
    step_model,
    verdict_words,
)
from core.planning.search.slo_infeasible import infeasible_error
from core.serving.fleet import Fleet
from core.serving.steady_state import SteadyState, metric_keys

__all__ = [
    "Slo",
    "SloCandidates",
    "SloConfig",
    "SloPlan",
    "SloWorkload",
    "config_deployment",
    "latency_curve",
    "plan_slo",
]


@dataclass(frozen=True, eq=False)
class SloPlan:
    """The answer. configs: every configuration evaluated, ranked: GPU count, cost proxy, then meeting the SLO
    first and the smallest slo_ratio (most headroom). best: the first that meets the SLO (always set: plan_slo
    raises otherwise). num_candidates: deployments in the search space; num_evaluated / num_simulated /
    num_reused: how many were checked, simulated, answered by an identical earlier run; complete: every
    candidate was evaluated (False: the search stopped after max_meeting, see the module docstring).
    step_time: the efficiencies and overheads of the step-time model. elapsed_s: wall seconds of the search.
    profile_check: the profile's measured errors for the model and each GPU type (`profile_checks.search_check`)."""

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
    profile_check: dict | None = None

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
            "simulated_requests": sum(c.simulated_requests for c in self.configs if not c.reused_simulation),
            "engine": self.candidates.engine,
            "step_time": dict(self.step_time),
            "elapsed_s": self.elapsed_s,
            "profile_check": self.profile_check,
        } | ({"vllm_version": self.candidates.vllm_version} if self.candidates.vllm_version else {})


# routers whose choices never read a replica's state (queue, KV usage, cache): a fleet's run behind one is reusable
STATE_BLIND_ROUTING = ("round-robin", "random", "session")
BOUND_SAMPLE = 500  # requests whose lengths the analytic bounds are taken over (a seeded draw of the load)


class _Search:
    """The caches of one search: request samples per rate, steady states per deployment."""

    def __init__(self, model: ModelSpec, workload: SloWorkload, slo: Slo, cands: SloCandidates):
        self.model, self.workload, self.slo, self.cands = model, workload, slo, cands
        self.overrides = cands.step_overrides()
        self.samples: dict[float, list] = {}
        self.runs: dict[tuple, list] = {}
        self.simulated = self.reused = 0
        self.best_ratio: dict[tuple, float] = {}  # (num_gpus, cost proxy) -> the lowest SLO ratio met there
        self.misses = KvMisses()
        self.disagg = (
            DisaggEvaluator(model, workload, slo, cands, self.overrides, BOUND_SAMPLE)
            if cands.disagg
            else None
        )

    @property
    def num_simulated(self) -> int:
        return self.simulated + (self.disagg.simulated if self.disagg is not None else 0)

    def evaluate(self, cand: Candidate | DisaggCandidate) -> SloConfig:
        config = self.disagg.evaluate(cand) if isinstance(cand, DisaggCandidate) else self._aggregated(cand)
        if config.meets_slo:
            group = _group(config.num_gpus, config.cost_proxy_tb_per_s)
            self.best_ratio[group] = min(self.best_ratio.get(group, config.slo_ratio), config.slo_ratio)
        return config

    def _aggregated(self, cand: Candidate) -> SloConfig:
        workload, cands = self.workload, self.cands
        base = {
            "gpu": cand.gpu,
            "gpu_name": cand.spec.name,
            "num_gpus": cand.num_gpus,
            "tp": cand.tp,
            "pp": cand.pp,
            "replicas": cand.replicas,
            "max_num_seqs": cand.max_num_seqs,
            "kv_dtype": cand.kv_dtype,
            "weight_dtype": cand.weight_dtype,
            "engine": cands.engine,
            "gpus_per_request_per_s": cand.num_gpus / workload.rate,
            "cost_proxy_tb_per_s": cand.cost_proxy,
            "routing": cand.routing,
            "routing_note": routing_note(cand.routing, cand.ranks),
            "data_parallel": cand.data_parallel,
            "expert_parallel": cand.expert_parallel,
            "vllm_parallel_flags": parallel_flags(cand.tp, cand.pp, cand.data_parallel, cand.expert_parallel),
        }
        deployment = cand.deployment(self.model, cands)
        capacity = deployment.memory_plan(workload.max_len)
        if not capacity.fits:
            return SloConfig(
                **base,
                feasible=False,
                simulated=False,
                meets_slo=False,
                binding="memory",
                reason=capacity.verdict,
                slo_ratio=None,
                limiting_metric=None,
            )
        step = step_model(self.model, cand, self.overrides)
        share = workload.per_replica(cand.ranks)
        sample = self.samples.setdefault(share.rate, share.requests(BOUND_SAMPLE))
        bounds = analytic_bounds(
            step, sample, cand.max_num_seqs, cands.max_num_batched_tokens, capacity.kv_tokens
        )
        base |= {
            "feasible": True,
            "kv_tokens": int(capacity.kv_tokens),
            "capacity_requests_per_s": bounds.capacity_rps * cand.ranks,
        }
        # a prefix hit skips part of a prefill: the floors and the bound (every prompt token computed) would not
        # bound a load whose prompts share tokens, so such a load is always simulated
        pruned = None if workload.uses_prefix_cache else self._pruned(step, bounds, share.rate, base)
        if pruned is not None:
            return pruned
        kv_tokens = int(capacity.kv_tokens)
        dominated = self.misses.dominated(cand, step.kv_bytes_per_token, kv_tokens, base)
        if dominated is not None:
            return dominated
        state = self._steady(deployment, share, step, cand, kv_tokens, base)
        config = self._simulated(state, step, cand, base)
        self.misses.record(cand, step.kv_bytes_per_token, kv_tokens, config)
        return config

    def _pruned(self, step, bounds, rate: float, base: dict) -> SloConfig | None:
        """A config for a candidate whose bound already fails (the worst ratio), or None."""
        targets = self.slo.targets()
        floors = {key: floor_of(bounds, key) for key in targets}
        ratios = {key: floors[key] / target for key, target in targets.items() if floors[key] is not None}
        ratios["rate"] = rate / bounds.capacity_rps
        metric = max(ratios, key=ratios.get)
        if ratios[metric] <= 1.0:
            return None
        chunk = min(self.workload.prompt_len, self.cands.max_num_batched_tokens)
        ctx = self.workload.prompt_len
        if metric == "rate":
            binding = bounds.capacity_binding
            reason = (
                f"a replica sustains at most {bounds.capacity_rps:,.3g} req/s (upper bound), "
                f"{rate:,.3g} asked"
            )
        elif metric.startswith("ttft"):
            binding = dominant_part(step, chunk, 0, chunk * (chunk + 1) / 2)
            reason = (
                f"a prompt's prefill alone takes {floors[metric]:.3g} s, over the {targets[metric]:g} s "
                f"{metric_label(metric)}"
            )
        else:
            binding = dominant_part(step, 1, ctx, ctx + 1)
            alone = "one decode step" if not metric.startswith("e2e") else "a request alone"
            reason = (
                f"{alone} takes {floors[metric]:.3g} s, over the {targets[metric]:g} s {metric_label(metric)}"
            )
        return SloConfig(
            **base,
            simulated=False,
            meets_slo=False,
            binding=binding,
            reason=reason,
            slo_ratio=ratios[metric],
            limiting_metric=metric,
        )

    def _steady(self, deployment, share, step, cand: Candidate, kv_tokens: int, base: dict) -> SteadyState:
        """The replica's steady state, or an earlier one of the same deployment with a larger max_num_seqs
        whose run is provably the one this candidate would get (`reusable`). A routed deployment
        (`Deployment.routes`): the whole fleet's behind its router, at the whole rate; reused only under a router
        blind to the replicas' state (`STATE_BLIND_ROUTING`: each replica then gets the same requests in both
        runs, and `reusable` holds per replica, the fleet's steps being every replica's rows)."""
        routed = cand.routing is not None and deployment.routes(self.workload)  # no --routing: the even split
        key = cand.deployment_key()
        max_len, block = self.workload.max_len, self.cands.block_size
        if not routed or deployment.routing in STATE_BLIND_ROUTING:
            for state in self.runs.get(key, []):
                if reusable(state.result, cand.max_num_seqs, kv_tokens, max_len, block):
                    self.reused += 1
                    base["reused_simulation"] = True
                    return state
        question = self._question(cand)
        if routed:
            fleet = Fleet(cand.ranks, deployment.routing, self.workload.seed)
            state = steady_prediction(deployment, self.workload, step, kv_tokens, question, fleet)
        else:
            state = steady_prediction(deployment, share, step, kv_tokens, question)
        self.simulated += 1
        self.runs.setdefault(key, []).append(state)
        return state

    def _question(self, cand: Candidate) -> Question:
        """The targets, and the lowest SLO ratio met so far by a configuration of `cand`'s GPU count and cost."""
        return Question(self.slo.targets(), self.best_ratio.get(_group(cand.num_gpus, cand.cost_proxy)))

    def _simulated(self, state: SteadyState, step, cand: Candidate, base: dict) -> SloConfig:
        m, targets = state.metrics, self.slo.targets()
        routed = cand.routing is not None and cand.ranks > 1
        ratios = {key: m[key] / target for key, target in targets.items() if m.get(key) is not None}
        if not state.stable:
            served = m.get("throughput_tokens_per_s") or 0.0
            metric, ratio = "rate", m.get("offered_tokens_per_s", 0.0) / max(served, 1e-30)
            who = f"the {cand.routing}-routed fleet" if routed else "a replica"
            reason = (
                f"the load is not served: {who} generates {served:,.0f} of the "
                f"{m.get('offered_tokens_per_s', 0.0):,.0f} output tokens/s that arrive"
            )
        else:
            metric = max(ratios, key=ratios.get) if ratios else next(iter(targets))
            ratio = ratios.get(metric, 0.0)
            verb = "meets" if ratio <= 1.0 and all(r <= 1.0 for r in ratios.values()) else "misses"
            reason = verdict_words(verb, metric, ratio)
        meets = state.stable and all(r <= 1.0 for r in ratios.values())
        question = self._question(cand)
        stopped_outranked = question.stopped_outranked(state)
        if stopped_outranked:
            reason += (
                f"; simulated no further: its SLO ratio cannot come below {question.beat:.0%}, met by a "
                "configuration of the same GPUs"
            )
        figures = {key: m.get(key) for key in (*metric_keys(), "queue_p95_s")}
        throughput = m.get("throughput_tokens_per_s")
        if throughput is not None and not routed:  # a routed fleet's throughput is already the whole fleet's
            throughput *= cand.ranks
        return SloConfig(
            **base,
            simulated=True,
            meets_slo=meets,
            reason=reason,
            slo_ratio=ratio,
            limiting_metric=metric,
            binding=simulated_binding(state, cand, step, self.workload, metric),
            **figures,
            throughput_tokens_per_s=throughput,
            tokens_per_s_per_gpu=None if throughput is None else throughput / cand.num_gpus,
            converged=state.converged or (state.decided and not stopped_outranked),
            outranked=stopped_outranked,
            stable=state.stable,
            kv_limited=state.kv_limited,
            simulated_requests=state.simulated_requests,
        )


def _group(num_gpus: int, cost_proxy: float) -> tuple:
    """Configurations the rank cannot tell apart but by verdict and SLO ratio (`_rank`)."""
    return (num_gpus, round(cost_proxy, 9))


def _rank(config: SloConfig) -> tuple:
    ratio = config.slo_ratio if config.slo_ratio is not None else float("inf")
    return (
        config.num_gpus,
        config.cost_proxy_tb_per_s,
        not config.meets_slo,
        ratio,
        config.tp * config.pp,
        config.pp,
        -config.max_num_seqs,
        config.kv_dtype,
        config.mode,
        config.routing or "",
    )


def search_space(model: ModelSpec, cands: SloCandidates) -> list[Candidate | DisaggCandidate]:
    """The candidates in visiting order: the aggregated ones (`enumerate_candidates`), merged with the
    disaggregated ones when cands.disagg (`enumerate_disagg`) by GPU count, then the cost proxy (an aggregated
    candidate first on a tie)."""
    space = list(enumerate_candidates(model, cands))
    if not cands.disagg:
        return space
    rank = lambda c: (c.num_gpus, c.cost_proxy)  # noqa: E731
    return list(heapq.merge(space, enumerate_disagg(model, cands), key=rank))


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
    space = search_space(model, cands)
    configs, meeting = [], set()
    for i, cand in enumerate(space):
        config = search.evaluate(cand)
        configs.append(config)
        if config.meets_slo:
            meeting.add(cand.deployment_key())
        if progress is not None:
            progress((i + 1) / len(space))
        if len(meeting) >= cands.max_meeting:
            break
    result = SloPlan(
        model.name,
        slo,
        workload,
        cands,
        tuple(sorted(configs, key=_rank)),
        len(space),
        len(configs),
        search.num_simulated,
        search.reused,
        len(configs) == len(space),
        search.overrides,
        time.perf_counter() - started,
        search_check(cands.engine, model, cands.gpu_specs(), cands.vllm_version),
    )
    if result.best is None:
        raise infeasible_error(result)
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
    cand = config_candidate(config, cands)
    points = []
    for rate in rates:
        point = replace(workload, rate=rate)
        points.append(_Search(model, point, slo, cands).evaluate(cand))
    return points
