"""What the SLO planner's "predict my deployment" mode computes: one deployment's steady state at one load
(`core.planning.predict.prediction.predict`, exactly as `python -m core.planning predict` prints it), the highest Poisson rate
it holds within the targets (`core.planning.predict.max_rate.max_rate`, as `python -m core.planning max-rate` prints it),
its `vllm serve` flags and the `vllm bench serve` command that replays the load on the user's GPU. No streamlit
here; the page submits `deployment_answer` to the worker pool through `core.page_models.tasks`.

Invariants:
- `SloPredictParams` holds the inputs as plain, hashable values (the job cache's key); `deployment()`, `load()`
  and `targets_dict()` build core's typed inputs and raise core's InvalidArgumentError for bad ones.
- `cli_args()` are the `predict` / `max-rate` flags of the same inputs: `DeploymentAnswer.prediction` is the JSON
  object `predict` prints for `cli_args()` and `DeploymentAnswer.max_rate` the one `max-rate` prints (non-finite
  floats as None in both), so the page and the command line cannot disagree.
"""

import math
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from core.errors import InvalidArgumentError
from core.fields import field_named
from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from core.planning.cost.fits.engine_profiles import DEFAULT_ENGINE
from core.planning.cost.speculative import Speculation
from core.planning.memory.plan import plan
from core.planning.predict.bench_report import against_result, bench_values, check_same_load, figure_label
from core.planning.predict.deployment import Deployment
from core.planning.predict.deployment_fields import DEPLOYMENT_FIELDS, MODEL_FIELD, OFFLOAD_FIELDS
from core.planning.predict.disagg import DISAGG_FIELDS, DisaggDeployment, predict_disagg
from core.planning.predict.inputs import (
    deployment_from,
    disagg_from,
    load_from,
    speculation_from,
    speculation_words,
)
from core.planning.predict.load import DEFAULT_TURN_GAP_S, LOAD_FIELDS, SHAPE_FIELDS, Load
from core.planning.predict.load import LEVER_FIELDS as LOAD_LEVERS
from core.planning.predict.max_rate import check_targets, max_rate
from core.planning.predict.prediction import predict
from core.planning.predict.target_fields import target_words
from core.planning.predict.vllm_bench import bench_command, bench_num_prompts, in_flight
from core.planning.search.slo_disagg import KV_TRANSFER_FLAG, SERVE_NOTE
from core.serving.latency import PERCENTILES
from core.serving.steady_state import STEADY_METRICS

LOAD_KINDS = ("rate", "concurrency")
# a command's comment lines are wrapped at this width, so that they read as lines where the command is pasted
COMMENT_WIDTH = 100


@dataclass(frozen=True)
class SloPredictParams:
    """The inputs of the predict mode. A deployment (`Deployment`'s fields: preset slugs, parallelism,
    max_num_seqs, dtypes, engine), a load (load_kind "rate": Poisson at `rate` requests/s; "concurrency":
    `concurrency` closed-loop clients; lengths in tokens, spread, seed) and latency targets, ((key, seconds), ...)
    with keys `{metric}_p{q}_s` (empty: no targets, no highest rate)."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100-80gb"
    tp: int = 1
    pp: int = 1
    replicas: int = 2
    max_num_seqs: int = 256
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    weight_dtype: str = "auto"
    kv_dtype: str = "fp8"
    engine: str = DEFAULT_ENGINE
    load_kind: str = "rate"
    rate: float = 12.0
    concurrency: int = 64
    prompt_len: int = 2000
    output_len: int = 300
    length_spread: float = 0.0
    seed: int = 0
    targets: tuple[tuple[str, float], ...] = (("ttft_p95_s", 1.0), ("tpot_p95_s", 0.05))
    shared_prefix_len: int = 0
    num_prefixes: int = 1
    prefix_zipf: float | None = None
    turns: int = 1
    turn_gap_s: float = DEFAULT_TURN_GAP_S
    spec_tokens: int = 0
    spec_acceptance: str = ""
    spec_method: str = "ngram"
    draft_model: str | None = (
        "phi-3-mini"  # the smallest preset: a draft model's role (method draft-model only)
    )
    disagg: bool = False
    prefill_workers: int = 1
    prefill_tp: int = 1
    decode_workers: int = 1
    decode_tp: int = 1
    kv_link: str = "auto"
    kv_offload_gib: float = 0.0  # a host KV tier per replica (--kv-offload-gib), 0: none
    offload_policy: str = "lru"
    vllm_version: str | None = None  # the vLLM release whose MoE kernels price the steps (None: today's)

    def values(self) -> dict:
        """The inputs as the converters of `core.planning.predict.inputs` take them (keyed by field name)."""
        return asdict(self)

    def speculation(self) -> Speculation | None:
        """The `Speculation` of the spec_* inputs and draft_model (`speculation_from`, as the command line's)."""
        return speculation_from(self.values())

    def deployment(self) -> Deployment:
        """The aggregated deployment (`deployment_from`, as `predict` builds it from its flags)."""
        return deployment_from(self.values())

    def disagg_deployment(self) -> DisaggDeployment:
        """The disaggregated deployment (`disagg_from`, as `predict --disagg` builds it from its flags)."""
        return disagg_from(self.values())

    def load(self) -> Load:
        """The `Load` of the inputs (`load_from`): at `rate` requests/s, or `concurrency` clients."""
        if self.load_kind not in LOAD_KINDS:
            raise InvalidArgumentError(
                f"load_kind must be one of {', '.join(LOAD_KINDS)}, got {self.load_kind!r}"
            )
        return load_from(self.values() | {LOAD_KINDS[self.load_kind == "rate"]: None})

    def targets_dict(self) -> dict[str, float]:
        """The targets, checked as `max_rate` checks them ({} for none)."""
        return check_targets(dict(self.targets)) if self.targets else {}

    def check(self) -> None:
        """Raise core's InvalidArgumentError for any bad input (before a job is submitted)."""
        self.disagg_deployment() if self.disagg else self.deployment()
        self.load()
        self.targets_dict()

    def cli_args(self) -> tuple[list[str], list[str]]:
        """(predict flags, max-rate flags) of these inputs: `python -m core.planning predict` / `max-rate`,
        written from the input groups (every deployment and shape flag, the levers that differ from their
        defaults)."""
        common = [w for f in (MODEL_FIELD, *DEPLOYMENT_FIELDS, *SHAPE_FIELDS) for w in self._words(f)]
        common += [w for f in (*LOAD_LEVERS, *OFFLOAD_FIELDS) if self._changed(f) for w in self._words(f)]
        common += speculation_words(self.speculation())
        load = field_named(LOAD_FIELDS, self.load_kind).words(getattr(self, self.load_kind))
        targets = target_words(dict(self.targets))
        if self.disagg:
            return [*common, *load, *(w for f in DISAGG_FIELDS for w in self._words(f))], []
        return common + load, common + targets

    def _words(self, field) -> list[str]:
        """`field`'s command-line words for this input (none for one the page does not hold)."""
        return field.words(getattr(self, field.name)) if hasattr(self, field.name) else []

    def _changed(self, field) -> bool:
        return hasattr(self, field.name) and getattr(self, field.name) != field.default


DEFAULT_PREDICT_PARAMS = SloPredictParams()


@dataclass(frozen=True, eq=False)
class DeploymentAnswer:
    """One deployment's answer. prediction: the JSON object `predict` prints (every percentile key, the
    intervals, converged, stable, kv_limited, throughput, prefix_hit_rate, mean_accepted_len, ...; for a
    disaggregated deployment `predict --disagg`'s: mode, prefill_gpus, decode_gpus, kv_transfer_s, ...), with
    tokens_per_s_per_gpu added for an aggregated one (throughput / num_gpus); max_rate: the one `max-rate`
    prints (max_rate_req_per_s, binding, evaluations, the percentiles there), None without targets or when
    disaggregated (max-rate takes one aggregated deployment); serve_command / bench_command: `vllm serve` for
    the whole deployment (disaggregated: SERVE_NOTE and each pool's flags) and `vllm bench serve` replaying the
    load in `num_prompts` requests; larger_kv: `larger_kv_rows` when prompts share tokens (aggregated only)."""

    prediction: dict
    max_rate: dict | None
    serve_command: str
    bench_command: str
    num_prompts: int
    larger_kv: tuple[dict, ...] = ()


def finite(value):
    """`value` with every non-finite float (nested in dicts / lists) replaced by None, as the CLI prints JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def serve_command(deployment: Deployment, load: Load) -> str:
    """The `vllm serve` flags of the whole deployment (the exact planner on all its GPUs: replicas become
    --data-parallel-size; max_model_len the longest request of `load`)."""
    return plan(
        deployment.model_spec,
        deployment.gpu_spec,
        num_gpus=deployment.num_gpus,
        tensor_parallel=deployment.tp,
        pipeline_parallel=deployment.pp,
        weight_dtype=deployment.weight_dtype,
        kv_dtype=deployment.kv_dtype,
        gpu_memory_utilization=deployment.gpu_memory_utilization,
        block_size=deployment.block_size,
        max_model_len=load.max_len,
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
    ).vllm_command


def deployment_answer(params: SloPredictParams, progress: Callable[[float, str], None]) -> DeploymentAnswer:
    """The whole answer: `prediction_answer`, then (with targets) `highest_rate` and, when prompts share tokens,
    the larger-KV comparison (`larger_kv_rows`). The page asks for the three parts one after the other, to show
    the prediction as soon as it exists. Raises InvalidArgumentError for bad inputs or a deployment that does not
    fit in memory (the planner's verdict)."""
    answer = prediction_answer(params, lambda f, m: progress(0.4 * f, m))
    found = highest_rate(params, lambda f, m: progress(0.4 + 0.3 * f, m))
    others = larger_kv_others(params, lambda f, m: progress(0.7 + 0.3 * f, m))
    larger = (larger_kv_given_row(params, answer.prediction), *others) if others else ()
    return replace(answer, max_rate=found, larger_kv=larger)


def prediction_answer(params: SloPredictParams, progress: Callable[[float, str], None]) -> DeploymentAnswer:
    """`predict` of the inputs and the two vLLM commands (`max_rate` None, `larger_kv` empty: the page's first
    answer); a disaggregated deployment: `predict_disagg` and the commands. Raises InvalidArgumentError for bad
    inputs or a deployment that does not fit in memory (the planner's verdict)."""
    if params.disagg:
        return disagg_answer(params, progress)
    deployment, load = params.deployment(), params.load()
    params.targets_dict()
    progress(0.0, "predicting the steady state at this load")
    prediction = finite(predict(deployment, load).to_dict())
    prediction["tokens_per_s_per_gpu"] = per_gpu(prediction["throughput_tokens_per_s"], deployment.num_gpus)
    progress(0.95, "writing the vLLM commands")
    num_prompts = bench_num_prompts(
        load, in_flight(prediction["stable"], prediction["mean_e2e_s"], deployment, load)
    )
    bench = bench_command(deployment.model_spec, load, num_prompts)
    return DeploymentAnswer(prediction, None, serve_command(deployment, load), bench, num_prompts)


def highest_rate(params: SloPredictParams, progress: Callable[[float, str], None]) -> dict | None:
    """The JSON object `max-rate` prints for the inputs (`DeploymentAnswer.max_rate`), or None without targets
    or for a disaggregated deployment (max-rate takes one aggregated deployment)."""
    targets = params.targets_dict()
    if params.disagg or not targets:
        return None
    deployment, load = params.deployment(), params.load()
    progress(0.0, "bisecting for the highest rate within the targets")
    return finite(max_rate(deployment, load, targets).to_dict(deployment, load, targets))


def per_gpu(throughput: float | None, num_gpus: int) -> float | None:
    return None if throughput is None else throughput / num_gpus


def disagg_answer(params: SloPredictParams, progress: Callable[[float, str], None]) -> DeploymentAnswer:
    """`predict_disagg` of the inputs (as `predict --disagg` prints it), each pool's `vllm serve` flags under
    SERVE_NOTE and the `vllm bench serve` command (prompts sized from rate x the median end-to-end latency)."""
    deployment, load = params.disagg_deployment(), params.load()
    params.targets_dict()
    progress(0.0, "predicting the prefill and decode pools' steady states")
    prediction = finite(predict_disagg(deployment, load).to_dict())
    progress(0.95, "writing the vLLM commands")
    serve = disagg_serve_command(deployment, load)
    flying = in_flight(prediction["stable"], prediction.get("e2e_p50_s"), deployment.decode, load)
    num_prompts = bench_num_prompts(load, flying)
    bench = bench_command(deployment.decode.model_spec, load, num_prompts)
    return DeploymentAnswer(prediction, None, serve, bench, num_prompts)


def disagg_serve_command(deployment: DisaggDeployment, load: Load) -> str:
    """SERVE_NOTE as comment lines, then each pool's `vllm serve` flags (its workers as --data-parallel-size) with the
    KV connector's (KV_TRANSFER_FLAG)."""
    pools = (
        (deployment.prefill, "prefill", deployment.prefill_workers),
        (deployment.decode, "decode", deployment.decode_workers),
    )
    note = "".join(f"# {line}\n" for line in textwrap.wrap(SERVE_NOTE, COMMENT_WIDTH))
    return note + "\n".join(
        f"# {name} pool: {workers} worker(s) of tp {pool.tp}\n{serve_command(pool, load)} \\\n  {KV_TRANSFER_FLAG}"
        for pool, name, workers in pools
    )


def larger_kv_deployments(params: SloPredictParams) -> list[tuple[str, SloPredictParams]]:
    """(label, inputs) of the same deployment with a larger KV cache: fp8 KV (unless it is fp8 already), and
    twice the GPUs: tp x 2 when the model allows it (each replica's cache more than doubles: the weights are
    split over twice the GPUs), else replicas x 2 (the same cache per replica, each at half the load)."""
    options = []
    if params.kv_dtype != "fp8":
        options.append(("fp8 KV cache", replace(params, kv_dtype="fp8")))
    doubled = replace(params, tp=params.tp * 2)
    try:
        doubled.deployment()
        options.append((f"2x GPUs: tp {doubled.tp} (was {params.tp})", doubled))
    except InvalidArgumentError:
        wider = replace(params, replicas=params.replicas * 2)
        options.append((f"2x GPUs: {wider.replicas} replicas (was {params.replicas})", wider))
    return options


def larger_kv_rows(params: SloPredictParams, prediction: dict) -> tuple[dict, ...]:
    """One row per deployment (as given, then `larger_kv_deployments`): GPUs, KV slots per replica,
    prefix_hit_rate, TTFT p50 / p99 in seconds, stable; each `predict`'s own figures on the same load."""
    others = _larger_kv_rows(params, lambda f, m: None)
    return (larger_kv_given_row(params, prediction), *others)


def larger_kv_given_row(params: SloPredictParams, prediction: dict) -> dict:
    """`larger_kv_rows`' first row: the deployment as given, from its own prediction."""
    return _kv_row("as given", params.deployment().num_gpus, prediction)


def larger_kv_others(params: SloPredictParams, progress: Callable[[float, str], None]) -> tuple[dict, ...]:
    """`larger_kv_rows` but its first row, when prompts share tokens and the deployment is aggregated; else ()."""
    if params.disagg or not params.load().uses_prefix_cache:
        return ()
    return _larger_kv_rows(params, progress)


def _larger_kv_rows(params: SloPredictParams, progress: Callable[[float, str], None]) -> tuple[dict, ...]:
    options = larger_kv_deployments(params)
    rows = []
    for index, (label, other) in enumerate(options):
        progress(index / len(options), f"predicting the same load with a larger KV cache: {label}")
        deployment = other.deployment()
        rows.append(_kv_row(label, deployment.num_gpus, finite(predict(deployment, other.load()).to_dict())))
    return tuple(rows)


def _kv_row(label: str, num_gpus: int, p: dict) -> dict:
    return {
        "deployment": label,
        "GPUs": num_gpus,
        "KV slots per replica": p["kv_tokens"],
        "prefix-hit rate": p["prefix_hit_rate"],
        "TTFT p50 (s)": p["ttft_p50_s"],
        "TTFT p99 (s)": p["ttft_p99_s"],
        "steady state": p["stable"],
    }


def _ms(seconds) -> float | None:
    return None if seconds is None else float(seconds) * 1e3


def percentile_rows(prediction: dict, targets: dict[str, float]) -> list[dict]:
    """One row per percentile key (TTFT, TPOT, ITL, e2e at p50 ... p99): the prediction and its 95% interval
    in milliseconds (no interval for a disaggregated prediction: its parts are summed), the target (None: none)
    and whether the prediction meets it (None without a target)."""
    rows = []
    for metric in STEADY_METRICS:
        for q in PERCENTILES:
            key = f"{metric}_p{q}_s"
            low, high = prediction.get("intervals", {}).get(key, (None, None))
            value, target = prediction.get(key), targets.get(key)
            meets = None if target is None else value is not None and value <= target
            rows.append(
                {
                    "metric": metric,
                    "percentile": f"p{q}",
                    "predicted (ms)": _ms(value),
                    "95% interval low (ms)": _ms(low),
                    "95% interval high (ms)": _ms(high),
                    "target (ms)": _ms(target),
                    "meets target": meets,
                }
            )
    return rows


def missed_targets(prediction: dict, targets: dict[str, float]) -> list[str]:
    """The target keys the prediction misses (over the target, or undefined), in `targets` order."""
    return [k for k, t in targets.items() if prediction.get(k) is None or prediction[k] > t]


def against_rows(prediction: dict, load: Load, result: dict) -> list[dict]:
    """The predict mode's "compare with your run": each figure of `prediction` (`DeploymentAnswer.prediction`,
    aggregated) that the run's `result` (`bench_result_from` of its `vllm bench serve --save-result` file) has,
    as rows {figure (vLLM's label), predicted, measured, error (predicted / measured - 1, None where measured 0)}, in
    vLLM's order, as `predict --against` prints them. Raises InvalidArgumentError for a run of another load."""
    check_same_load(result, load, "the uploaded result")
    rows = against_result(bench_values(prediction, load), result)
    return [
        {
            "figure": figure_label(key),
            "predicted": row["predicted"],
            "measured": row["measured"],
            "error": row["rel_err"],
        }
        for key, row in rows.items()
    ]
