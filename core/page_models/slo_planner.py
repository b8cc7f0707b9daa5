"""What the SLO planner page computes: the search (`core.planning.search.slo.plan_slo`) for its inputs, the configurations
its chart draws, their latency against the request rate (`latency_curve`), the knee of each curve, the ranked
table's rows and the `vllm serve` flags of the answer. No streamlit here; the page submits `search` and
`curves` to the worker pool through `core.page_models.tasks`.

Invariants:
- `SloPlannerParams` holds the page's inputs as plain, hashable values (the job cache's key); `slo()`,
  `workload()` and `candidates()` build core's typed inputs and raise core's InvalidArgumentError for bad ones
  (a zero or negative target or rate), with core's message.
- `SloSearch` is the answer whether or not a configuration meets the SLO: `plan` is always set (an infeasible
  search keeps the plan the SloInfeasibleError carries), `error` is that error's message or None.
- A curve's points are `latency_curve`'s, one per rate of `curve_rates(rate)`; its knee is the first rate whose
  point binds on "queueing" or is pruned by the throughput bound (`limiting_metric` "rate"), None when no point
  of the grid does.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from core.errors import SloInfeasibleError
from core.page_models.slo_predict import disagg_serve_command
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import get_model
from core.planning.cost.fits.engine_profiles import DEFAULT_ENGINE
from core.planning.memory.plan import plan
from core.planning.predict.disagg import DisaggDeployment
from core.planning.search.slo import Slo, SloCandidates, SloPlan, SloWorkload, latency_curve, plan_slo
from core.planning.search.slo_candidates import candidates_from
from core.planning.search.slo_eval import SloConfig

CURVE_FACTORS = tuple(0.25 * k for k in range(1, 9))  # 0.25x, 0.5x, ..., 2x the target rate
CHART_CONFIGS = 3  # configurations the chart draws


@dataclass(frozen=True)
class SloPlannerParams:
    """The page's inputs. targets: ((key, seconds), ...) with keys `{metric}_p{q}_s` (any percentile of TTFT,
    TPOT, ITL, e2e: `Slo`'s fields); chart_percentiles: the (TTFT, TPOT) percentiles the chart and the answer
    show (the targets' own when they have one); rate in requests/s, lengths in tokens, seed the draw; engine:
    the profile pricing the steps; vllm_version: the vLLM release whose MoE kernels it prices (None: today's);
    gpus / kv_dtypes / weight_dtypes: the values the search tries (each configuration is simulated to its steady
    state); disagg: disaggregated prefill / decode deployments too
    (`SloCandidates(disagg=True)`, ranked with the aggregated ones)."""

    model: str = "llama-3.1-8b"
    rate: float = 12.0
    prompt_len: int = 2000
    output_len: int = 300
    length_spread: float = 0.0
    targets: tuple[tuple[str, float], ...] = (("ttft_p95_s", 1.0), ("tpot_p95_s", 0.05))
    chart_percentiles: tuple[int, int] = (95, 95)
    gpus: tuple[str, ...] = ("h100-80gb", "h200-141gb", "l40s")
    max_gpus: int = 8
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    weight_dtypes: tuple[str, ...] = ("auto",)
    engine: str = DEFAULT_ENGINE
    seed: int = 0
    disagg: bool = False
    vllm_version: str | None = None

    def slo(self) -> Slo:
        return Slo.of(dict(self.targets))

    def workload(self) -> SloWorkload:
        return SloWorkload(self.rate, self.prompt_len, self.output_len, self.length_spread, self.seed)

    def candidates(self) -> SloCandidates:
        names = ("gpus", "max_gpus", "kv_dtypes", "weight_dtypes", "disagg")
        values = {name: getattr(self, name) for name in names}
        return candidates_from(values, engine=self.engine, vllm_version=self.vllm_version)

    def chart_keys(self) -> tuple[str, str]:
        """The percentile keys the chart draws: TTFT and TPOT at `chart_percentiles`."""
        return f"ttft_p{self.chart_percentiles[0]}_s", f"tpot_p{self.chart_percentiles[1]}_s"

    def check(self) -> None:
        """Raise core's InvalidArgumentError for any bad input (before a job is submitted)."""
        self.slo()
        self.workload()
        self.candidates()
        get_model(self.model)


DEFAULT_PARAMS = SloPlannerParams()


@dataclass(frozen=True, eq=False)
class SloSearch:
    """One search. plan: every configuration evaluated (SloPlan; `plan.best` None when nothing meets the SLO).
    error: SloInfeasibleError's message (what cannot be met and by how much) or None; metric / shortfall: that
    error's `metric` and `shortfall`."""

    plan: SloPlan
    error: str | None = None
    metric: str | None = None
    shortfall: float | None = None


def search(params: SloPlannerParams, progress: Callable[[float], None] | None = None) -> SloSearch:
    """`plan_slo` of the inputs; an infeasible SLO is an answer too (the error's plan and message)."""
    try:
        return SloSearch(
            plan_slo(params.model, params.workload(), params.slo(), params.candidates(), progress)
        )
    except SloInfeasibleError as error:
        return SloSearch(error.plan, str(error), error.metric, error.shortfall)


def _deployment(config: SloConfig) -> tuple:
    return (config.gpu, config.tp, config.pp, config.replicas, config.kv_dtype, config.weight_dtype)


def chart_configs(plan: SloPlan, count: int = CHART_CONFIGS) -> tuple[SloConfig, ...]:
    """The configurations the chart draws: the first `count` that meet the SLO, in rank order, one per deployment
    (GPU, tp, pp, replicas, KV and weight dtypes: a smaller max_num_seqs of the same deployment draws the same
    line until the knee), topped up, when fewer meet it, by the feasible ones closest to it (smallest
    slo_ratio), the simulated ones first: one a bound ruled out at the target rate (a decode step longer than the
    TPOT target) is usually ruled out at every rate, a curve with nothing to draw. Aggregated only: a
    disaggregated configuration is two pools, not one curve `latency_curve` draws (the ranked table shows them)."""
    aggregated = [c for c in plan.configs if c.mode == "agg"]
    meeting = [c for c in aggregated if c.meets_slo]
    missing = (c for c in aggregated if c.feasible and not c.meets_slo and c.slo_ratio is not None)
    closest = sorted(missing, key=lambda c: (not c.simulated, c.slo_ratio))
    chosen, seen = [], set()
    for config in [*meeting, *closest]:
        if _deployment(config) not in seen and len(chosen) < count:
            seen.add(_deployment(config))
            chosen.append(config)
    return tuple(chosen)


def curve_rates(rate: float) -> tuple[float, ...]:
    """The chart's grid: CURVE_FACTORS x the target rate (requests/s)."""
    return tuple(rate * f for f in CURVE_FACTORS)


def knee_index(points) -> int | None:
    """Index of the first point where queueing takes over: binding "queueing", or pruned by the throughput bound
    (not simulated, limiting_metric "rate"); None when no point does."""
    for i, point in enumerate(points):
        if point.binding == "queueing" or (not point.simulated and point.limiting_metric == "rate"):
            return i
    return None


@dataclass(frozen=True)
class Curve:
    """One configuration's predicted TTFT and TPOT percentiles against the rate: label (`config_label`, "(misses
    the SLO)" added when the configuration misses it at the target rate), rates (requests/s), ttft_s / tpot_s
    (seconds, at percentiles ttft_q / tpot_q; None where the point was not simulated), binding and meets_slo per point, knee_rate (None: no knee on the
    grid), knee_reason ("queueing" or "throughput bound") and reasons (each point's `SloConfig.reason`: why
    it meets or misses, or which bound pruned it)."""

    label: str
    rates: tuple[float, ...]
    ttft_s: tuple[float | None, ...]
    tpot_s: tuple[float | None, ...]
    binding: tuple[str, ...]
    meets_slo: tuple[bool, ...]
    knee_rate: float | None
    knee_reason: str | None = field(default=None)
    reasons: tuple[str, ...] = ()
    ttft_q: int = 95
    tpot_q: int = 95

    @property
    def simulated(self) -> bool:
        """Whether any point was simulated (else every rate was ruled out by a bound: nothing to draw)."""
        return any(v is not None for v in self.ttft_s)


def config_label(config: SloConfig) -> str:
    """ "2 x H100 SXM 80GB, tp 2, max_num_seqs 256, KV fp8" (pp and replicas only when > 1, weights when not
    auto); a disaggregated one with its split (`config_layout`)."""
    if config.mode == "disagg":
        return (
            f"{config.num_gpus} x {config.gpu_name}, {config_layout(config)}, max_num_seqs "
            f"{config.max_num_seqs}, KV {config.kv_dtype}"
        )
    parts = [f"{config.num_gpus} x {config.gpu_name}", f"tp {config.tp}"]
    if config.pp > 1:
        parts.append(f"pp {config.pp}")
    if config.replicas > 1:
        parts.append(f"{config.replicas} replicas")
    parts += [f"max_num_seqs {config.max_num_seqs}", f"KV {config.kv_dtype}"]
    if config.weight_dtype != "auto":
        parts.append(f"weights {config.weight_dtype}")
    return ", ".join(parts)


def curve(params: SloPlannerParams, config: SloConfig) -> Curve:
    """`latency_curve` of `config` at `curve_rates(params.rate)`, as a Curve. `config` is a row of the search of
    `params` (`search`), so the point at the target rate is that row itself: the search already simulated it,
    with the same workload, SLO and candidates (`latency_curve` would run the same simulation again)."""
    rates = curve_rates(params.rate)
    others = tuple(r for r in rates if r != params.rate)
    found = iter(
        latency_curve(params.model, config, params.workload(), params.slo(), others, params.candidates())
    )
    points = [config if r == params.rate else next(found) for r in rates]
    knee = knee_index(points)
    ttft_key, tpot_key = params.chart_keys()
    reason = (
        None if knee is None else ("queueing" if points[knee].binding == "queueing" else "throughput bound")
    )
    return Curve(
        config_label(config) + ("" if config.meets_slo else " (misses the SLO)"),
        rates,
        tuple(getattr(p, ttft_key) if p.simulated else None for p in points),
        tuple(getattr(p, tpot_key) if p.simulated else None for p in points),
        tuple(p.binding for p in points),
        tuple(p.meets_slo for p in points),
        None if knee is None else rates[knee],
        reason,
        tuple(p.reason for p in points),
        *params.chart_percentiles,
    )


def curves(
    params: SloPlannerParams, configs: tuple[SloConfig, ...], progress: Callable[[float, str], None]
) -> tuple[Curve, ...]:
    """`curve` of each configuration, reporting progress per configuration."""
    found = []
    for i, config in enumerate(configs):
        progress(i / len(configs), f"configuration {i + 1} of {len(configs)}")
        found.append(curve(params, config))
    return tuple(found)


def serve_command(params: SloPlannerParams, config: SloConfig) -> str:
    """The `vllm serve` flags of `config` (`core.planning.memory.vllm_command` on the exact plan of the whole
    deployment: --data-parallel-size for replicas, max_model_len the longest request); for a disaggregated
    one its serve_note and each pool's flags (`slo_predict.disagg_serve_command`)."""
    cands = params.candidates()
    if config.mode == "disagg":
        return disagg_serve_command(disagg_deployment(params, config), params.workload())
    capacity = plan(
        get_model(params.model),
        GPUS[config.gpu],
        num_gpus=config.num_gpus,
        tensor_parallel=config.tp,
        pipeline_parallel=config.pp,
        weight_dtype=config.weight_dtype,
        kv_dtype=config.kv_dtype,
        gpu_memory_utilization=cands.gpu_memory_utilization,
        block_size=cands.block_size,
        max_model_len=params.workload().max_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=cands.max_num_batched_tokens,
    )
    return capacity.vllm_command


def disagg_deployment(params: SloPlannerParams, config: SloConfig) -> DisaggDeployment:
    """A disaggregated row as the `DisaggDeployment` the search evaluated (its pools, settings and engine)."""
    cands = params.candidates()
    return DisaggDeployment.of(
        get_model(params.model),
        GPUS[config.gpu],
        (config.prefill_workers, config.prefill_tp),
        (config.decode_workers, config.decode_tp),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=cands.max_num_batched_tokens,
        weight_dtype=config.weight_dtype,
        kv_dtype=config.kv_dtype,
        engine=cands.engine,
        vllm_version=cands.vllm_version,
        block_size=cands.block_size,
        gpu_memory_utilization=cands.gpu_memory_utilization,
    )


def config_layout(config: SloConfig) -> str:
    """ "tp 2, pp 1, 2 replicas", or for a disaggregated one "1 prefill x tp 1 + 2 decode x tp 1"."""
    if config.mode == "disagg":
        return (
            f"{config.prefill_workers} prefill x tp {config.prefill_tp} + {config.decode_workers} decode x "
            f"tp {config.decode_tp}"
        )
    return f"tp {config.tp}, pp {config.pp}, {config.replicas} replica(s)"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def table_rows(plan: SloPlan, params: SloPlannerParams, rates: tuple = ()) -> list[dict]:
    """One row per evaluated configuration, in rank order, with units in the column names: the chart's TTFT and
    TPOT percentiles, then every other target's, the mode ("agg" | "disagg"), prefill / decode GPUs and the KV
    transfer per request (disaggregated rows; None for aggregated), output tokens/s and tokens/s per GPU, and
    (`rates`: `slo_rates.HighestRate`s) the highest rate within
    the targets of the configurations it was computed for (None elsewhere)."""
    ttft_key, tpot_key = params.chart_keys()
    others = [k for k, _ in params.targets if k not in (ttft_key, tpot_key)]
    highest = {r.key: r.max_req_per_s for r in rates}
    rows = []
    for i, c in enumerate(plan.configs):
        row = {
            "rank": i + 1,
            "meets SLO": c.meets_slo,
            "GPUs": c.num_gpus,
            "GPU": c.gpu_name,
            "TP": c.tp,
            "PP": c.pp,
            "replicas": c.replicas,
            "max_num_seqs": c.max_num_seqs,
            "KV dtype": c.kv_dtype,
            "weights": c.weight_dtype,
            column_name(ttft_key): getattr(c, ttft_key),
            column_name(tpot_key): _ms(getattr(c, tpot_key)),
        }
        for key in others:
            value = getattr(c, key)
            row[column_name(key)] = value if key.startswith(("ttft", "e2e")) else _ms(value)
        row |= {
            "mode": c.mode,
            "prefill GPUs": c.prefill_gpus,
            "decode GPUs": c.decode_gpus,
            "KV transfer (ms)": _ms(c.kv_transfer_s),
            "output tokens/s": c.throughput_tokens_per_s,
            "tokens/s per GPU": c.tokens_per_s_per_gpu,
            "binding": c.binding,
            "highest rate (req/s)": highest.get(rate_key(c)),
            "converged": c.converged,
            "KV-limited": c.kv_limited,
            "GPUs per req/s": c.gpus_per_request_per_s,
            "worst / target": c.slo_ratio,
            "why": c.reason,
        }
        rows.append(row)
    return rows


def column_name(key: str) -> str:
    """ "ttft_p99_s" -> "TTFT p99 (s)", "tpot_p95_s" -> "TPOT p95 (ms)": TTFT and e2e in s, TPOT and ITL in ms."""
    metric, quantile, _ = key.split("_")
    return f"{metric.upper()} {quantile} ({'s' if metric in ('ttft', 'e2e') else 'ms'})"


def rate_key(config: SloConfig) -> tuple:
    """What a highest rate depends on besides the workload and targets: the deployment and its max_num_seqs
    (and its mode: a disaggregated row's decode tp / workers never stand for an aggregated deployment)."""
    return (
        config.gpu,
        config.tp,
        config.pp,
        config.replicas,
        config.max_num_seqs,
        config.kv_dtype,
        config.weight_dtype,
        config.mode,
    )
