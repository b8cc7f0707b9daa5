"""vLLM's fused-MoE kernels measured alone, per expert shape, weight format, token count and TP, and a roofline
fitted to them (issue 40, docs/slo.md 2c): evidence on the routed experts' efficiencies that does not go through
the end-to-end serving rows.

The rows (`load_rows`, core/planning/cost/fits/data/vllm_moe_kernels.csv; provenance in its header):
ai-dynamo/aiconfigurator's vLLM MoE tables on H100 / H200 SXM (vLLM 0.14.0, 0.18.0 (H200 only), 0.19.0), the
`balanced` routing rows without expert parallelism, for FP8 block-quantized (`fp8_block`), int4 weight-only
(`int4_wo`) and MXFP4 weight-only (`w4a16_mxfp4`) experts: the latency of one MoE layer's experts on one GPU for
`num_tokens` tokens, each expert's matrices split `moe_tp_size` ways (the MXFP4 rows time the whole FusedMoE
module, router top-k included; the others the experts on precomputed top-k ids: the CSV's header says which
kernel each version's rows ran).

The kernel model, for n tokens routed to k of E experts of hidden size h and width i, split over tp GPUs:

    expert bytes  = E x 3 h i / tp x bytes per parameter (BYTES_PER_PARAM)          one layer, this GPU
    memory_s      = expert bytes x touched(n) / E / memory_bandwidth                  (efficiency 1)
    compute_s     = 2 x n x k x 3 h i / tp / peak                                     (efficiency 1)
    t(n)          = fixed_s + max(memory_s / bandwidth_efficiency, compute_s / flops_efficiency)

with touched(n) the experts the rows' routing reaches (`balanced_experts_touched`: aiconfigurator's balanced
assignment spreads the n x k choices over distinct experts, min(E, n k) of them for the held-out models' shapes;
the step-time model's uniform routing expects E (1 - (1 - k / E)^n), fewer from 2 tokens on until nearly all are
touched) and peak the GPU's FP8 peak for FP8 weights, its bf16 peak for the 4-bit weight-only formats (as
`core.planning.cost.step_time.from_specs` prices the experts: the two efficiencies mean what the step model's
expert_bandwidth_efficiency and expert_flops_efficiency mean). `fit_kernel_model` fits fixed_s and the two
efficiencies by least squares on log(predicted / measured).
"""

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.layer_structure import moe_layers as structure_moe_layers
from core.planning.catalog.models import MODELS
from core.planning.catalog.weights import bits_per_quantized_param
from core.planning.cost.expert_rows import uniform_experts_touched
from core.planning.cost.fits.gauss_newton import NewtonLimits, damped_gauss_newton
from core.planning.memory.kv_accounting import DTYPE_BITS

DATA_PATH = Path(__file__).parent / "data" / "vllm_moe_kernels.csv"
SOURCE = (
    "ai-dynamo/aiconfigurator, aic-core/src/aiconfigurator_core/systems/data/{h100_sxm,h200_sxm}/moe/vllm/"
    "<version>/moe_perf.parquet at commit 095f58a51c4ca8e61b66ec108d86f223f8d559ce (Apache-2.0): balanced "
    "routing, moe_ep_size 1, fp8_block / int4_wo / w4a16_mxfp4, vLLM 0.14.0 / 0.18.0 / 0.19.0"
)
COLUMNS = (
    "gpu",
    "version",
    "kernel_source",
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "latency_ms",
)
FORMATS = ("fp8_block", "int4_wo", "w4a16_mxfp4")
VERSIONS = ("0.14.0", "0.18.0", "0.19.0")
# Stored bytes per expert parameter, the planner's figures (core.planning.catalog.weights): FP8 one byte (the
# 128 x 128 blocks' scales are under 0.01 %); int4 4 bits + a 16-bit scale per group of 32 (Kimi-K2.5's
# compressed-tensors checkpoint, the group size aiconfigurator's int4_wo rows use); MXFP4 4 bits + an 8-bit scale
# per 32 (gpt-oss).
BYTES_PER_PARAM = {
    "fp8_block": DTYPE_BITS["fp8"] / 8,
    "int4_wo": bits_per_quantized_param(MODELS["kimi-k2.5"]) / 8,
    "w4a16_mxfp4": bits_per_quantized_param(MODELS["gpt-oss-120b"]) / 8,
}
FP8_FORMATS = ("fp8_block",)  # priced at the GPU's FP8 peak; the others at its bf16 peak


class MoeShape(NamedTuple):
    """One MoE layer's routed experts: hidden size, expert width (moe_intermediate_size), experts per token, experts."""

    hidden_size: int
    inter_size: int
    topk: int
    num_experts: int


# The shapes of the MoE models held out of the serving fit (docs/slo.md 2c), from their config.json (the presets'
# fields: hidden_size, moe_intermediate_size, num_experts_per_tok, n_routed_experts / num_experts), with the
# format each is served in (Qwen3-235B-A22B-FP8 and MiniMax-M2.5: FP8 128 x 128 blocks; Kimi-K2.5: int4 experts).
HELD_OUT_SHAPES = {
    "qwen3-235b-a22b": MoeShape(4096, 1536, 8, 128),
    "minimax-m2.5": MoeShape(3072, 1536, 8, 256),
    "kimi-k2.5": MoeShape(7168, 2048, 8, 384),
}
HELD_OUT_FORMATS = {"qwen3-235b-a22b": "fp8_block", "minimax-m2.5": "fp8_block", "kimi-k2.5": "int4_wo"}


@cache
def _rows(path: Path) -> pd.DataFrame:
    with path.open() as f:
        frame = pd.read_csv(f, comment="#", dtype={"version": str})
    if tuple(frame.columns) != COLUMNS:
        raise InvalidArgumentError(f"{path} has columns {tuple(frame.columns)}; expected {COLUMNS}")
    return frame


def load_rows(path: Path = DATA_PATH) -> pd.DataFrame:
    """The kernel rows (COLUMNS; latency_ms in milliseconds), a new DataFrame each call."""
    return _rows(Path(path)).copy()


def provenance(path: Path = DATA_PATH) -> str:
    """The file's `#` header lines, the leading `# ` removed, joined with spaces."""
    lines = []
    with Path(path).open() as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line[1:].strip())
    return " ".join(lines)


@cache
def balanced_experts_touched(num_tokens: int, topk: int, num_experts: int) -> int:
    """Distinct experts that aiconfigurator's `balanced` routing gives `num_tokens` tokens (collector/helper.py's
    balanced_logits at the commit of SOURCE): with stride s = ceil(E / k), token t takes experts
    (t + j s) mod E for j < k when n >= s, else (t s / n + j s) mod E (float32, truncated). It spreads the n x k
    choices over distinct experts: min(E, n k) for most shapes of the rows (a few choices collide at 4 of their
    (n, k, E): 16 tokens at 22 of 512, 32 at 6 of 256 and at 10 of 512, 48 at 10 of 512)."""
    n, k, e = (
        _positive(num_tokens, "num_tokens"),
        _positive(topk, "topk"),
        _positive(num_experts, "num_experts"),
    )
    stride = -(-e // k)
    t = np.arange(n, dtype=np.int64)[:, None]
    j = np.arange(k, dtype=np.int64)[None, :]
    if n >= stride:
        chosen = (t + j * stride) % e
    else:  # torch's int64 / int true division runs in float32, the sum and remainder too
        first = (t * stride).astype(np.float32) / np.float32(n)
        chosen = np.remainder(first + (j * stride).astype(np.float32), np.float32(e)).astype(np.int64)
    return int(np.unique(chosen).size)


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def expert_bytes(shape: MoeShape, moe_dtype: str, tp: int) -> float:
    """Bytes of one layer's routed experts on one of tp GPUs: E x 3 h i / tp x BYTES_PER_PARAM."""
    if moe_dtype not in BYTES_PER_PARAM:
        raise InvalidArgumentError(f"moe_dtype {moe_dtype!r} is not one of {', '.join(FORMATS)}")
    h, i, _, e = shape
    return e * 3.0 * h * i / tp * BYTES_PER_PARAM[moe_dtype]


ROUTINGS = ("balanced", "uniform")


def ideal_seconds(rows: pd.DataFrame, routing: str = "balanced") -> tuple[np.ndarray, np.ndarray]:
    """(memory_s, compute_s) of each row at efficiency 1 (module docstring), on its GPU's datasheet roofs.
    routing: "balanced", the experts the rows' routing touched (`balanced_experts_touched`), or "uniform", the
    step-time model's expectation E (1 - (1 - k / E)^n) (an ablation: not what the rows ran)."""
    if routing not in ROUTINGS:
        raise InvalidArgumentError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if len(rows) == 0:
        return np.zeros(0), np.zeros(0)
    unknown = set(rows["gpu"]) - set(GPUS)
    if unknown:
        raise InvalidArgumentError(f"unknown GPU slugs {sorted(unknown)}")
    fmt = rows["moe_dtype"].to_numpy()
    bad = set(fmt) - set(FORMATS)
    if bad:
        raise InvalidArgumentError(f"moe_dtype {sorted(bad)} not among {', '.join(FORMATS)}")
    gpu = rows["gpu"].to_numpy()
    bandwidth = np.array([float(GPUS[g].memory_bandwidth) for g in gpu])
    fp8 = np.isin(fmt, FP8_FORMATS)
    peak = np.array(
        [
            float(GPUS[g].peak_fp8_flops if f else GPUS[g].peak_bf16_flops)
            for g, f in zip(gpu, fp8, strict=True)
        ]
    )
    h, i, k, tp, n = (
        rows[c].to_numpy(dtype=np.float64)
        for c in ("hidden_size", "inter_size", "topk", "moe_tp_size", "num_tokens")
    )
    per_expert = 3.0 * h * i / tp * np.array([BYTES_PER_PARAM[f] for f in fmt])
    if routing == "uniform":
        e = rows["num_experts"].to_numpy(dtype=np.float64)
        touched = e * uniform_experts_touched(n, k, e)
    else:
        touched = np.array(
            [
                balanced_experts_touched(int(a), int(b), int(c))
                for a, b, c in zip(rows["num_tokens"], rows["topk"], rows["num_experts"], strict=True)
            ],
            dtype=np.float64,
        )
    memory = per_expert * touched / bandwidth
    compute = 2.0 * n * k * 3.0 * h * i / tp / peak
    return memory, compute


@dataclass(frozen=True)
class KernelModel:
    """t = fixed_s + max(memory_s / bandwidth_efficiency, compute_s / flops_efficiency) (module docstring)."""

    fixed_s: float
    bandwidth_efficiency: float
    flops_efficiency: float

    def __post_init__(self):
        if not self.fixed_s >= 0:
            raise InvalidArgumentError(f"fixed_s must be >= 0, got {self.fixed_s!r}")
        for name in ("bandwidth_efficiency", "flops_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise InvalidArgumentError(f"{name} must be in (0, 1], got {getattr(self, name)!r}")

    def seconds(self, memory_s, compute_s):
        """Seconds for rows with these ideal roofs (numbers or arrays)."""
        return self.fixed_s + np.maximum(
            np.asarray(memory_s) / self.bandwidth_efficiency, np.asarray(compute_s) / self.flops_efficiency
        )


@dataclass(frozen=True)
class KernelFit:
    """A fitted KernelModel, its RMS of log(predicted / measured) over the rows it was fitted on, and how many."""

    model: KernelModel
    rms_log_error: float
    rows: int


START = (30e-6, 0.5, 0.3)  # fixed_s, bandwidth_efficiency, flops_efficiency
# Further starts (the max() has a kink: each is run and the lowest cost kept).
STARTS = (START, (10e-6, 0.9, 0.05), (60e-6, 0.1, 0.6))


def log_errors(model: KernelModel, memory_s, compute_s, measured_s) -> np.ndarray:
    """log(predicted / measured) per row."""
    return np.log(model.seconds(memory_s, compute_s) / np.asarray(measured_s, dtype=np.float64))


def fit_kernel_model(memory_s, compute_s, measured_s, iterations: int = 200, starts=STARTS) -> KernelFit:
    """fixed_s, bandwidth_efficiency and flops_efficiency minimising sum(log(predicted / measured)^2): damped
    Gauss-Newton on their logs (analytic Jacobian, the step halved until the cost falls, the efficiencies held
    at most 1) from each of `starts`, the lowest cost kept. Raises InvalidArgumentError for fewer than 4 rows,
    arrays of unequal length, or a time that is not finite and > 0."""
    memory, compute, measured = (np.asarray(v, dtype=np.float64) for v in (memory_s, compute_s, measured_s))
    if not memory.shape == compute.shape == measured.shape or memory.ndim != 1:
        raise InvalidArgumentError("memory_s, compute_s and measured_s must be 1-d arrays of one length")
    if memory.size < 4:
        raise InvalidArgumentError(f"fitting 3 parameters needs at least 4 rows, got {memory.size}")
    for name, values in (("memory_s", memory), ("compute_s", compute), ("measured_s", measured)):
        if not (np.all(np.isfinite(values)) and np.all(values > 0)):
            raise InvalidArgumentError(f"{name} must be finite and > 0")
    log_measured = np.log(measured)
    upper = np.array([math.inf, 0.0, 0.0])

    def parts(x):
        a, be, fe = np.exp(x)
        mem, comp = memory / be, compute / fe
        return a, mem, comp, a + np.maximum(mem, comp)

    def residual(x):
        return np.log(parts(x)[3]) - log_measured

    def jacobian(x, r):
        a, mem, comp, predicted = parts(x)
        memory_bound = mem >= comp
        return np.column_stack(
            (
                a / predicted,
                np.where(memory_bound, -mem, 0.0) / predicted,
                np.where(memory_bound, 0.0, -comp) / predicted,
            )
        )

    limits = NewtonLimits(iterations=iterations, halvings=30, tolerance=1e-10)
    fits = [
        damped_gauss_newton(residual, jacobian, np.log(np.asarray(s, dtype=np.float64)), upper, limits)
        for s in starts
    ]
    x, r = min(fits, key=lambda fit: fit[1] @ fit[1])
    a, be, fe = (float(v) for v in np.exp(x))
    return KernelFit(KernelModel(a, be, fe), float(np.sqrt(np.mean(r**2))), int(r.size))


def shape_mask(rows: pd.DataFrame, shape: MoeShape) -> np.ndarray:
    """Rows of this expert shape."""
    return (
        (rows["hidden_size"].to_numpy() == shape.hidden_size)
        & (rows["inter_size"].to_numpy() == shape.inter_size)
        & (rows["topk"].to_numpy() == shape.topk)
        & (rows["num_experts"].to_numpy() == shape.num_experts)
    )


def held_out_mask(rows: pd.DataFrame) -> np.ndarray:
    """Rows of any held-out model's shape (HELD_OUT_SHAPES)."""
    mask = np.zeros(len(rows), dtype=bool)
    for shape in HELD_OUT_SHAPES.values():
        mask |= shape_mask(rows, shape)
    return mask


def measured_ms(rows: pd.DataFrame, num_tokens: float) -> float:
    """The latency (ms) of `rows` (one GPU, version, format, shape and TP) at `num_tokens`: the mean of the
    repeated measurements at each token count, interpolated linearly in log n between the two nearest measured
    counts. Raises InvalidArgumentError when there are no rows, they mix configurations, or n lies outside them."""
    if len(rows) == 0:
        raise InvalidArgumentError("no kernel rows for this configuration")
    key = [c for c in COLUMNS if c not in ("num_tokens", "latency_ms", "kernel_source")]
    if len(rows[key].drop_duplicates()) != 1:
        raise InvalidArgumentError(
            "measured_ms needs the rows of one configuration (GPU, version, format, shape, TP)"
        )
    by_n = rows.groupby("num_tokens")["latency_ms"].mean()
    n = by_n.index.to_numpy(dtype=np.float64)
    if not n[0] <= num_tokens <= n[-1]:
        raise InvalidArgumentError(f"num_tokens {num_tokens!r} is outside the measured {n[0]:g} .. {n[-1]:g}")
    return float(np.interp(math.log(num_tokens), np.log(n), by_n.to_numpy()))


def moe_layers(model_slug: str, shape: MoeShape) -> int:
    """A preset's MoE layers (`layer_structure.moe_layers`). Raises InvalidArgumentError when its routed-expert
    parameters are not that many layers of E x 3 h i (the shape is not the preset's)."""
    model = MODELS[model_slug]
    h, i, _, e = shape
    layers = structure_moe_layers(model)
    if layers < 1 or abs(model.expert_params / (e * 3 * h * i) - layers) > 1e-9:
        raise InvalidArgumentError(f"{model_slug}'s expert parameters are not {layers} layers of {shape}")
    return layers


def step_model_expert_seconds(
    step_model, num_tokens: float, layers: int, touched=None
) -> tuple[float, float]:
    """(memory_s, compute_s) that a `StepTimeModel` with routed experts charges one of its `layers` MoE layers for
    the experts at a step of num_tokens tokens: expert_weight_bytes x experts_touched(n) / (bandwidth x
    expert_bandwidth_efficiency) and expert_flops_per_token x n / (peak x expert_flops_efficiency), over layers
    (each efficiency the dense one when the model leaves it None). touched: the fraction of experts read, in
    place of the model's own experts_touched(n) (to price another routing)."""
    if not step_model.expert_weight_bytes:
        raise InvalidArgumentError("the step model has no routed experts")
    bandwidth = step_model.expert_bandwidth_efficiency or step_model.bandwidth_efficiency
    flops = step_model.expert_flops_efficiency or step_model.flops_efficiency
    fraction = step_model.experts_touched(float(num_tokens)) if touched is None else touched
    memory = step_model.expert_weight_bytes * fraction / (step_model.memory_bandwidth * bandwidth)
    compute = step_model.expert_flops_per_token * num_tokens / (step_model.peak_flops * flops)
    return memory / layers, compute / layers
