"""The vLLM step-time parameters fitted to measured vLLM serving figures (`core.planning.cost.fits.engine_profiles`
stores the fitted values; docs/slo.md has the method and the table). The figures, their deployments, KV capacity
and sets (training, held out, KV-limited) are `core.planning.cost.fits.published_vllm_rows`'s; how each is
predicted, each row's benchmark replayed and re-priced for any parameters, is
`core.planning.cost.fits.benchmark_replay`'s (its names are this module's too: `predict_row`, `Benchmark`,
`RowReplay`, ...).

`fit_vllm` fits FIT_NAMES (FIXED held) by Gauss-Newton least squares on log(predicted / measured) of mean TTFT
and mean TPOT over the training rows. The stored profile `VLLM_STEP_DEFAULTS` is the earlier single-model fit
(SINGLE_MODEL_FIT_NAMES on Llama-3.1-70B's H100 rows, its H200 rows held out); FIT_NAMES / FIXED are the
cross-model profile (docs/slo.md, section 2c).
"""

import math
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat

import numpy as np

from core.planning.cost.fits.benchmark_replay import (  # noqa: F401 (this module's names too: module docstring)
    AIPERF_DATASET_ENTRIES,
    AIPERF_SEED,
    BENCHMARK,
    BENCHMARK_ROUNDS,
    FIFTH_STAGE_BENCHMARK,
    MEASURED_ROUNDS,
    PHASE_SEED,
    SIXTH_STAGE_BENCHMARK,
    STEADY_PHASES,
    WARMUP_ROUNDS,
    Benchmark,
    RowReplay,
    pool_draws,
    predict_row,
    prefill_fraction_of_peak,
    request_latency,
    row_benchmark_mean,
    step_model,
)
from core.planning.cost.fits.engine_profiles import REQUEST_TERM  # noqa: F401
from core.planning.cost.fits.gauss_newton import NewtonLimits, damped_gauss_newton
from core.planning.cost.fits.published_vllm_rows import (
    ATTENTION_DP_ROWS,
    HELD_OUT_GPU_ROWS,
    ROWS,
    TRAINING_MODELS,
    kv_limited,
    rank_rows,
    row_set,
    training_rows,
)

# The set of the held-out GPU's rows (`held_out_gpu_comparison`), apart from "training" and "held out".
HELD_OUT_GPU_SET = "held-out gpu"

# The cross-model profile (issue 40): one FLOP/s efficiency for dense GEMMs, one for routed-expert GEMMs, a
# bandwidth efficiency for the routed experts' weight reads (grouped GEMMs over few rows per expert; the dense
# reads at the datasheet bandwidth), and a fixed cost per kernel per step (the fifth stage; the kernels each
# layer launches: `core.planning.cost.layer_kernels`); the dense weights and K/V read at the datasheet bandwidth
# (the single-model fit put bandwidth_efficiency at its bound 1), no fixed cost beside the per-kernel one and no
# per-token host time (the single-model fit's 16.6 us per token, fixed whatever the model and TP, made an 8B
# model's 8,192-token prefill cost 136 ms of host time alone), and a request-side latency (REQUEST_TERM: a fixed
# time per request outside the steps plus the step in flight when it arrives; docs/slo.md 2c).
FIT_NAMES = (
    "flops_efficiency",
    "kernel_overhead_s",
    "expert_flops_efficiency",
    "expert_bandwidth_efficiency",
    "request_overhead_s",
)
# The third stage (docs/slo.md 2c; `bench.slo_published --per-layer`): the same with a fixed cost per layer
# whatever the layer runs.
THIRD_STAGE_FIT_NAMES = tuple("layer_overhead_s" if n == "kernel_overhead_s" else n for n in FIT_NAMES)
# The fourth stage (docs/slo.md 2c: tried, not adopted; `bench.slo_published --train-minimax`): MiniMax-M2.5 in
# training (published_vllm_rows.FOURTH_STAGE_TRAINING_MODELS) and the routed experts' two efficiencies per expert
# weight format, FP8 block-quantized experts (MiniMax-M2.5, Qwen3-235B-A22B) with their own FLOP/s and bandwidth
# shares (fp8_expert_*, `from_specs`), gpt-oss-120b's MXFP4 ones keeping the shared two.
FP8_EXPERT_NAMES = ("fp8_expert_flops_efficiency", "fp8_expert_bandwidth_efficiency")
FOURTH_STAGE_FIT_NAMES = THIRD_STAGE_FIT_NAMES + FP8_EXPERT_NAMES
FIXED = {"bandwidth_efficiency": 1.0, "overhead_s": 0.0, "per_token_overhead_s": 0.0}
# Every row's routed experts priced as the routed kernels compute them, vLLM 0.12's padded DeepGEMM kernel too
# (`published_vllm_rows.expert_block_rows` off): how every stage of docs/slo.md 2c before the eighth priced the rows.
ROUTED_EXPERTS = {"expert_block_rows": 0}
SINGLE_MODEL_FIT_NAMES = ("bandwidth_efficiency", "flops_efficiency", "overhead_s", "per_token_overhead_s")
# Gauss-Newton's starting point: round values near the cross-model solution (the fit is the same from 0.4 / 2e-5
# / 0.2 in more iterations: docs/slo.md 2c).
START = {
    "bandwidth_efficiency": 0.6,
    "flops_efficiency": 0.3,
    "overhead_s": 0.003,
    "per_token_overhead_s": 1e-6,
    "layer_overhead_s": 7e-5,
    "kernel_overhead_s": 6e-6,
    "expert_flops_efficiency": 0.08,
    "expert_bandwidth_efficiency": 0.7,
    "fp8_flops_ratio": 1.5,
    "request_overhead_s": 0.03,
}
# The fourth stage's starting point: round values near its solution.
FOURTH_STAGE_START = START | {
    "expert_flops_efficiency": 0.15,
    "request_overhead_s": 0.035,
    "fp8_expert_bandwidth_efficiency": 0.55,
    "fp8_expert_flops_efficiency": 0.04,
}


_REPLAYS: dict = {}  # row -> its RowReplay, one per row for the process (`replay`, `record_replays`)


def replay(row) -> RowReplay:
    """`row`'s RowReplay, one per row for the process (recorded with START; any parameters record the same)."""
    if row not in _REPLAYS:
        _REPLAYS[row] = RowReplay(row, START)
    return _REPLAYS[row]


def record_replays(rows, phases=BENCHMARK.phases, processes: int | None = None) -> None:
    """Simulate the `phases` of each row's replay not yet recorded, in `processes` worker processes (None: one
    per CPU), and keep them for `replay`: the simulations are most of a fit's time and independent of each
    other; pricing them after is numpy in this process. The recordings are the ones `replay` would make here."""
    todo = [row for row in dict.fromkeys(rows) if row not in _REPLAYS]
    if not todo:
        return
    with ProcessPoolExecutor(processes) as pool:
        for row, recorded in zip(
            todo, pool.map(_recorded, todo, repeat(tuple(phases)), chunksize=4), strict=True
        ):
            _REPLAYS[row] = recorded


def _recorded(row, phases: tuple[str, ...]) -> RowReplay:
    """A new RowReplay of `row` with `phases` recorded (`record_replays`' worker)."""
    out = RowReplay(row, START)
    for phase in phases:
        out.phase_latencies(START, phase)
    return out


def _log_errors(x: np.ndarray, rows, names=FIT_NAMES, fixed=None, benchmark=BENCHMARK) -> np.ndarray:
    overrides = dict(fixed or {}) | dict(zip(names, np.exp(x), strict=True))
    out = []
    for row in rows:
        ttft, tpot = replay(row).latencies(overrides, benchmark)
        out += [math.log(ttft / row.ttft_s), math.log(tpot / row.tpot_s)]
    return np.array(out)


def fit_vllm(
    rows=None, iterations: int = 60, names=FIT_NAMES, fixed=FIXED, start=START, benchmark=BENCHMARK
) -> dict:
    """FIT_NAMES minimising sum(log(predicted / measured)^2) over mean TTFT and mean TPOT of `rows` (default: the
    training rows), by damped Gauss-Newton on their logs from `start` (finite-difference Jacobians, the
    efficiencies held in (0, 1], the overheads > 0 by the log); the means of `benchmark` (`Benchmark`: BENCHMARK,
    or SIXTH_STAGE_BENCHMARK / FIFTH_STAGE_BENCHMARK as those stages were fitted)."""
    rows = training_rows() if rows is None else list(rows)
    upper = np.array(
        [
            0.0 if n.endswith("efficiency") else math.log(2) if n == "fp8_flops_ratio" else math.inf
            for n in names
        ]
    )

    def residual(x: np.ndarray) -> np.ndarray:
        return _log_errors(x, rows, names, fixed, benchmark)

    def jacobian(x: np.ndarray, r: np.ndarray) -> np.ndarray:
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            dx = np.zeros_like(x)
            dx[j] = 1e-6
            jac[:, j] = (r - residual(x - dx)) / 1e-6  # backward: an efficiency may sit at 1
        return jac

    x0 = np.log([start[n] for n in names])
    x, _ = damped_gauss_newton(residual, jacobian, x0, upper, NewtonLimits(iterations=iterations))
    return dict(fixed or {}) | dict(zip(names, (float(v) for v in np.exp(x)), strict=True))


def comparison(
    overrides: dict, rows=None, training_models=TRAINING_MODELS, benchmark: Benchmark = BENCHMARK
) -> list[dict]:
    """One dict per row of `rows` (default ROWS): the row, measured and predicted mean TTFT / TPOT (seconds), their
    relative errors (predicted / measured - 1) and the set ("training", "held out", "kv-limited"; training: the
    rows of `training_models`); the means of `benchmark` (`Benchmark`)."""
    out = []
    for row in ROWS if rows is None else rows:
        ttft, tpot = replay(row).latencies(overrides, benchmark)
        out.append(
            {
                "row": row,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "ttft_error": ttft / row.ttft_s - 1.0,
                "tpot_error": tpot / row.tpot_s - 1.0,
                "set": row_set(row, training_models),
            }
        )
    return out


def held_out_gpu_comparison(
    overrides: dict, benchmark: Benchmark = BENCHMARK, rows=HELD_OUT_GPU_ROWS
) -> list[dict]:
    """`comparison` of the held-out GPU's rows (HELD_OUT_GPU_ROWS: B200, whose rows no fit sees, the training
    models' included), set "held-out gpu" (or "kv-limited"), so `errors_by_model(rows, HELD_OUT_GPU_SET)` gives
    each model's errors on it."""
    rows = comparison(overrides, rows, benchmark=benchmark)
    return [r | {"set": r["set"] if r["set"] == "kv-limited" else HELD_OUT_GPU_SET} for r in rows]


def rms_relative_error(rows: list[dict], which: str) -> float:
    """RMS of the TTFT and TPOT relative errors together over the comparison rows of set `which`."""
    errors = [e for r in rows if r["set"] == which for e in (r["ttft_error"], r["tpot_error"])]
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else math.nan


def _rms(values) -> float:
    return float(np.sqrt(np.mean(np.square(values)))) if len(values) else math.nan


def errors_by_model(rows: list[dict], which: str) -> dict:
    """{model: {"ttft_rms_rel_err", "tpot_rms_rel_err", "rms_rel_err", "rows", "by_gpu"}} over the comparison rows
    of set `which`: the RMS relative errors of TTFT and TPOT apart and together, the row count, and the same per
    GPU ({gpu: {...}} without by_gpu)."""

    def summary(group: list[dict]) -> dict:
        ttft, tpot = [r["ttft_error"] for r in group], [r["tpot_error"] for r in group]
        return {
            "ttft_rms_rel_err": _rms(ttft),
            "tpot_rms_rel_err": _rms(tpot),
            "rms_rel_err": _rms(ttft + tpot),
            "rows": len(group),
        }

    out = {}
    for model in dict.fromkeys(r["row"].model for r in rows if r["set"] == which):
        group = [r for r in rows if r["set"] == which and r["row"].model == model]
        gpus = dict.fromkeys(r["row"].gpu for r in group)
        out[model] = summary(group) | {
            "by_gpu": {g: summary([r for r in group if r["row"].gpu == g]) for g in gpus}
        }
    return out


def attention_dp_comparison(
    overrides: dict, rows=ATTENTION_DP_ROWS, benchmark: Benchmark = BENCHMARK
) -> list[dict]:
    """`comparison` of the attention-DP rows (docs/slo.md, section 2d; never fitted): each row priced as its DP
    ranks (`rank_rows`), one rank simulated per distinct share of the clients (`predict_row`, with the KV cache
    of one DP rank and `from_specs(..., data_parallel=D)`: the rank's own batch, the experts touched by all D
    ranks' tokens, the DP collectives), the means weighted by clients, each rank's benchmark replayed as
    `benchmark`. set: "kv-limited" when a rank is."""
    out = []
    for row in rows:
        ranks = rank_rows(row)
        means = [(predict_row(rank, overrides, benchmark=benchmark), clients) for rank, clients in ranks]
        ttft = sum(m[0] * c for m, c in means) / row.concurrency
        tpot = sum(m[1] * c for m, c in means) / row.concurrency
        limited = any(kv_limited(rank) for rank, _ in ranks)
        out.append(
            {
                "row": row,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "ttft_error": ttft / row.ttft_s - 1.0,
                "tpot_error": tpot / row.tpot_s - 1.0,
                "set": "kv-limited" if limited else "attention dp",
            }
        )
    return out
