"""The heavy computations the pages submit to the worker pool: module-level functions with hashable arguments,
each called as `fn(*args, progress=callback)` in a worker process.

Each checks the operator limits (read in the worker from the environment the pool gives it) before it generates
a workload or allocates a tensor, then calls the computation in core; nothing here computes on its own.
Return values are plain data the page draws from (never mutated after they are returned).
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from core.engine import Engine, EngineRun, RequestOutput, SamplingParams
from core.engine.sharing import measure_sharing
from core.errors import InvalidArgumentError
from core.kernels.timer import apply_timing_settings
from core.kernels.timing import (
    KernelConfig,
    check_budget,
    copy_bandwidth,
    correctness,
    measure,
    sweep_contexts,
)
from core.limits import Limits
from core.page_models.engines import TINY_LLAMA, build_engine, check_pool, fetch_real_model  # noqa: F401 (re-exported)
from core.page_models.simulator import SimulatorParams, run_comparison, steady_summary
from core.page_models.slo_planner import Curve, SloPlannerParams, SloSearch, curves, search
from core.page_models.slo_predict import (
    DeploymentAnswer,
    SloPredictParams,
    highest_rate,
    larger_kv_others,
    prediction_answer,
)
from core.page_models.slo_rates import HighestRate, highest_rates
from core.planning.predict.max_rate import SEARCH_SETTINGS
from core.planning.search.slo_eval import SloConfig
from core.serving.steady_state import SteadyStateSettings
from core.serving.step_attention import measure_step_attention
from core.serving.workload import Request

COPY_BYTES = 128 * 1024**2  # the copy-bandwidth reference the Kernels page draws
SWEEP_WARMUP = 3  # untimed rounds before each sweep point: first calls page in buffers and fill caches


def _no_progress(fraction: float, message: str = "") -> None:
    """For calls outside a worker."""


_COMPARISONS: dict[tuple, tuple[dict, dict]] = {}  # this worker's last comparisons, for the measurement job
_KEEP = 2


def _comparison(params: SimulatorParams, trace: tuple[Request, ...] | None, progress: Callable) -> tuple:
    key = (params, trace)
    if key not in _COMPARISONS:
        requests = list(trace) if trace is not None else params.requests()
        results = run_comparison(
            params, requests, lambda fraction, name: progress(fraction, f"Simulating {name}")
        )
        summaries = {name: steady_summary(result, requests) for name, result in results.items()}
        while len(_COMPARISONS) >= _KEEP:
            del _COMPARISONS[next(iter(_COMPARISONS))]
        _COMPARISONS[key] = (results, summaries)
    return _COMPARISONS[key]


def compare_policies(
    params: SimulatorParams, trace: tuple[Request, ...] | None = None, *, progress: Callable = _no_progress
) -> tuple[dict, dict]:
    """`run_comparison` of `params` on `trace` (default: the generated workload) and each policy's steady-state
    summary: (results by policy name, summaries by policy name). Raises LimitExceededError naming
    PAGED_LAB_MAX_REQUESTS before generating more requests than the operator allows."""
    Limits.from_env().check_requests(len(trace) if trace is not None else params.num_requests)
    return _comparison(params, trace, progress)


def measure_simulated_attention(
    params: SimulatorParams,
    trace: tuple[Request, ...] | None,
    time_budget_s: float,
    *,
    progress: Callable = _no_progress,
):
    """`measure_step_attention` on the paged run of `compare_policies(params, trace)` (recomputed when this
    worker does not hold it): a DataFrame, one row per measured step. MemoryBudgetError over the budget."""
    Limits.from_env().check_requests(len(trace) if trace is not None else params.num_requests)
    results, _ = _comparison(params, trace, progress)
    progress(0.0, "timing paged vs contiguous attention on the sampled steps")
    return measure_step_attention(results["paged"], time_budget_s=time_budget_s)


def slo_search(params: SloPlannerParams, *, progress: Callable = _no_progress) -> SloSearch:
    """The SLO planner's search (`slo_planner.search`): every configuration evaluated, ranked, and the
    infeasibility message when none meets the SLO. LimitExceededError (PAGED_LAB_MAX_REQUESTS) before simulating
    more requests per configuration than the operator allows (a steady state takes up to SEARCH_SETTINGS'
    max_requests)."""
    Limits.from_env().check_requests(SEARCH_SETTINGS.max_requests, "each configuration's steady state")
    return search(params, lambda fraction: progress(fraction, "evaluating configurations in rank order"))


def slo_curves(
    params: SloPlannerParams, configs: tuple[SloConfig, ...], *, progress: Callable = _no_progress
) -> tuple[Curve, ...]:
    """The SLO planner's chart: `latency_curve` of each of `configs` over the page's grid of rates, with its knee
    (`slo_planner.curves`). Same limit as `slo_search`."""
    Limits.from_env().check_requests(SEARCH_SETTINGS.max_requests, "each configuration's steady state")
    return curves(params, configs, progress)


def slo_highest_rates(
    params: SloPlannerParams, configs: tuple[SloConfig, ...], *, progress: Callable = _no_progress
) -> tuple[HighestRate, ...]:
    """The SLO planner's highest rate within the targets of each of `configs` (`slo_rates.highest_rates`: a
    bisection of steady-state predictions each). Same limit as `slo_search`."""
    Limits.from_env().check_requests(SEARCH_SETTINGS.max_requests, "each configuration's steady state")
    return highest_rates(params, configs, progress)


def slo_predict(params: SloPredictParams, *, progress: Callable = _no_progress) -> DeploymentAnswer:
    """The SLO planner's "predict my deployment" mode, its first answer (`slo_predict.prediction_answer`): the
    steady state of the deployment at the load and the vLLM commands; the extras are their own jobs
    (`slo_predict_highest_rate`, `slo_predict_larger_kv`), so the page shows this one as soon as it exists.
    LimitExceededError (PAGED_LAB_MAX_REQUESTS) when the operator allows fewer requests than a prediction may
    simulate (`SteadyStateSettings().max_requests`, 10,000 by default as the limit): the page then refuses
    instead of showing a shorter estimate than `python -m core.planning predict` prints."""
    Limits.from_env().check_requests(SteadyStateSettings().max_requests, "a steady-state prediction")
    return prediction_answer(params, progress)


def slo_predict_highest_rate(params: SloPredictParams, *, progress: Callable = _no_progress) -> dict | None:
    """The predict mode's highest rate within the targets (`slo_predict.highest_rate`, as `max-rate` prints it;
    None without targets or disaggregated). Same limit as `slo_predict`."""
    Limits.from_env().check_requests(SteadyStateSettings().max_requests, "a steady-state prediction")
    return highest_rate(params, progress)


def slo_predict_larger_kv(params: SloPredictParams, *, progress: Callable = _no_progress) -> tuple[dict, ...]:
    """The predict mode's larger-KV rows but the deployment's own (`slo_predict.larger_kv_others`; () unless
    prompts share tokens). Same limit as `slo_predict`."""
    Limits.from_env().check_requests(SteadyStateSettings().max_requests, "a steady-state prediction")
    return larger_kv_others(params, progress)


def kernel_correctness(
    config: KernelConfig, backends: tuple[str, ...], device: str, *, progress: Callable = _no_progress
) -> dict[str, float]:
    """Max abs error of each paged backend against contiguous attention (`timing.correctness`). Refuses with
    MemoryBudgetError before allocating when the problem exceeds PAGED_LAB_MAX_BYTES."""
    check_budget(config)
    progress(0.0, "checking paged against contiguous attention")
    return correctness(config, list(backends), device)


def kernel_sweep(
    config: KernelConfig,
    backends: tuple[str, ...],
    device: str,
    repeats: int,
    measurement: int = 0,
    *,
    progress: Callable = _no_progress,
) -> dict:
    """The Kernels page's latency sweep, timed exactly as bench/attention.py times (`timing.measure`, the same
    process settings): {"copy_gbps": median GB/s, "copy": its `timer.spread`, "contexts": [int], "rows":
    [measure() rows for every context of `sweep_contexts`], "settings": `TimingSettings.as_dict()`,
    "measured_at": Unix time}. `measurement` only tells runs apart: a new number is a new cache key, so a
    page can ask for a fresh measurement. Every point is checked against the memory budget before it allocates."""
    check_budget(config)
    contexts = sweep_contexts(config.context_len, config.block_size)
    progress(0.0, "measuring copy bandwidth")
    settings = apply_timing_settings()
    copy = copy_bandwidth(device, nbytes=COPY_BYTES, repeats=5)
    rows: list[dict] = []
    for index, context in enumerate(contexts):
        progress(index / len(contexts), f"timing context {context:,} tokens ({index + 1} of {len(contexts)})")
        point = dataclasses.replace(config, context_len=context)
        check_budget(point)
        rows.extend(measure(point, list(backends), device, repeats=repeats, warmup=SWEEP_WARMUP))
    progress(1.0, "done")
    return {
        "copy_gbps": copy["median"],
        "copy": copy,
        "contexts": contexts,
        "rows": rows,
        "settings": settings.as_dict(),
        "measured_at": time.time(),
    }


# ---- the Engine page -------------------------------------------------------------------------------------------
MAX_ENGINE_SEQUENCES = 1_024  # prompts x (n or beam width) in one run of the Engine page


@dataclass(frozen=True, eq=False)
class Generation:
    """One `generate_outputs` or `chat_outputs` run, as plain data the Engine page draws from (shared: never
    mutated).

    prompt_token_ids: each prompt's token ids, in prompt order. outputs: `Engine.generate`'s RequestOutputs, in
    the same order. run: the engine's `last_run` (per-step metrics and block snapshots). texts: the model
    tokenizer's `decode(token_ids)` of every completion, keyed by `tuple(token_ids)`, when the model has a
    tokenizer (decoded in the worker, so the tokenizer never travels); None when it has none.
    """

    prompt_token_ids: tuple[tuple[int, ...], ...]
    outputs: tuple[RequestOutput, ...]
    run: EngineRun
    texts: dict[tuple[int, ...], str] | None


def _prompt_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _parse_prompts(lines: list[str], has_tokenizer: bool) -> list:
    """The lines themselves with a tokenizer, else token ids separated by spaces or commas."""
    if has_tokenizer:
        return lines
    try:
        return [[int(t) for t in line.replace(",", " ").split()] for line in lines]
    except ValueError:
        raise InvalidArgumentError(
            "this model has no tokenizer: give each prompt as token ids, e.g. '1 17 42 7'"
        ) from None


def _check_sequences(num_prompts: int, params: SamplingParams) -> None:
    sequences = num_prompts * params.num_sequences
    if sequences > MAX_ENGINE_SEQUENCES:
        raise InvalidArgumentError(
            f"{num_prompts:,} prompts x {params.num_sequences:,} outputs each = {sequences:,} sequences, over the "
            f"{MAX_ENGINE_SEQUENCES:,} one run may generate; use fewer prompts, samples or beams"
        )


def _generation(engine: Engine, prompts: list, params: SamplingParams, progress: Callable) -> Generation:
    ids = [p if not isinstance(p, str) else list(engine.tokenizer(p)["input_ids"]) for p in prompts]
    check_pool(engine, ids, params)
    with torch.inference_mode():
        outputs = engine.generate(
            ids, params, progress=lambda f: progress(f, f"{f:.0%} of the output tokens")
        )
    texts = None
    if engine.tokenizer is not None:
        texts = {
            tuple(c.token_ids): engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            for o in outputs
            for c in o.outputs
        }
    return Generation(
        tuple(tuple(o.prompt_token_ids) for o in outputs), tuple(outputs), engine.last_run, texts
    )


def generate_outputs(
    source: str,
    path: str,
    num_blocks: int,
    block_size: int,
    prefix_caching: bool,
    prompts_text: str,
    params: SamplingParams,
    *,
    progress: Callable = _no_progress,
) -> Generation:
    """`Engine.generate` of the prompts in `prompts_text` (one per non-empty line: text when the model has a
    tokenizer, else token ids) with `params`, on a fresh engine of `source` ("tiny", "smollm2", "directory":
    `core.page_models.engines.resolve_model`) on `default_device()`. num_blocks 0 sizes the pool from the memory budget.

    Before anything is allocated: InvalidArgumentError for no prompt or more than MAX_ENGINE_SEQUENCES
    sequences (prompts x n, or x beam width), LimitExceededError naming PAGED_LAB_MODEL_ROOT (before any file is
    opened) when the operator set a model root and `path` resolves outside it (`Limits.check_model_directory`),
    MemoryBudgetError naming PAGED_LAB_MAX_BYTES when the weights plus the KV pool exceed the operator's
    tensor-bytes limit; before generating, InvalidArgumentError for a pool too small for the largest request,
    naming the pools that run it (`check_pool`). The engine's own errors (ModelLoadError, ...) pass on.
    """
    lines = _prompt_lines(prompts_text)
    if not lines:
        raise InvalidArgumentError("enter at least one prompt (one per line)")
    _check_sequences(len(lines), params)
    engine = build_engine(source, path, num_blocks, block_size, prefix_caching, progress)
    return _generation(engine, _parse_prompts(lines, engine.tokenizer is not None), params, progress)


def chat_outputs(
    source: str,
    path: str,
    num_blocks: int,
    block_size: int,
    prefix_caching: bool,
    conversation: tuple[tuple[str, str], ...],
    params: SamplingParams,
    *,
    progress: Callable = _no_progress,
) -> Generation:
    """One chat turn: `conversation` ((role, content) pairs: an optional system prompt, earlier turns, the new
    user question) through the model's chat template (`Engine.chat_prompt`), then generated like
    `generate_outputs` (same checks; InvalidArgumentError for a model without a chat template). The answer ends
    at the model's EOS unless `params.ignore_eos`."""
    _check_sequences(1, params)
    engine = build_engine(source, path, num_blocks, block_size, prefix_caching, progress)
    _, ids = engine.chat_prompt([{"role": role, "content": content} for role, content in conversation])
    return _generation(engine, [ids], params, progress)


def engine_sharing(
    num_requests: int = 16,
    widths: tuple[int, ...] = (2, 4, 6),
    max_output_len: int = 256,
    *,
    progress: Callable = _no_progress,
) -> pd.DataFrame:
    """The Figure 15 measurement, `core.engine.sharing.measure_sharing(num_requests, widths, max_output_len)`:
    one row per (mode, width). Refused with MemoryBudgetError (PAGED_LAB_MAX_BYTES) before its engine is built
    when that engine would not fit the operator's tensor-bytes limit."""
    runs = 2 * len(widths)
    return measure_sharing(
        num_requests,
        widths,
        max_output_len=max_output_len,
        progress=lambda f: progress(f, f"run {min(int(f * runs) + 1, runs)} of {runs}"),
    )
