"""Disaggregated deployments in the SLO search (`SloCandidates(disagg=True)`, `python -m core.planning slo
--disagg`): x prefill workers of tp_p GPUs and y decode workers of tp_d GPUs of one GPU type, predicted by
`core.planning.predict.disagg.predict_disagg` (DistServe, Zhong et al., OSDI 2024), ranked with the aggregated
candidates by GPU count, then the cost proxy (total memory bandwidth).

The space (`enumerate_disagg`): tp_p, tp_d among the candidates' tensor_parallel values the model allows with
pp 1; x, y >= 1 with x tp_p + y tp_d <= max_gpus; each KV and weight dtype; max_num_seqs the largest candidate
value only (both pools; bounding the search: a smaller cap is what the aggregated candidates explore). Over 8
GPUs the K/V moves over the network, so a GPU without a known NIC bandwidth has no such candidate.

Each is evaluated as an aggregated candidate is (`core.planning.search.slo`), pool by pool:
1. memory: each pool's worker by the exact planner (prefill: requests of prompt_len + 1 tokens, as
   predict_disagg's prefill pool; decode: max_len); one that does not fit is infeasible;
2. bounds: the prefill pool's `slo_eval.analytic_bounds` over the load with one output token (its capacity, its
   TTFT floor), the decode pool's `decode_pool_bounds` (the same arithmetic for steps that compute only the
   first and the decode tokens: its capacity, TPOT floor, first-token floor) and the KV link (a prefill
   worker's link busy rate / x * kv_transfer_s of the time). A target's floor is built as predict_disagg adds
   its parts: TTFT / e2e = the prefill pool's TTFT floor + kv_transfer_s + the decode pool's TTFT / e2e floor
   (the same percentile of each); TPOT / ITL the decode pool's. A floor over a target, or a rate over a
   capacity, prunes the candidate;
3. otherwise `predict_disagg` with `SEARCH_SETTINGS`, each pool's simulation stopped once its verdict is clear
   (`pool_deciders`): the prefill pool against target - transfer - the decode pool's floor, the decode pool
   against target - transfer - the prefill pool's interval (its low end for a miss, its high end for a met).
Left out: smaller max_num_seqs per pool, pipeline parallelism and different GPU types per pool, the prefill
and decode pools' own `vllm serve` flags (a row is two commands and a KV connector: `serve_note`).
"""

from dataclasses import dataclass, field, replace

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUSpec
from core.planning.memory.kv_accounting import check_parallelism
from core.planning.predict.disagg import (
    GPUS_PER_NODE,
    DisaggDeployment,
    DisaggPrediction,
    PrefillDecodeSplit,
    predict_disagg,
)
from core.planning.predict.max_rate import SEARCH_SETTINGS
from core.planning.search.slo_candidates import Candidate, SloCandidates, metric_label
from core.planning.search.slo_eval import (
    Bounds,
    SloConfig,
    analytic_bounds,
    busy_seconds,
    dominant_part,
    floor_of,
    simulated_binding,
    step_model,
    verdict_decider,
)
from core.serving.steady_state import metric_keys

SERVE_NOTE = (
    "disaggregated: not one `vllm serve` command; the prefill and the decode workers each run their own, "
    "joined by a KV connector (vLLM's NixlConnector: --kv-transfer-config on both), and a proxy sends each request "
    "to a prefill worker, then to a decode worker"
)
# The KV connector flag of both pools: vLLM V1's NixlConnector, each instance both sending and receiving KV (its
# disaggregated-prefill examples start prefill and decode instances alike with it)
KV_TRANSFER_FLAG = """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""


@dataclass(frozen=True)
class DisaggCandidate(PrefillDecodeSplit):
    """One disaggregated deployment: prefill_workers x prefill_tp GPUs prefill, decode_workers x decode_tp
    decode, one GPU type, pp 1."""

    gpu: str
    spec: GPUSpec = field(repr=False, compare=False)
    prefill_workers: int
    prefill_tp: int
    decode_workers: int
    decode_tp: int
    max_num_seqs: int
    kv_dtype: str
    weight_dtype: str

    @property
    def cost_proxy(self) -> float:
        """Total memory bandwidth in TB/s, as `Candidate.cost_proxy`."""
        return self.num_gpus * self.spec.memory_bandwidth / 1e12

    def sort_key(self) -> tuple:
        return (
            self.num_gpus,
            self.cost_proxy,
            self.decode_tp,
            self.prefill_tp,
            self.prefill_workers,
            self.kv_dtype,
        )

    def deployment_key(self) -> tuple:
        return (
            "disagg",
            self.gpu,
            self.prefill_workers,
            self.prefill_tp,
            self.decode_workers,
            self.decode_tp,
            self.kv_dtype,
            self.weight_dtype,
        )

    def pool(self, role: str) -> Candidate:
        """The prefill or decode pool as an aggregated `Candidate` (its workers as replicas)."""
        workers, tp = (
            (self.prefill_workers, self.prefill_tp)
            if role == "prefill"
            else (self.decode_workers, self.decode_tp)
        )
        return Candidate(
            self.gpu, self.spec, tp, 1, workers, self.max_num_seqs, self.kv_dtype, self.weight_dtype
        )

    def deployment(self, model, cands: SloCandidates) -> DisaggDeployment:
        return DisaggDeployment.of(
            model,
            self.spec,
            (self.prefill_workers, self.prefill_tp),
            (self.decode_workers, self.decode_tp),
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=cands.max_num_batched_tokens,
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            engine=cands.engine,
            block_size=cands.block_size,
            gpu_memory_utilization=cands.gpu_memory_utilization,
        )


def enumerate_disagg(model, cands: SloCandidates) -> list[DisaggCandidate]:
    """Every disaggregated candidate (module docstring), in `DisaggCandidate.sort_key` order."""
    tps = []
    for tp in cands.tensor_parallel:
        try:
            check_parallelism(model, tp, 1)
        except InvalidArgumentError:
            continue
        tps.append(tp)
    seqs, top = max(cands.max_num_seqs), cands.max_gpus
    found = [
        DisaggCandidate(slug, spec, x, tp_p, y, tp_d, seqs, kv, wd)
        for slug, spec in cands.gpu_specs()
        for tp_p in tps
        for tp_d in tps
        for x in range(1, (top - tp_d) // tp_p + 1)
        for y in range(1, (top - x * tp_p) // tp_d + 1)
        if x * tp_p + y * tp_d <= GPUS_PER_NODE or spec.network_bandwidth
        for kv in cands.kv_dtypes
        for wd in cands.weight_dtypes
    ]
    return sorted(found, key=DisaggCandidate.sort_key)


def decode_pool_bounds(step, requests, max_num_seqs: int, kv_tokens: int) -> Bounds:
    """`Bounds` of one decode worker whose prompts' K/V arrive (`core.planning.predict.disagg.ArrivedKVStepTime`):
    per request, O tokens are computed (the first from the last prompt token, reading the P prompt keys, then
    O - 1 decodes reading P and the tokens before), in at least sum(O - 1) / B steps that compute anything, B =
    min(max_num_seqs, kv_tokens // (min P + 1)); capacity_rps = N / `busy_seconds` of that. Floors: "ttft" the
    first token's step alone, "tpot" one decode step of a batch of one at the prompt's context, "e2e" both."""
    prompts = np.array([r.prompt_len for r in requests], dtype=np.float64)
    outputs = np.array([r.output_len for r in requests], dtype=np.float64)
    decodes = outputs - 1
    tokens = float(outputs.sum())
    kv_read = float((prompts + decodes * prompts + decodes * (decodes - 1) / 2).sum())
    pairs = float((prompts + decodes * prompts + decodes * (decodes + 1) / 2).sum())
    kv_cap = int(kv_tokens // (prompts.min() + 1))
    batch = max(1, min(max_num_seqs, kv_cap))
    busy, parts = busy_seconds(step, float(decodes.sum()) / batch, tokens, kv_read, pairs)
    overhead, memory, compute, comm = parts
    roof = ("compute", compute) if compute > memory else ("bandwidth", memory)
    largest = max((roof, ("interconnect", comm), ("overhead", overhead)), key=lambda kv: kv[1])[0]
    first = _each(prompts, lambda p: step.step_seconds(1, p, p))
    decode = _each(prompts, lambda p: step.decode_step_seconds(1, p))
    floors = {"ttft": first, "tpot": decode[outputs > 1], "e2e": first + decodes * decode}
    tpot = float(np.percentile(floors["tpot"], 95)) if len(floors["tpot"]) else None
    binding = "memory" if kv_cap < max_num_seqs else largest
    return Bounds(float(np.percentile(first, 95)), tpot, len(requests) / max(busy, 1e-30), binding, floors)


def _each(values: np.ndarray, fn) -> np.ndarray:
    unique, inverse = np.unique(values, return_inverse=True)
    return np.array([fn(v) for v in unique], dtype=np.float64)[inverse]


def _prefill_key(key: str) -> str:
    """The prefill pool's part of a TTFT or e2e target: its TTFT at the same percentile."""
    return f"ttft_{key.split('_')[1]}_s"


def disagg_floors(targets: dict, pre: Bounds, dec: Bounds, transfer: float) -> dict:
    """A lower bound on each target's percentile as predict_disagg composes it (module docstring)."""
    out = {}
    for key in targets:
        decode = floor_of(dec, key)
        if key.startswith(("ttft", "e2e")):
            out[key] = floor_of(pre, _prefill_key(key)) + transfer + (decode or 0.0)
        elif decode is not None:
            out[key] = decode
    return out


def pool_deciders(targets: dict, dec: Bounds, transfer: float):
    """(decided, focus) for predict_disagg (module docstring, step 3)."""
    chained = [key for key in targets if key.startswith(("ttft", "e2e"))]
    prefill_targets: dict[str, float] = {}
    for key in chained:
        budget = targets[key] - transfer - (floor_of(dec, key) or 0.0)
        pk = _prefill_key(key)
        prefill_targets[pk] = min(budget, prefill_targets.get(pk, budget))
    first = verdict_decider(prefill_targets) if prefill_targets else None

    def decided(pool: str, estimate, prefill) -> bool:
        if pool == "prefill":
            return True if first is None else first(estimate)
        miss, met = dict(targets), dict(targets)
        for key in chained:
            pk = _prefill_key(key)
            point = prefill.metrics.get(pk, 0.0)
            low, high = prefill.intervals.get(pk, (point, point))
            miss[key] = targets[key] - transfer - low
            met[key] = targets[key] - transfer - high
        return verdict_decider(miss, met)(estimate)

    focus = {"prefill": tuple(prefill_targets) or None, "decode": tuple(targets)}
    return decided, focus


class DisaggEvaluator:
    """Evaluates disaggregated candidates for one search (`core.planning.search.slo._Search`): the pools' memory plans
    and bounds are cached per pool layout."""

    def __init__(self, model, workload, slo, cands: SloCandidates, overrides: dict, sample_size: int):
        self.model, self.workload, self.slo, self.cands = model, workload, slo, cands
        self.overrides = overrides
        self.prefill_load = replace(workload, output_len=1)
        self.samples = {
            "prefill": self.prefill_load.requests(sample_size),
            "decode": workload.requests(sample_size),
        }
        self.pools: dict[tuple, tuple] = {}
        self.simulated = 0

    def _pool(self, cand: DisaggCandidate, role: str):
        """(capacity plan, step model, bounds or None) of one worker of the pool."""
        pool = cand.pool(role)
        key = (role, pool.gpu, pool.tp, pool.kv_dtype, pool.weight_dtype)
        if key not in self.pools:
            load = self.prefill_load if role == "prefill" else self.workload
            capacity = pool.deployment(self.model, self.cands).memory_plan(load.max_len)
            step = step_model(self.model, pool, self.overrides)
            bounds = None
            if capacity.fits:
                budget, kv = self.cands.max_num_batched_tokens, int(capacity.kv_tokens)
                sample = self.samples[role]
                if role == "prefill":
                    # prompts only: no decode batch for the KV cache to cap, the chunk's roof binds
                    bounds = analytic_bounds(step, sample, pool.max_num_seqs, budget, kv)
                    chunk = min(self.workload.prompt_len, budget)
                    binding = dominant_part(step, chunk, 0, chunk * (chunk + 1) / 2)
                    bounds = bounds._replace(capacity_binding=binding)
                else:
                    bounds = decode_pool_bounds(step, sample, pool.max_num_seqs, kv)
            self.pools[key] = (capacity, step, bounds)
        return self.pools[key]

    def _facts(self, cand: DisaggCandidate, deployment) -> dict:
        """What an SloConfig of `cand` says whatever its verdict: the deployment, its GPUs and the KV hand-off."""
        prompt = self.workload.prompt_len
        return {
            "gpu": cand.gpu,
            "gpu_name": cand.spec.name,
            "num_gpus": cand.num_gpus,
            "tp": cand.decode_tp,
            "pp": 1,
            "replicas": cand.decode_workers,
            "max_num_seqs": cand.max_num_seqs,
            "kv_dtype": cand.kv_dtype,
            "weight_dtype": cand.weight_dtype,
            "engine": self.cands.engine,
            "gpus_per_request_per_s": cand.num_gpus / self.workload.rate,
            "cost_proxy_tb_per_s": cand.cost_proxy,
            "mode": "disagg",
            "prefill_gpus": cand.prefill_gpus,
            "decode_gpus": cand.decode_gpus,
            "kv_transfer_s": deployment.kv_transfer_seconds(prompt),
            "kv_bytes_per_request": deployment.kv_bytes_per_request(prompt),
            "kv_link": deployment.link,
            "prefill_workers": cand.prefill_workers,
            "prefill_tp": cand.prefill_tp,
            "decode_workers": cand.decode_workers,
            "decode_tp": cand.decode_tp,
            "serve_note": SERVE_NOTE,
        }

    def evaluate(self, cand: DisaggCandidate) -> SloConfig:
        deployment = cand.deployment(self.model, self.cands)
        base = self._facts(cand, deployment)
        pools = {role: self._pool(cand, role) for role in ("prefill", "decode")}
        for role, (capacity, _, _) in pools.items():
            if not capacity.fits:
                return SloConfig(
                    **base,
                    feasible=False,
                    simulated=False,
                    meets_slo=False,
                    binding="memory",
                    reason=f"a {role} worker does not fit: {capacity.verdict}",
                    slo_ratio=None,
                    limiting_metric=None,
                )
        pre, dec = pools["prefill"][2], pools["decode"][2]
        transfer = base["kv_transfer_s"]
        capacities = {
            "prefill": pre.capacity_rps * cand.prefill_workers,
            "decode": dec.capacity_rps * cand.decode_workers,
            "link": cand.prefill_workers / transfer,
        }
        base |= {
            "feasible": True,
            "kv_tokens": int(pools["decode"][0].kv_tokens),
            "capacity_requests_per_s": min(capacities.values()),
        }
        targets = self.slo.targets()
        floors = disagg_floors(targets, pre, dec, transfer)
        ratios = {key: floors[key] / target for key, target in targets.items() if key in floors}
        pool = min(capacities, key=capacities.get)
        ratios["rate"] = self.workload.rate / capacities[pool]
        metric = max(ratios, key=ratios.get)
        if ratios[metric] > 1.0:
            if metric == "rate":
                binding = (
                    "interconnect" if pool == "link" else (pre if pool == "prefill" else dec).capacity_binding
                )
                what = (
                    "the prefill workers' KV links sustain" if pool == "link" else f"the {pool} pool sustains"
                )
                reason = (
                    f"{what} at most {capacities[pool]:,.3g} req/s (upper bound), "
                    f"{self.workload.rate:g} asked"
                )
            else:
                binding = "compute" if metric.startswith(("ttft", "e2e")) else "bandwidth"
                reason = (
                    f"{metric_label(metric)} is at least {floors[metric]:.3g} s (prefill, KV transfer and "
                    f"decode alone), over the {targets[metric]:g} s target"
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
        decided, focus = pool_deciders(targets, dec, transfer)
        prediction = predict_disagg(
            deployment, self.workload, self.cands.step_time, SEARCH_SETTINGS, decided, focus
        )
        self.simulated += 1
        return self._simulated(prediction, cand, pools, base)

    def _simulated(self, p: DisaggPrediction, cand: DisaggCandidate, pools: dict, base: dict) -> SloConfig:
        m, targets = p.metrics, self.slo.targets()
        ratios = {key: m[key] / target for key, target in targets.items() if m.get(key) is not None}
        prefill, decode = p.prefill.state, p.decode
        if not p.stable:
            metric = "rate"
            if p.kv_link_utilization >= 1.0:
                ratio, binding = p.kv_link_utilization, "interconnect"
                reason = f"the KV link of a prefill worker is busy {ratio:.0%} of the time"
            else:
                role, state = ("prefill", prefill) if not prefill.stable else ("decode", decode)
                offered = state.metrics.get("offered_tokens_per_s", 0.0)
                served = state.metrics.get("throughput_tokens_per_s") or 0.0
                ratio = offered / max(served, 1e-30)
                binding = simulated_binding(state, cand.pool(role), pools[role][1], self.workload, "rate")
                reason = f"the load is not served: the {role} pool falls {ratio:.2f}x short"
        else:
            metric = max(ratios, key=ratios.get) if ratios else next(iter(targets))
            ratio = ratios.get(metric, 0.0)
            met = ratio <= 1.0 and all(r <= 1.0 for r in ratios.values())
            reason = (
                f"{'meets' if met else 'misses'} the SLO; {metric_label(metric)} at {ratio:.0%} of its target"
            )
            role, key = "decode", metric
            if metric.startswith(("ttft", "e2e")):
                pk = _prefill_key(metric)
                if (prefill.metrics.get(pk) or 0.0) >= (decode.metrics.get(metric) or 0.0):
                    role, key = "prefill", pk
            state = prefill if role == "prefill" else decode
            binding = simulated_binding(state, cand.pool(role), pools[role][1], self.workload, key)
        meets = p.stable and all(r <= 1.0 for r in ratios.values())
        figures = {key: m.get(key) for key in metric_keys()}
        throughput = m.get("throughput_tokens_per_s")
        return SloConfig(
            **base,
            simulated=True,
            meets_slo=meets,
            reason=reason,
            slo_ratio=ratio,
            limiting_metric=metric,
            binding=binding,
            **figures,
            queue_p95_s=prefill.metrics.get("queue_p95_s"),
            throughput_tokens_per_s=throughput,
            tokens_per_s_per_gpu=m.get("tokens_per_s_per_gpu"),
            converged=(prefill.converged or prefill.decided) and (decode.converged or decode.decided),
            stable=p.stable,
            kv_limited=prefill.kv_limited or decode.kv_limited,
            simulated_requests=prefill.simulated_requests + decode.simulated_requests,
        )
