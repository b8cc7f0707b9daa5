"""Predicted against observed: the capacity planner's KV blocks for a model and GPU beside the `num_gpu_blocks` a
running vLLM reports, with the likely reasons when they disagree.

vLLM reports `num_gpu_blocks` per engine (one data-parallel rank = one model replica of tp x pp GPUs); the
planner's `num_blocks` is the same quantity (blocks of one replica, each spanning its tensor-parallel shards).
The plan is made with the server's own block size, KV cache dtype and gpu_memory_utilization when its
`vllm:cache_config_info` publishes them, so what remains of a difference is memory the plan cannot see.

A server with an explicit KV space (cache_config_info's kv_cache_memory_bytes: vLLM's CPU build, which sets it from
VLLM_CPU_KVCACHE_SPACE, or `--kv-cache-memory-bytes`) sizes its cache from those bytes alone, with no profiling:
`compare_kv_space_with_server` plans that (`core.planning.memory.cpu_kv`) for the served model's own config.json, so the
two agree block for block. A server started with --num-gpu-blocks-override keeps the override (cache_config_info's
num_gpu_blocks); the count it computed is in its start log ("Overriding num_gpu_blocks=N"), and the comparison
says so.
"""

import re
from dataclasses import dataclass, replace

from core.common import cdiv
from core.errors import InvalidArgumentError
from core.live.metrics import VllmMetrics
from core.planning.catalog.models import ModelSpec
from core.planning.memory.cpu_kv import CpuKVInputs, CpuKVPlan, plan_cpu_kv
from core.planning.memory.kv_accounting import KV_DTYPES
from core.planning.memory.plan import CapacityPlan, PlanInputs, plan_from

AGREE_WITHIN = 0.05  # relative difference under which the plan and the server agree
_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8_inc": "fp8"}


@dataclass(frozen=True)
class Comparison:
    """`planned_blocks` / `observed_blocks`: per replica; concurrency: requests of `context_len` tokens that fit
    (blocks // ceil(context_len / block_size)); `relative_difference` = observed / planned - 1 (None when
    either is unknown or the plan has no blocks); `explanations`: sentences, the verdict first (after a warning when the server's model_name is another model)."""

    plan: CapacityPlan | CpuKVPlan
    planned_blocks: int
    observed_blocks: int | None
    block_size: int
    context_len: int
    planned_concurrency: int
    observed_concurrency: int | None
    relative_difference: float | None
    settings_from_server: tuple[str, ...]
    explanations: tuple[str, ...]


def plan_for_server(inputs: PlanInputs, observed: VllmMetrics) -> tuple[PlanInputs, tuple[str, ...]]:
    """`inputs` with the server's block size, KV dtype and memory utilization where it publishes them; also
    the names of the settings taken from the server."""
    taken = []
    changes: dict[str, object] = {}
    if observed.block_size:
        changes["block_size"] = observed.block_size
        taken.append(f"block_size {observed.block_size}")
    dtype = _CACHE_DTYPES.get((observed.cache_setting("cache_dtype") or "").lower())
    if dtype in KV_DTYPES:
        changes["kv_dtype"] = dtype
        taken.append(f"kv cache dtype {observed.cache_setting('cache_dtype')}")
    try:
        gmu = float(observed.cache_setting("gpu_memory_utilization") or "nan")
    except ValueError:
        gmu = float("nan")
    if 0 < gmu <= 1:
        changes["gpu_memory_utilization"] = gmu
        taken.append(f"gpu_memory_utilization {gmu:g}")
    return replace(inputs, **changes), tuple(taken)


def compare_with_server(inputs: PlanInputs, observed: VllmMetrics, context_len: int) -> Comparison:
    """Plan `inputs` (adjusted by `plan_for_server`) and set it beside `observed` (one server: its engines'
    blocks are divided by the engine count to get one replica's). Raises InvalidArgumentError for a plan the
    planner refuses (its message says why)."""
    if context_len < 1:
        raise InvalidArgumentError(f"context_len must be at least 1 token, got {context_len}")
    adjusted, taken = plan_for_server(inputs, observed)
    capacity = plan_from(adjusted)
    engines = max(1, len(observed.engines))
    observed_blocks = observed.num_gpu_blocks // engines if observed.num_gpu_blocks is not None else None
    bs = capacity.block_size
    per_request = cdiv(context_len, bs)
    planned_conc = capacity.num_blocks // per_request
    observed_conc = observed_blocks // per_request if observed_blocks is not None else None
    diff = (
        observed_blocks / capacity.num_blocks - 1
        if observed_blocks is not None and capacity.num_blocks > 0
        else None
    )
    return Comparison(
        capacity,
        capacity.num_blocks,
        observed_blocks,
        bs,
        context_len,
        planned_conc,
        observed_conc,
        diff,
        taken,
        _model_note(capacity.model, observed.model_names)
        + _explain(capacity, observed_blocks, diff, engines),
    )


def kv_space_bytes(observed: VllmMetrics) -> int | None:
    """cache_config_info's kv_cache_memory_bytes (the server's explicit KV space), None when it sizes its cache by
    profiling (the label absent or "None")."""
    try:
        value = int(observed.cache_setting("kv_cache_memory_bytes") or "")
    except ValueError:
        return None
    return value if value > 0 else None


def _override(observed: VllmMetrics) -> int | None:
    try:
        return int(observed.cache_setting("num_gpu_blocks_override") or "")
    except ValueError:
        return None


def compare_kv_space_with_server(
    model: ModelSpec,
    observed: VllmMetrics,
    context_len: int,
    max_model_len: int | None = None,
    dtype: str = "auto",
) -> Comparison:
    """`model` (the served model's config) planned in the server's own KV space, block size and KV dtype (its
    cache_config_info) beside the blocks it reports. dtype: the server's `--dtype` (`cpu_kv.CPU_MODEL_DTYPES`;
    its /metrics do not say it; "auto": what vLLM picks, `cpu_model_dtype`), which an "auto" KV cache is stored
    in. Raises InvalidArgumentError when the server publishes no kv_cache_memory_bytes or block_size, or for a
    plan vLLM refuses."""
    if context_len < 1:
        raise InvalidArgumentError(f"context_len must be at least 1 token, got {context_len}")
    space = kv_space_bytes(observed)
    if space is None or not observed.block_size:
        raise InvalidArgumentError(
            "the server publishes no kv_cache_memory_bytes and block_size in vllm:cache_config_info: its KV "
            "space was sized by profiling, so plan it with a GPU preset"
        )
    cache_dtype = (observed.cache_setting("cache_dtype") or "auto").lower()
    inputs = CpuKVInputs(
        model,
        space,
        block_size=observed.block_size,
        kv_cache_dtype="auto" if cache_dtype == "auto" else cache_dtype,
        max_model_len=max_model_len,
        dtype=dtype,
    )
    capacity = plan_cpu_kv(inputs)
    taken = (
        f"kv_cache_memory_bytes {space:,}",
        f"block_size {observed.block_size}",
        f"kv cache dtype {cache_dtype}",
    )
    engines = max(1, len(observed.engines))
    observed_blocks = observed.num_gpu_blocks // engines if observed.num_gpu_blocks is not None else None
    per_request = cdiv(context_len, capacity.block_size)
    diff = (
        observed_blocks / capacity.num_blocks - 1
        if observed_blocks is not None and capacity.num_blocks
        else None
    )
    override = _override(observed)
    if override is not None:
        words = (
            f"The server keeps {override:,} blocks (--num-gpu-blocks-override {override}); the count it computed "
            f'from its {space / 1024**3:g} GiB KV space is in its start log ("Overriding num_gpu_blocks=N"), '
            f"which the plan's {capacity.num_blocks:,} is to be compared with.",
        )
    elif observed_blocks is None:
        words = ("The server does not publish num_gpu_blocks, so only the plan is shown.",)
    elif observed_blocks == capacity.num_blocks:
        words = (
            f"The plan and the server agree: {capacity.num_blocks:,} blocks of {capacity.block_size} tokens "
            f"in {space:,} bytes ({capacity.block_bytes:,} bytes per block over all layers).",
        )
    else:
        words = (
            f"The server holds {observed_blocks:,} blocks, {diff:+.1%} against the plan's {capacity.num_blocks:,} "
            f"in the same {space:,} bytes: the config.json or dtype planned is not the one it serves (a "
            "--dtype float32 server caches in float32: set the served dtype).",
        )
    return Comparison(
        capacity,
        capacity.num_blocks,
        observed_blocks,
        capacity.block_size,
        context_len,
        capacity.num_blocks // per_request,
        observed_blocks // per_request if observed_blocks is not None else None,
        diff,
        taken,
        _model_note(capacity.model, observed.model_names) + words,
    )


def _model_note(planned: str, served: tuple[str, ...]) -> tuple[str, ...]:
    """A sentence when the server's model_name label does not name the planned model (letters and digits
    compared, case ignored, either containing the other): then no figure below can agree except by chance."""
    key = re.sub(r"[^a-z0-9]", "", planned.lower())
    names = [re.sub(r"[^a-z0-9]", "", name.lower()) for name in served]
    if not names or any(key in name or (name and name in key) for name in names):
        return ()
    return (f"The server says it runs {', '.join(served)}, not {planned}: compare with the model it runs.",)


def _explain(
    capacity: CapacityPlan, observed: int | None, diff: float | None, engines: int
) -> tuple[str, ...]:
    gib = 1024**3
    block_gib = capacity.block_bytes / gib
    if observed is None:
        return (
            "The server does not publish vllm:cache_config_info's num_gpu_blocks, so only the plan is shown.",
        )
    if capacity.num_blocks == 0:
        return (
            f"The plan leaves no KV memory ({capacity.verdict}), yet the server holds {observed:,} blocks: "
            "the model, GPU or parallelism named here is not the one it runs.",
        )
    gap_gib = (observed - capacity.num_blocks) * block_gib
    per_replica = f" per replica ({engines} engines)" if engines > 1 else ""
    if abs(diff) <= AGREE_WITHIN:
        return (
            f"The plan and the server agree within {AGREE_WITHIN:.0%}: {capacity.num_blocks:,} planned, "
            f"{observed:,} observed{per_replica} ({diff:+.1%}, {gap_gib:+.2f} GiB of KV memory).",
        )
    head = (
        f"The server holds {observed:,} blocks{per_replica}, {diff:+.1%} against the plan's "
        f"{capacity.num_blocks:,}: {abs(gap_gib):.2f} GiB of KV memory {'more' if gap_gib > 0 else 'less'} "
        f"than planned (one block is {capacity.block_bytes / 1024**2:,.2f} MiB)."
    )
    activation = capacity.activation_bytes / gib
    if diff > 0:
        reasons = (
            f"vLLM profiled a smaller activation peak than the plan's estimate of {activation:.2f} GiB per GPU "
            "(a lower --max-num-batched-tokens, or CUDA graphs captured for fewer sizes).",
            "The GPU has more memory than the preset (e.g. a 94 GB H100 NVL rather than the 80 GB SXM), or the "
            "model's weights are smaller than planned (a quantized checkpoint: set the weight dtype).",
            "The server runs more GPUs per replica (tensor or pipeline parallel) than entered here.",
        )
    else:
        reasons = (
            "Other processes hold GPU memory: vLLM's gpu_memory_utilization is a fraction of the whole GPU, so "
            "what others use comes out of the KV cache.",
            f"vLLM's profiled activation peak, CUDA graphs and NCCL buffers took more than the plan's "
            f"{activation:.2f} GiB per GPU.",
            "The GPU has less memory than the preset (a MIG slice, a 40 GB card), or the server runs fewer "
            "GPUs per replica than entered here.",
        )
    return (head, *reasons)
