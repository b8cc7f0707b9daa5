"""What the Planner page computes: one scenario's model, GPU, plan, workload what-if and their presentation data.

This module is the page's one entry point. By concept, it draws on:
- `planner_config`: a custom model's config.json (parsing, the fields kept, the URL-safe encoding);
- `planner_scenario`: one scenario's inputs, workload and plan (`compute_scenario`, `smallest_deployment`);
- `planner_formulas`: the plan's arithmetic written out with its numbers;
and holds what the page shows beside the plans: comparison GPUs, the context sweep, the what-if sentence, the
download document and the preset tables. Every function raises `InvalidArgumentError` (a `LabError`) with the
reason for bad input; none imports streamlit.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from core.errors import LabError
from core.page_models.planner_config import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_CHARS,
    compact_config,
    config_from_bytes,
    config_from_text,
    decode_config,
    encode_config,
    model_from_config,
)
from core.page_models.planner_formulas import formula_lines, hybrid_comparison, kv_group_rows
from core.page_models.planner_scenario import (
    CUSTOM,
    DEPLOYMENT_TP,
    SCENARIO_KEYS,
    WORKLOAD_KEYS,
    WORKLOADS,
    GiB,
    ScenarioResult,
    build_gpu,
    build_model,
    clamp_context,
    compute_scenario,
    make_workload,
    plan_inputs,
    smallest_deployment,
    workload_max_len,
)
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.kv_accounting import kv_bytes_per_token
from core.planning.memory.plan import concurrency_vs_context, plan_from
from core.planning.memory.what_if import WorkloadWhatIf

__all__ = [
    "CUSTOM",
    "DEPLOYMENT_TP",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_CHARS",
    "SCENARIO_KEYS",
    "WORKLOADS",
    "WORKLOAD_KEYS",
    "ContextSweep",
    "GiB",
    "ScenarioResult",
    "build_gpu",
    "build_model",
    "clamp_context",
    "compact_config",
    "comparison_gpus",
    "compute_scenario",
    "config_from_bytes",
    "config_from_text",
    "context_sweep",
    "decode_config",
    "encode_config",
    "formula_lines",
    "gpu_preset_rows",
    "hybrid_comparison",
    "kv_group_rows",
    "make_workload",
    "model_from_config",
    "model_preset_rows",
    "plan_document",
    "plan_inputs",
    "smallest_deployment",
    "what_if_summary",
    "workload_max_len",
]


def comparison_gpus(chosen: str, count: int = 2) -> list[str]:
    """Two other presets to compare with: the nearest smaller and larger in memory (then bandwidth)."""
    ordered = sorted(GPUS, key=lambda s: (GPUS[s].memory_bytes, GPUS[s].memory_bandwidth))
    if chosen not in GPUS:
        return ["a100-80gb", "h200-141gb"][:count]
    i = ordered.index(chosen)
    below = list(reversed(ordered[:i]))
    above = ordered[i + 1 :]
    picks = ([below[0]] if below else []) + ([above[0]] if above else [])
    rest = [s for s in below[1:] + above[1:] if s not in picks]
    return (picks + rest)[:count]


@dataclass(frozen=True)
class ContextSweep:
    """Max concurrency (requests held at once, all replicas) at each context length (tokens), one series per
    deployment of `model_name`: the scenarios that run it, then the same plan on comparison GPUs."""

    model_name: str
    contexts: list[int]
    series: dict[str, list[int]]
    max_model_len: int


def context_sweep(results: Mapping[str, ScenarioResult], gpu_slug: str) -> ContextSweep:
    """The sweep for the first scenario's model. `results` are keyed by a short scenario label ("A", "B");
    `gpu_slug` is the first scenario's GPU choice (the comparison GPUs are its neighbours in memory). The
    comparison plans are the first plan's inputs with the GPU replaced; GPUs it does not fit on are left out.
    Contexts: powers of two from 512 up to min(max_position_embeddings, 2^20), plus max_model_len."""
    first = next(iter(results.values()))
    top = min(first.model.max_position_embeddings, 1 << 20)
    contexts = sorted({*(1 << k for k in range(9, 21) if (1 << k) <= top), first.plan.max_model_len})
    series = {}
    for label, result in results.items():
        if result.model.name == first.model.name:
            name = f"{label}: {result.plan.num_gpus}× {result.gpu.name}, tp {result.plan.tensor_parallel}"
            series[name] = concurrency_vs_context(result.plan, contexts)
    for slug in comparison_gpus(gpu_slug):
        try:
            other = plan_from(replace(first.plan.inputs, gpu=GPUS[slug]))
        except LabError:
            continue
        name = f"{other.num_gpus}× {GPUS[slug].name}, tp {other.tensor_parallel}"
        series[name] = concurrency_vs_context(other, contexts)
    return ContextSweep(first.model.name, contexts, series, first.plan.max_model_len)


def what_if_summary(name: str, w: WorkloadWhatIf) -> str:
    """One markdown sentence: tokens and blocks a request holds, paged vs contiguous requests held."""
    ratio = w.paged_memory_concurrency / max(w.contiguous_memory_concurrency, 1)
    return (
        f"**{name}**: a request holds {w.mean_tokens_held:,.0f} tokens on average over its decode steps "
        f"({w.mean_blocks_held:,.1f} blocks); paging holds {w.paged_memory_concurrency:,.0f} such requests "
        f"where reserving {w.reservation_tokens:,} tokens each holds {w.contiguous_memory_concurrency:,} "
        f"({ratio:,.1f}×). Limited by {w.limited_by} at {w.paged_concurrency:,.0f}."
    )


def plan_document(values: Mapping[str, Any], results: Mapping[str, ScenarioResult]) -> dict[str, Any]:
    """The JSON the page offers for download: inputs, model and GPU specs, the plans and the what-ifs."""
    doc: dict[str, Any] = {"units": "bytes (GiB = 1,073,741,824 B), tokens, blocks, seconds", "scenarios": {}}
    for name, result in results.items():
        doc["scenarios"][name] = {
            "model": result.model.to_dict(),
            "gpu": result.gpu.to_dict(),
            "plan": result.plan.to_dict(),
            "workload_what_if": result.what_if.to_dict() if result.what_if else None,
            "fragmentation_by_block_size": result.fragmentation,
        }
    doc["inputs"] = dict(values.items())
    return doc


def model_preset_rows() -> list[dict[str, Any]]:
    """One row per model preset: architecture, parameters (billions) and KV bytes per token (auto dtype, tp 1)."""
    return [
        {
            "slug": slug,
            "model": m.name,
            "layers": m.num_layers,
            "heads": m.num_attention_heads,
            "attention": "MLA" if m.is_mla else ("MHA" if m.num_kv_heads == m.num_attention_heads else "GQA"),
            "layer types": ", ".join(
                f"{m.layer_kinds.count(kind)} {kind}" for kind in dict.fromkeys(m.layer_kinds)
            ),
            "KV heads (MLA: 1 latent)": m.num_kv_heads,
            "head_dim": m.head_dim,
            "max positions": m.max_position_embeddings,
            "params (B)": m.num_params / 1e9,
            "active (B)": m.num_params_active / 1e9,
            "KV B/token (auto dtype, tp 1)": kv_bytes_per_token(m),
            "dtype": m.compute_dtype,
        }
        for slug, m in MODELS.items()
    ]


def gpu_preset_rows() -> list[dict[str, Any]]:
    """One row per GPU preset: memory (GiB and GB), bandwidth (GB/s), dense bf16 TFLOP/s, memory type, source."""
    return [
        {
            "slug": slug,
            "GPU": g.name,
            "memory (MiB, driver total)": g.memory_bytes // 2**20,
            "memory (GiB)": g.memory_gib,
            "memory (GB, 1e9 B)": g.memory_gb,
            "bandwidth (GB/s)": g.memory_bandwidth / 1e9,
            "bf16 dense TFLOP/s": (g.peak_bf16_flops or 0) / 1e12,
            "type": g.memory_type,
            "source": g.source,
        }
        for slug, g in GPUS.items()
    ]
