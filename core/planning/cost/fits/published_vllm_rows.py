"""The measured vLLM serving figures that `core.planning.cost.fits.published_vllm` predicts and fits to, each with the
deployment it stands for (vLLM's defaults where the row says nothing) and its set.

The figures (`ROWS`): ai-dynamo/aiconfigurator's silicon_sample.csv, its vLLM rows on H100 SXM and H200 SXM:
mean TTFT and mean TPOT of a closed loop of C clients at fixed lengths ISL / OSL. From
core/planning/cost/fits/data/vllm_silicon_llama31_70b.csv, Llama-3.1-70B with FP8 weights (TP 2, 4, 8 on H100; 1, 2, 4, 8
on H200; C = 4 ... 64; 1,024 / 1,024, 1,024 / 8,192, 8,192 / 1,024); from
core/planning/cost/fits/data/vllm_silicon_models.csv (issue 40), Qwen3-32B bf16 (H100), Llama-3.1-8B-Instruct FP8 (H200),
gpt-oss-120b MXFP4 (H100, H200), Qwen3-235B-A22B FP8 (H200; its 19 rows served with data-parallel attention
are kept apart in ATTENTION_DP_ROWS, neither fitted nor in any RMS above; `published_vllm.attention_dp_comparison` prices
them as DP ranks (`rank_rows`), docs/slo.md 2d) and MiniMax-M2.5 FP8 (H100, H200; its 15 H100 rows the file lists
with attention DP 4 are kept apart in MINIMAX_ATTENTION_DP_ROWS, not priced: their ids say TP 4 EP 4, their TP 4 x
DP 4 x MoE EP 16 would be 16 GPUs, and their latencies equal the TP 4 EP 4 rows' at the same silicon_concurrency
within a few percent, so which deployment they measured is unclear) and Kimi-K2.5 int4 (H200, TP 8: int4 routed experts,
MLA attention; no attention-DP row).

A held-out GPU (`HELD_OUT_GPU_ROWS`, from core/planning/cost/fits/data/vllm_silicon_b200.csv): the same sample's vLLM
rows on B200 SXM of Llama-3.1-70B FP8, gpt-oss-120b MXFP4, MiniMax-M2.5 FP8 and Kimi-K2.5 int4, a GPU none of the
rows above is on. No fit sees them, the training models' included: they check the profile on a GPU it was not
fitted on (`published_vllm.held_out_gpu_comparison`), apart from the split below.

Split (issue 40): whole models. TRAINING_MODELS (Llama-3.1-70B, Qwen3-32B, gpt-oss-120b) are fitted; every row of
HELD_OUT_MODELS (Llama-3.1-8B, a small dense model; Qwen3-235B-A22B and MiniMax-M2.5, MoE models with FP8 experts;
Kimi-K2.5, a MoE model with int4 experts and MLA attention, formats no training model has) is held out. (`published_vllm` fits the training rows.) FOURTH_STAGE_TRAINING_MODELS adds MiniMax-M2.5 to the
training models: the fourth stage of docs/slo.md 2c, tried and not adopted (`bench.slo_published --train-minimax`
reruns it); `row_set` and `training_rows` take the training models.

KV-limited rows (`kv_limited`: C x (ISL + OSL / 2), the KV tokens the clients hold on average, exceeds the
planner's KV tokens, or C exceeds MAX_NUM_SEQS: gpt-oss-120b's 512-client rows) are reported but neither fitted nor counted in either RMS: there requests wait for KV
blocks (or are preempted) and the measured TTFT is a queueing time that depends on the benchmark's length and
on vLLM's preemption order, not on the step time the fit is about. docs/slo.md lists them with their errors.

A row's deployment: the row's weight dtype, KV cache in the model's dtype (KV_DTYPE auto), BLOCK_SIZE 16,
MAX_NUM_BATCHED_TOKENS 8,192, MAX_NUM_SEQS 256, GPU_MEMORY_UTILIZATION 0.9, max_model_len ISL + OSL; its KV capacity
(`kv_tokens`) from the exact planner (`core.planning.memory.plan.plan`).
"""

import csv
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.expert_rows import moe_tensor_parallel, release_expert_block_rows
from core.planning.memory.plan import plan

DATA_PATH = Path(__file__).parent / "data" / "vllm_silicon_llama31_70b.csv"
MODELS_DATA_PATH = Path(__file__).parent / "data" / "vllm_silicon_models.csv"
B200_DATA_PATH = Path(__file__).parent / "data" / "vllm_silicon_b200.csv"
VLLM_SOURCE = (
    "ai-dynamo/aiconfigurator, aic-core/src/aiconfigurator_core/systems/silicon_sample.csv at commit "
    "095f58a51c4ca8e61b66ec108d86f223f8d559ce (Apache-2.0): vLLM rows, H100 / H200 SXM, of Llama-3.1-70B FP8, "
    "Qwen3-32B bf16, Llama-3.1-8B-Instruct FP8, gpt-oss-120b MXFP4, Qwen3-235B-A22B FP8, MiniMax-M2.5 FP8 and "
    "Kimi-K2.5 int4; and, on B200 SXM (a held-out GPU), of Llama-3.1-70B FP8, gpt-oss-120b MXFP4, MiniMax-M2.5 FP8 "
    "and Kimi-K2.5 int4"
)
WEIGHT_DTYPE = "fp8"
KV_DTYPE = "auto"  # vLLM's default kv_cache_dtype: the model's dtype (bf16)
BLOCK_SIZE = 16
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 256
GPU_MEMORY_UTILIZATION = 0.9
TRAINING_MODELS = ("llama-3.1-70b", "qwen3-32b", "gpt-oss-120b")  # two dense, one MoE; H100 and H200
# a small dense model and three MoE ones (FP8 experts; MiniMax-M2.5 on H100 and H200; Kimi-K2.5's int4 experts and
# MLA attention, on H200)
HELD_OUT_MODELS = ("llama-3.1-8b", "qwen3-235b-a22b", "minimax-m2.5", "kimi-k2.5")
# The fourth stage (docs/slo.md 2c: tried, not adopted): MiniMax-M2.5, an FP8 MoE model, in training too.
FOURTH_STAGE_TRAINING_MODELS = (*TRAINING_MODELS, "minimax-m2.5")
MOE_MODELS = ("gpt-oss-120b", "qwen3-235b-a22b", "minimax-m2.5", "kimi-k2.5")
# The checkpoint a model's FP8 rows served where it is not the model's preset: Qwen/Qwen3-235B-A22B-FP8 (128 x 128
# block-scaled FP8), whose experts vLLM 0.12 runs with DeepGEMM (`expert_block_rows`). The rows are priced with the
# 16-bit preset at weight dtype fp8 (the same bytes and FLOPs); MiniMax-M2.5's preset is its FP8 checkpoint.
FP8_CHECKPOINTS = {"qwen3-235b-a22b": "qwen3-235b-a22b-fp8"}


@dataclass(frozen=True)
class VllmRow:
    """One measured run: preset slugs, tp, lengths (tokens), clients, mean TTFT and TPOT (seconds)."""

    id: str
    model: str
    gpu: str
    tp: int
    isl: int
    osl: int
    concurrency: int
    ttft_s: float
    tpot_s: float
    weight_dtype: str = WEIGHT_DTYPE
    dp: int = 1
    ep: int = 1
    backend_version: str = ""  # the vLLM version the file gives ("": none)

    @property
    def label(self) -> str:
        weights = "MXFP4" if self.weight_dtype == "auto" else self.weight_dtype.upper()
        ep = f" EP{self.ep}" if self.ep > 1 else ""
        return (
            f"{MODELS[self.model].name} {weights}, {GPUS[self.gpu].name} TP{self.tp}{ep}, ISL {self.isl} / "
            f"OSL {self.osl}, {self.concurrency} clients"
        )


def _read_rows(path: Path) -> tuple[VllmRow, ...]:
    with path.open(newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        ints = (int(r[k]) for k in ("tp", "isl", "osl", "concurrency"))
        seconds = (float(r[k]) / 1e3 for k in ("ttft_ms", "tpot_ms"))
        more = (
            {"weight_dtype": r["weight_dtype"], "dp": int(r["dp"]), "ep": int(r["ep"])} if "dp" in r else {}
        )
        if "backend_version" in r:
            more["backend_version"] = r["backend_version"]
        rows.append(VllmRow(r["id"], r["model"], r["gpu"], *ints, *seconds, **more))
    return tuple(rows)


_ALL_ROWS = _read_rows(DATA_PATH) + _read_rows(MODELS_DATA_PATH)
# Rows served with data-parallel attention (Qwen3-235B-A22B at attention TP 1 / 2 with MoE TP 2 / 4): another
# deployment than one TP group; kept apart, neither fitted nor scored with the others (`attention_dp_comparison`).
ATTENTION_DP_ROWS = tuple(r for r in _ALL_ROWS if r.dp > 1 and r.model != "minimax-m2.5")
# MiniMax-M2.5's H100 rows listed with attention DP 4 (module docstring: which deployment they measured is
# unclear): kept, never priced.
MINIMAX_ATTENTION_DP_ROWS = tuple(r for r in _ALL_ROWS if r.dp > 1 and r.model == "minimax-m2.5")
ROWS = tuple(r for r in _ALL_ROWS if r.dp == 1)
# A GPU no fit sees (HELD_OUT_GPU, module docstring): every model's rows on it are checked, none fitted, whatever the
# model's set; its attention-DP rows (MiniMax-M2.5, DP 2 or 4) kept apart like the others, not priced.
HELD_OUT_GPU = "b200"
_HELD_OUT_GPU_ALL = _read_rows(B200_DATA_PATH)
HELD_OUT_GPU_ROWS = tuple(r for r in _HELD_OUT_GPU_ALL if r.dp == 1)
HELD_OUT_GPU_ATTENTION_DP_ROWS = tuple(r for r in _HELD_OUT_GPU_ALL if r.dp > 1)


@cache
def kv_tokens(row: VllmRow) -> int:
    """KV slots of the row's replica (of one DP rank for an attention-DP row) by the exact planner (vLLM's memory
    rules and defaults)."""
    capacity = plan(
        MODELS[row.model],
        GPUS[row.gpu],
        tensor_parallel=row.tp,
        weight_dtype=row.weight_dtype,
        kv_dtype=KV_DTYPE,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        block_size=BLOCK_SIZE,
        max_model_len=row.isl + row.osl,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        data_parallel=row.dp,
        num_gpus=row.tp * row.dp,
    )
    return int(capacity.kv_tokens)


def kv_limited(row: VllmRow) -> bool:
    """Whether the clients' average KV footprint, C x (ISL + OSL / 2) tokens, exceeds the cache, or there are more
    clients than MAX_NUM_SEQS (requests then queue for a slot; module docstring)."""
    return row.concurrency > MAX_NUM_SEQS or row.concurrency * (row.isl + row.osl / 2) > kv_tokens(row)


def expert_block_rows(row: VllmRow) -> int:
    """The `StepTimeModel.expert_block_rows` of the kernel the row's vLLM ran its routed experts with
    (`core.planning.cost.expert_rows.vllm_expert_block_rows`: 128 for vLLM 0.12's padded DeepGEMM kernel, which
    the Qwen3-235B-A22B rows ran, else 0). MoE TP: 1 with EP; without it tp x dp (vLLM 0.12's
    `FusedMoEParallelConfig.make` flattens the DP ranks into the MoE TP group, and an attention-DP row's MoE layers
    gather every rank's tokens into the same fused-experts call, `FusedMoE.forward_impl`'s naive dispatch)."""
    checkpoint = FP8_CHECKPOINTS.get(row.model, row.model) if row.weight_dtype == "fp8" else row.model
    moe_tp = moe_tensor_parallel(row.tp, row.dp, row.ep > 1)
    return release_expert_block_rows(
        row.backend_version, MODELS[checkpoint], row.weight_dtype, row.gpu, moe_tp
    )


def row_set(row: VllmRow, training_models: tuple[str, ...] = TRAINING_MODELS) -> str:
    """The row's set: "kv-limited", "training" (its model one of `training_models`) or "held out"."""
    return "kv-limited" if kv_limited(row) else "training" if row.model in training_models else "held out"


def training_rows(training_models: tuple[str, ...] = TRAINING_MODELS) -> list[VllmRow]:
    return [r for r in ROWS if row_set(r, training_models) == "training"]


def rank_rows(row: VllmRow) -> list[tuple[VllmRow, int]]:
    """An attention-DP row as its DP ranks: (the row with one rank's clients, how many clients such ranks hold
    in all). C clients over D ranks: C mod D ranks hold ceil(C / D), the others floor(C / D) (vLLM's DP
    coordinator balances the ranks' queues); a rank without a client is left out."""
    low, extra = divmod(row.concurrency, row.dp)
    shares = [(low + 1, extra), (low, row.dp - extra)]
    return [(replace(row, concurrency=c), c * n) for c, n in shares if c and n]
