"""Published GPU serving figures, the step-time model's prediction beside each, and the GPU efficiencies fitted to
them (`gpu_step_defaults`, what `plan_slo` prices GPU steps with). Sources and the table: docs/slo.md.

The figures: NVIDIA's TensorRT-LLM performance overview ("Throughput Measurements": total output tokens/s of
`trtllm-bench throughput`, every request queued at once, fixed input / output lengths, FP8 checkpoints) for
Llama-3.1-8B on one H100 / H200 and Llama-3.3-70B (Llama-3.1-70B's architecture) on two H100 (TP 2) / one H200.

The prediction reproduces the benchmark's settings, then prices its steady state with the step-time model:
- memory (trtllm-bench's `calc_engine_setting`): weights = parameters x 1 byte (FP8) over tp, the KV cache FP8
  (it forces FP8 KV for FP8 checkpoints), KV memory = 0.95 x (GPU memory x tp - weights); the requests that
  fit = KV memory / (KV bytes per token x (ISL + OSL)); max_batch_size and max_num_tokens by its
  `finetune_setting` rounding (batch = min(fit, 4096) rounded up; tokens = batch x (1 + ISL / OSL) rounded up,
  at most 32,768);
- concurrency B = min(max_batch_size, requests that fit): TensorRT-LLM's default capacity policy
  (GUARANTEED_NO_EVICT) reserves ISL + OSL tokens per request;
- steady state (`steady_state_throughput`): d = min(B, max_num_tokens / (1 + ISL / (OSL - 1))) requests decode
  each step and lam = d / (OSL - 1) new requests are prefilled per step (lam x ISL tokens); one step then has
  d + lam x ISL tokens, d x (ISL + OSL / 2) keys read and d x (ISL + OSL / 2) + lam x ISL (ISL + 1) / 2
  attention pairs, and the throughput is lam x OSL output tokens per step time.
`fit_published` fits bandwidth_efficiency, flops_efficiency and overhead_s by Gauss-Newton least squares on
log(predicted / published) over the TRAINING figures (the H100 rows); the H200 rows are held out.
"""

import math
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.step_model import StepTimeModel
from core.planning.cost.step_time import from_specs
from core.planning.memory.kv_accounting import kv_bytes_per_token, weight_bytes_per_gpu

TRTLLM_SOURCE = (
    "NVIDIA TensorRT-LLM performance overview, Throughput Measurements "
    "(https://nvidia.github.io/TensorRT-LLM/performance/perf-overview.html; "
    "github.com/NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md at 00f37686aa85)"
)
KV_MEMORY_FRACTION = 0.95  # trtllm-bench's kv_cache_gpu_mem_fraction
SETTINGS = (
    (128, 128),
    (128, 2048),
    (128, 4096),
    (500, 2000),
    (1000, 1000),
    (1000, 2000),
    (2048, 128),
    (2048, 2048),
    (5000, 500),
    (20000, 2000),
)
# (model preset, GPU preset, tp) -> published output tokens/s per SETTINGS entry
TABLES = {
    ("llama-3.1-8b", "h100-80gb", 1): (28312, 22714, 14325, 17660, 15220, 13899, 3450, 9305, 3459, 1351),
    ("llama-3.1-8b", "h200-141gb", 1): (27911, 26221, 18027, 20770, 17744, 16828, 3538, 12194, 3902, 1804),
    ("llama-3.1-70b", "h100-80gb", 2): (6378, 6651, 4199, 5222, 4205, 4146, 762, 3082, 898, 437),
    ("llama-3.1-70b", "h200-141gb", 1): (3803, 4336, 2872, 3666, 2909, 2994, 442, 2003, 566, 283),
}
TRAINING_GPUS = ("h100-80gb",)
FIT_NAMES = ("bandwidth_efficiency", "flops_efficiency", "overhead_s")
START = {"bandwidth_efficiency": 0.8, "flops_efficiency": 0.5, "overhead_s": 0.003}


@dataclass(frozen=True)
class PublishedFigure:
    """One published throughput: model / gpu presets, tp, input / output lengths (tokens), output tokens/s."""

    model: str
    gpu: str
    tp: int
    isl: int
    osl: int
    tokens_per_s: float
    source: str = TRTLLM_SOURCE

    @property
    def training(self) -> bool:
        return self.gpu in TRAINING_GPUS

    @property
    def label(self) -> str:
        return f"{MODELS[self.model].name} FP8, {GPUS[self.gpu].name} TP{self.tp}, ISL {self.isl} / OSL {self.osl}"


FIGURES = tuple(
    PublishedFigure(model, gpu, tp, isl, osl, value)
    for (model, gpu, tp), values in TABLES.items()
    for (isl, osl), value in zip(SETTINGS, values, strict=True)
)


def _round_up(value: float, step: int) -> int:
    return step * math.ceil(value / step)


def bench_settings(figure: PublishedFigure) -> tuple[int, int, int]:
    """(max_batch_size, max_num_tokens, requests that fit in the KV cache) as trtllm-bench derives them."""
    model, gpu, tp = MODELS[figure.model], GPUS[figure.gpu], figure.tp
    weights = weight_bytes_per_gpu(model, "fp8", tp) * tp
    cache_bytes = KV_MEMORY_FRACTION * (gpu.memory_bytes * tp - weights)
    per_token = kv_bytes_per_token(model, "fp8", tp) * tp  # every rank's share (heads replicated past tp)
    fit = cache_bytes / (per_token * (figure.isl + figure.osl))
    raw_bs = min(fit, 4096)
    if raw_bs < 256:
        batch = max(64, _round_up(raw_bs, 32))
    else:
        batch = _round_up(raw_bs, 128) if raw_bs < 1024 else _round_up(raw_bs, 256)
    raw_tokens = min(raw_bs * (1 + figure.isl / figure.osl), 32768)
    if raw_tokens < 4096:
        tokens = max(2048, _round_up(raw_tokens, 256))
    else:
        tokens = _round_up(raw_tokens, 512) if raw_tokens < 8192 else _round_up(raw_tokens, 1024)
    return batch, tokens, int(fit)


def steady_state_throughput(
    step: StepTimeModel, isl: int, osl: int, concurrency: int, max_tokens: int
) -> float:
    """Output tokens/s of a saturated replica holding `concurrency` requests of fixed lengths (module docstring)."""
    decode_steps = max(osl - 1, 1)
    d = min(concurrency, max_tokens / (1 + isl / decode_steps))
    lam = d / decode_steps
    new_tokens = d + lam * isl
    context = isl + osl / 2
    seconds = step.step_seconds(new_tokens, d * context, d * context + lam * isl * (isl + 1) / 2)
    return lam * osl / seconds


def predict(figure: PublishedFigure, overrides: dict) -> float:
    """The model's output tokens/s for `figure` with these step-time parameters."""
    step = from_specs(MODELS[figure.model], GPUS[figure.gpu], figure.tp, "fp8", "fp8", **overrides)
    batch, tokens, fit = bench_settings(figure)
    return steady_state_throughput(step, figure.isl, figure.osl, min(batch, fit), tokens)


def _log_errors(params: np.ndarray, figures) -> np.ndarray:
    overrides = dict(zip(FIT_NAMES, np.exp(params), strict=True))
    return np.array([math.log(predict(f, overrides) / f.tokens_per_s) for f in figures])


def fit_published(figures=None, iterations: int = 30) -> dict:
    """bandwidth_efficiency, flops_efficiency, overhead_s minimising sum(log(predicted / published)^2) over
    `figures` (default: the training rows), by Gauss-Newton on their logs with finite-difference Jacobians and
    the efficiencies held in (0, 1]."""
    figures = [f for f in FIGURES if f.training] if figures is None else list(figures)
    x = np.log([START[n] for n in FIT_NAMES])
    for _ in range(iterations):
        r = _log_errors(x, figures)
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            dx = np.zeros_like(x)
            dx[j] = 1e-6
            jac[:, j] = (r - _log_errors(x - dx, figures)) / 1e-6  # backward: an efficiency may sit at 1
        step = np.linalg.lstsq(jac, -r, rcond=None)[0]
        x_new = np.minimum(x + step, [0.0 if n.endswith("efficiency") else math.inf for n in FIT_NAMES])
        if np.max(np.abs(x_new - x)) < 1e-10:
            x = x_new
            break
        x = x_new
    return dict(zip(FIT_NAMES, (float(v) for v in np.exp(x)), strict=True))


@cache
def gpu_step_defaults() -> dict:
    """The fitted GPU step-time parameters (recomputed from the figures, once per process)."""
    return fit_published()


def comparison(overrides: dict | None = None) -> list[dict]:
    """One row per figure: source, label, published and predicted tokens/s, relative error, training or held out."""
    overrides = gpu_step_defaults() if overrides is None else overrides
    rows = []
    for f in FIGURES:
        predicted = predict(f, overrides)
        rows.append(
            {
                "figure": f,
                "published": f.tokens_per_s,
                "predicted": predicted,
                "error": predicted / f.tokens_per_s - 1.0,
                "set": "training" if f.training else "held out",
            }
        )
    return rows


def with_defaults(step: StepTimeModel) -> StepTimeModel:
    """`step` with the fitted GPU efficiencies and overhead."""
    return replace(step, **gpu_step_defaults())
