"""The Planner's arithmetic written out with a scenario's own numbers: the formula lines (one group, or vLLM V1's
KV cache groups for a hybrid model), the table of KV cache groups and the hybrid-manager comparison."""

from typing import Any

from core.kv.layout import request_blocks
from core.page_models.planner_scenario import GiB, ScenarioResult
from core.planning.catalog.models import ModelSpec
from core.planning.catalog.weights import bits_per_quantized_param, quantized_params, uses_group_quantization
from core.planning.memory.kv_accounting import (
    DTYPE_BITS,
    blocks_for_tokens,
    kv_heads_per_gpu,
    layers_per_gpu,
    resolve_weight_dtype,
    weight_split_per_gpu,
)
from core.planning.memory.plan import CapacityPlan


def formula_lines(result: ScenarioResult) -> list[str]:
    """The plan's arithmetic written out with its own numbers (markdown lines)."""
    m, p = result.model, result.plan
    kv_bytes = DTYPE_BITS[p.kv_dtype] / 8
    layers = layers_per_gpu(m, p.pipeline_parallel)
    if m.is_mla:
        per_token = (
            f"{layers:,} layers/GPU × ({m.kv_lora_rank} + {m.qk_rope_head_dim}) latent × {kv_bytes:g} B "
            f"= **{p.kv_bytes_per_token:,} B** (MLA: one latent, no ×2, same on every TP rank)"
        )
    else:
        heads = kv_heads_per_gpu(m, p.tensor_parallel)
        per_token = (
            f"2 (K,V) × {layers:,} layers/GPU [ceil({m.num_layers}/{p.pipeline_parallel})] × {heads} KV heads/GPU "
            f"[max(1, {m.num_kv_heads}//{p.tensor_parallel})] × {m.head_dim} head_dim × {kv_bytes:g} B ({p.kv_dtype}) "
            f"= **{p.kv_bytes_per_token:,} B**"
        )
    context_blocks = blocks_for_tokens(p.context_len, p.block_size)
    layout = p.kv_layout
    if len(layout.groups) > 1 or layout.groups[0].kind not in ("full", "mla"):
        return [
            f"KV bytes per token per GPU, every layer as full attention = {per_token}",
            *_group_lines(result),
        ]
    return [
        f"KV bytes per token per GPU = {per_token}",
        f"Block bytes = {p.block_size} tokens × {p.kv_bytes_per_token:,} B = **{p.block_bytes:,} B**",
        f"KV budget per GPU = {p.gpu_memory_bytes / GiB:,.2f} GiB × {p.gpu_memory_utilization:g} − "
        f"{p.weights_bytes / GiB:,.2f} GiB weights − {p.activation_bytes / GiB:,.2f} GiB activations"
        f"{' (estimate)' if p.activation_estimated else ''} = **{p.kv_budget_bytes / GiB:,.2f} GiB**",
        f"KV blocks = floor({max(p.kv_budget_bytes, 0):,} B / {p.block_bytes:,} B) = **{p.num_blocks:,}**; "
        f"KV tokens = {p.num_blocks:,} × {p.block_size} = **{p.kv_tokens:,}**",
        f"Max concurrent requests of {p.context_len:,} tokens = {p.num_blocks:,} // ceil({p.context_len:,}/"
        f"{p.block_size}) = {p.num_blocks:,} // {context_blocks:,} = **{p.max_concurrency:,}**"
        + _over_ranks(p),
        _moe_weights_line(m, p)
        if _moe_parallel(p)
        else f"Weights per GPU = {m.num_params / 1e9:,.2f}B params"
        + (" (estimated from the config's shapes)" if m.params_estimated else "")
        + f" × {DTYPE_BITS[p.weight_dtype] / 8:g} B "
        f"({p.weight_dtype}) / {p.tensor_parallel} TP"
        + (f" (largest of {p.pipeline_parallel} PP stages)" if p.pipeline_parallel > 1 else "")
        + f" = **{p.weights_bytes / GiB:,.2f} GiB**",
    ]


def _layer_list(layers: tuple[int, ...]) -> str:
    """Layer indices compactly: "0, 2, 4, …, 40" for a long stride."""
    if len(layers) <= 6:
        return ", ".join(map(str, layers))
    return f"{layers[0]}, {layers[1]}, {layers[2]}, …, {layers[-1]}"


def kv_group_rows(capacity: CapacityPlan) -> list[dict[str, Any]]:
    """One row per KV cache group of the plan: kind, layers, window, block size and worst-case blocks."""
    layout = capacity.kv_layout
    return [
        {
            "group": i,
            "kind": g.kind,
            "layers": f"{len(g.layers)}: {_layer_list(g.layers)}",
            "window / chunk (tokens)": g.window,
            "block size (tokens)": g.block_size,
            f"blocks per {layout.max_model_len:,}-token request": blocks,
        }
        for i, (g, blocks) in enumerate(zip(layout.groups, layout.group_blocks, strict=True))
    ]


def hybrid_comparison(result: ScenarioResult) -> str | None:
    """A sentence comparing the plan with the hybrid KV cache manager on and off (None for a model with one
    layer type)."""
    if not result.model.is_hybrid:
        return None
    p = result.plan
    if result.other_hybrid is None:
        return f"Hybrid KV cache manager off: {result.other_hybrid_error}"
    on, off = (p, result.other_hybrid) if p.hybrid_kv_cache_manager else (result.other_hybrid, p)
    ratio = (
        f" ({on.vllm_max_concurrency / off.vllm_max_concurrency:,.2f}×)" if off.vllm_max_concurrency else ""
    )
    return (
        f"Hybrid KV cache manager on: {on.kv_layout.blocks_per_request:,} blocks of {on.block_bytes:,} B per "
        f"{p.max_model_len:,}-token request, {on.vllm_max_concurrency:,.2f}x concurrency; off "
        f"(--disable-hybrid-kv-cache-manager): {off.kv_layout.blocks_per_request:,} blocks of {off.block_bytes:,} B, "
        f"{off.vllm_max_concurrency:,.2f}x{ratio}."
    )


def _group_worst_case(group: Any, length: int, in_flight: int) -> str:
    """The worst-case formula of one group, written out (vLLM's max_memory_usage_bytes / page)."""
    b = group.block_size
    if group.kind == "sliding_window":
        return f"cdiv(min({group.window:,} − 1 + {in_flight:,}, {length:,}), {b}) + 1"
    if group.kind == "chunked_local":
        return f"cdiv(min({group.window:,} + {in_flight:,}, {length:,}), {b})"
    if group.kind == "mamba":
        return "1 (the whole state)"
    return f"cdiv({length:,}, {b})"


def _group_lines(result: ScenarioResult) -> list[str]:
    """The formula for a hybrid model's KV cache groups (vLLM V1's layout), with the plan's numbers."""
    m, p = result.model, result.plan
    layout = p.kv_layout
    gib = GiB
    kinds = ", ".join(
        f"{len(g.layers)} {g.kind}" + (f" (W {g.window:,})" if g.window else "") for g in layout.groups
    )
    T = layout.max_num_batched_tokens
    worst = " + ".join(
        f"{blocks:,} [{g.kind}: {_group_worst_case(g, p.max_model_len, T)}]"
        for g, blocks in zip(layout.groups, layout.group_blocks, strict=True)
    )
    context_blocks = request_blocks(layout, p.context_len)
    lines = [
        f"KV cache groups ({'hybrid manager on' if p.hybrid_kv_cache_manager else 'hybrid manager off'}): "
        f"{kinds}; group size {layout.group_size} layers per GPU"
        + (f" ({layout.padding_layers} padding layers)" if layout.padding_layers else ""),
        f"Page per layer per block = **{layout.page_bytes:,} B** ({layout.block_size} tokens"
        + (
            ", raised so a page holds one Mamba state"
            if any(g.kind == "mamba" for g in layout.groups)
            else ""
        )
        + f"); block bytes = {layout.group_size} layers × {layout.page_bytes:,} B = **{p.block_bytes:,} B** "
        "(one block id spans every group)",
        f"KV budget per GPU = {p.gpu_memory_bytes / gib:,.2f} GiB × {p.gpu_memory_utilization:g} − "
        f"{p.weights_bytes / gib:,.2f} GiB weights − {p.activation_bytes / gib:,.2f} GiB activations"
        f"{' (estimate)' if p.activation_estimated else ''} = **{p.kv_budget_bytes / gib:,.2f} GiB**",
        f"KV blocks = floor({max(p.kv_budget_bytes, 0):,} B / {layout.page_bytes:,} B / {layout.group_size}) = "
        f"**{p.num_blocks:,}**",
        f"Blocks per {p.max_model_len:,}-token request, worst case (T = {T:,} tokens per step; async scheduling "
        f"doubles the tokens in flight) = {worst} = **{layout.blocks_per_request:,}** "
        f"({layout.request_bytes / gib:,.2f} GiB); vLLM's max concurrency = {p.num_blocks:,} / "
        f"{layout.blocks_per_request:,} = **{layout.max_concurrency:,.2f}x**; KV tokens = int(that × "
        f"{p.max_model_len:,}) = **{p.kv_tokens:,}**",
        f"Max concurrent requests of {p.context_len:,} tokens = {p.num_blocks:,} // {context_blocks:,} = "
        f"**{p.max_concurrency:,}**" + _over_ranks(p),
        _weights_line(m, p),
    ]
    return lines


def _moe_parallel(p: CapacityPlan) -> bool:
    return p.data_parallel > 1 or p.expert_parallel


def _over_ranks(p: CapacityPlan) -> str:
    """ " per replica" (or " per DP rank") and, with more than one, the total over the ranks and replicas."""
    if p.data_parallel > 1:
        replicas = f" × {p.replicas} replicas" if p.replicas > 1 else ""
        return (
            f" per DP rank (each its own KV cache) × {p.data_parallel} DP ranks{replicas} = "
            f"**{p.max_concurrency_total:,}**"
        )
    return " per replica" + (
        f" × {p.replicas} replicas = **{p.max_concurrency_total:,}**" if p.replicas > 1 else ""
    )


def _moe_weights_line(m: ModelSpec, p: CapacityPlan) -> str:
    """Weights per GPU of a MoE model's DP ranks / EP (`weight_split_per_gpu`): the non-expert part over tp, the
    routed experts over every GPU of the server."""
    tp, dp = p.tensor_parallel, p.data_parallel
    dense, experts = weight_split_per_gpu(m, p.weight_dtype, tp, p.pipeline_parallel, dp, p.expert_parallel)
    if not m.is_moe:
        return f"Weights per GPU = the model / {tp} TP on each of {dp} DP ranks = **{p.weights_bytes / GiB:,.2f} GiB**"
    share = (
        f"{-(-m.num_experts // (tp * dp))} of {m.num_experts} whole experts (expert parallel over {tp * dp} GPUs)"
        if p.expert_parallel
        else f"1/{tp * dp} of every expert (split over tp {tp} × DP {dp} GPUs)"
    )
    return (
        f"Weights per GPU = {dense / GiB:,.2f} GiB attention, embeddings and dense layers (/ {tp} TP, on every DP "
        f"rank) + {experts / GiB:,.2f} GiB routed experts ({share}) = **{p.weights_bytes / GiB:,.2f} GiB**"
    )


def _weights_line(m: ModelSpec, p: CapacityPlan) -> str:
    if _moe_parallel(p):
        return _moe_weights_line(m, p)
    if m.checkpoint_bytes is not None and p.weight_dtype == resolve_weight_dtype(m, "auto"):
        source = f"the checkpoint's {m.checkpoint_bytes:,} B (safetensors index, exact)"
    elif uses_group_quantization(m) and p.weight_dtype == resolve_weight_dtype(m, "auto"):
        source = (
            f"estimate from quantization_config: {quantized_params(m) / 1e9:,.2f}B packed params × "
            f"{bits_per_quantized_param(m):g} bits ({m.quantization}, scales included) + the rest in 16-bit"
        )
    else:
        source = (
            f"{m.num_params / 1e9:,.2f}B params × {DTYPE_BITS[p.weight_dtype] / 8:g} B ({p.weight_dtype})"
        )
    return (
        f"Weights per GPU = {source} / {p.tensor_parallel} TP"
        + (f" (largest of {p.pipeline_parallel} PP stages)" if p.pipeline_parallel > 1 else "")
        + f" = **{p.weights_bytes / GiB:,.2f} GiB**"
    )
