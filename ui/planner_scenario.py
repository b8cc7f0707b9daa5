"""The Planner page's inputs as URL fields, and the pure functions that turn them into plans.

Two scenarios share one schema under the prefixes "a_" and "b_"; the workload fields are shared so that both
scenarios serve the same requests. Everything here is testable without streamlit.
"""

import json
from dataclasses import dataclass, replace
from typing import Any

from core.errors import InvalidArgumentError
from core.planning.hardware import GPUS, GPUSpec, get_gpu
from core.planning.kv_layout import request_blocks
from core.planning.models import MODELS, ModelSpec, get_model
from core.planning.planner import (
    BLOCK_SIZES,
    DTYPE_BITS,
    KV_DTYPES,
    WEIGHT_DTYPES,
    CapacityPlan,
    WorkloadWhatIf,
    blocks_for_tokens,
    fragmentation_by_block_size,
    kv_heads_per_gpu,
    layers_per_gpu,
    plan,
    resolve_weight_dtype,
    workload_what_if,
)
from core.planning.weights import bits_per_quantized_param, quantized_params, uses_group_quantization
from core.serving.workload import alpaca, fixed, sharegpt, uniform
from ui.query_state import Field, decode_blob, encode_blob, encode_params

CUSTOM = "custom"
WORKLOADS = ("sharegpt", "alpaca", "fixed", "uniform")
GiB = 1024**3
MAX_CONTEXT = 16_777_216

SCENARIO_DEFAULTS = {
    "a_": {"model": "llama-3.1-70b", "gpu": "h100-80gb", "gpus": 4, "tp": 4, "kvdtype": "fp8", "ctx": 4096},
    "b_": {"model": "llama-3.1-70b", "gpu": "h200-141gb", "gpus": 2, "tp": 2, "kvdtype": "fp8", "ctx": 4096},
}


def scenario_fields(prefix: str) -> list[Field]:
    """The URL fields of one scenario; keys are `prefix` + name (e.g. "a_model")."""
    d = {"wdtype": "auto", "pp": 1, "util": 0.9, "block": 16, "seqs": 256, **SCENARIO_DEFAULTS[prefix]}
    p = prefix
    return [
        Field(f"{p}model", d["model"], "choice", (*MODELS, CUSTOM), label="model"),
        Field(f"{p}config", "", "str", max_length=8000, label="custom config.json (encoded)"),
        Field(f"{p}gpu", d["gpu"], "choice", (*GPUS, CUSTOM), label="GPU"),
        Field(f"{p}gpu_mem", 80.0, "float", minimum=0.5, maximum=4096, label="custom GPU memory, GiB"),
        Field(f"{p}gpu_bw", 3350.0, "float", minimum=1, maximum=100_000, label="custom GPU bandwidth, GB/s"),
        Field(
            f"{p}gpu_tflops", None, "float", minimum=0, maximum=100_000, optional=True, label="custom TFLOP/s"
        ),
        Field(f"{p}gpus", d["gpus"], "int", minimum=1, maximum=4096, label="number of GPUs"),
        Field(f"{p}tp", d["tp"], "int", minimum=1, maximum=1024, label="tensor parallel"),
        Field(f"{p}pp", d["pp"], "int", minimum=1, maximum=1024, label="pipeline parallel"),
        Field(f"{p}wdtype", d["wdtype"], "choice", WEIGHT_DTYPES, label="weight dtype"),
        Field(f"{p}kvdtype", d["kvdtype"], "choice", KV_DTYPES, label="KV cache dtype"),
        Field(f"{p}util", d["util"], "float", minimum=0.05, maximum=1.0, label="gpu_memory_utilization"),
        Field(f"{p}block", d["block"], "choice", BLOCK_SIZES, label="block size, tokens"),
        Field(f"{p}ctx", d["ctx"], "int", minimum=16, maximum=MAX_CONTEXT, label="max_model_len, tokens"),
        Field(
            f"{p}act", None, "float", minimum=0, maximum=1024, optional=True, label="activation reserve, GiB"
        ),
        Field(f"{p}seqs", d["seqs"], "int", minimum=1, maximum=65_536, label="max_num_seqs"),
        Field(f"{p}mbt", 8192, "int", minimum=1, maximum=MAX_CONTEXT, label="max_num_batched_tokens"),
        Field(f"{p}hybrid", True, "bool", label="hybrid KV cache manager"),
        Field(
            f"{p}ckpt", None, "int", minimum=1, maximum=2**50, optional=True, label="checkpoint bytes (index)"
        ),
    ]


WORKLOAD_FIELDS = [
    Field("compare", True, "bool", label="show scenario B"),
    Field("wl", "sharegpt", "choice", WORKLOADS, label="workload"),
    Field("wl_n", 1000, "int", minimum=1, maximum=20_000, label="requests"),
    Field("wl_prompt", 512, "int", minimum=1, maximum=MAX_CONTEXT, label="prompt tokens"),
    Field("wl_output", 256, "int", minimum=1, maximum=MAX_CONTEXT, label="output tokens"),
    Field("wl_seed", 0, "int", minimum=0, maximum=2**31 - 1, label="seed"),
]

ALL_FIELDS = scenario_fields("a_") + scenario_fields("b_") + WORKLOAD_FIELDS


def url_params(values: dict[str, Any]) -> dict[str, str]:
    """The URL parameters that matter for `values`: scenario B only when compared, a custom GPU's figures only
    for a custom GPU, the encoded config only for a custom model, fixed lengths only for fixed/uniform loads."""
    skip = set()
    for prefix in ("a_", "b_"):
        if values[f"{prefix}gpu"] != CUSTOM:
            skip |= {f"{prefix}gpu_mem", f"{prefix}gpu_bw", f"{prefix}gpu_tflops"}
        if values[f"{prefix}model"] != CUSTOM:
            skip.add(f"{prefix}config")
        for key, default in (("mbt", 8192), ("hybrid", True), ("ckpt", None)):
            if values.get(f"{prefix}{key}", default) == default:
                skip.add(f"{prefix}{key}")
    if not values["compare"]:
        skip |= {f.key for f in scenario_fields("b_")}
    if values["wl"] in ("sharegpt", "alpaca"):
        skip |= {"wl_prompt", "wl_output"}
    return {k: v for k, v in encode_params(values, ALL_FIELDS).items() if k not in skip}


def config_from_text(text: str) -> dict[str, Any]:
    """Parse a pasted config.json; raises InvalidArgumentError with the JSON error's position."""
    if not text or not text.strip():
        raise InvalidArgumentError("paste or upload a Hugging Face config.json for the custom model")
    if len(text) > 200_000:
        raise InvalidArgumentError("the config.json is larger than 200,000 characters")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgumentError(f"config.json is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise InvalidArgumentError("config.json must be a JSON object")
    return config


def compact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a config.json that the planner reads (what goes into the URL)."""
    keep = {
        "model_type", "torch_dtype", "dtype", "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head",
        "num_heads", "n_heads", "num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num",
        "multi_query", "num_hidden_layers", "n_layer", "num_layers", "n_layers", "head_dim", "intermediate_size",
        "ffn_dim", "n_inner", "moe_intermediate_size", "vocab_size", "max_position_embeddings", "n_positions",
        "max_seq_len", "seq_length", "sliding_window", "use_sliding_window", "kv_lora_rank", "q_lora_rank",
        "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "num_local_experts", "n_routed_experts",
        "num_experts", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace", "tie_word_embeddings",
        "attention_bias", "enable_bias", "quantization_config", "_name_or_path", "layer_types",
        "sliding_window_pattern", "max_window_layers", "attention_chunk_size", "no_rope_layers",
        "no_rope_layer_interval", "interleave_moe_layer_step", "intermediate_size_mlp", "full_attention_interval",
        "attn_layer_indices", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim", "shared_expert_intermediate_size", "mamba_n_heads",
        "mamba_d_head", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_groups", "mamba_ssm_dtype",
        "experts_per_token", "attn_output_gate",
    }  # fmt: skip
    out = {k: v for k, v in config.items() if k in keep}
    if isinstance(config.get("text_config"), dict):
        out["text_config"] = compact_config(config["text_config"])
    if isinstance(out.get("quantization_config"), dict):
        q = out["quantization_config"]
        out["quantization_config"] = {
            k: q[k]
            for k in ("quant_method", "bits", "w_bit", "group_size", "q_group_size", "modules_to_not_convert",
                      "ignore", "config_groups")
            if k in q
        }  # fmt: skip
    return out


def build_model(values: dict[str, Any], prefix: str) -> ModelSpec:
    """The scenario's model: a preset, or the custom config carried (encoded) in `{prefix}config`, with the
    exact checkpoint bytes of an uploaded safetensors index when `{prefix}ckpt` is set."""
    model = _base_model(values, prefix)
    checkpoint = values.get(f"{prefix}ckpt")
    return model if checkpoint is None else replace(model, checkpoint_bytes=int(checkpoint))


def _base_model(values: dict[str, Any], prefix: str) -> ModelSpec:
    slug = values[f"{prefix}model"]
    if slug != CUSTOM:
        return get_model(slug)
    blob = values.get(f"{prefix}config") or ""
    if not blob:
        raise InvalidArgumentError("paste or upload a Hugging Face config.json for the custom model")
    try:
        config = decode_blob(blob)
    except ValueError as reason:
        raise InvalidArgumentError(f"the custom model in the URL cannot be read: {reason}") from None
    return ModelSpec.from_hf_config(config, name=str(config.get("_name_or_path") or "custom model"))


def encode_config(config: dict[str, Any]) -> str:
    return encode_blob(compact_config(config))


def build_gpu(values: dict[str, Any], prefix: str) -> GPUSpec:
    slug = values[f"{prefix}gpu"]
    if slug != CUSTOM:
        return get_gpu(slug)
    return GPUSpec.custom(
        "custom GPU", values[f"{prefix}gpu_mem"], values[f"{prefix}gpu_bw"], values[f"{prefix}gpu_tflops"]
    )


def make_workload(values: dict[str, Any], max_len: int) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of the workload's requests, each at most `max_len` tokens in total."""
    kind, n, seed = values["wl"], values["wl_n"], values["wl_seed"]
    prompt, output = values["wl_prompt"], values["wl_output"]
    if kind in ("fixed", "uniform") and prompt + output > max_len:
        raise InvalidArgumentError(
            f"a request of {prompt:,} + {output:,} tokens is longer than max_model_len {max_len:,}"
        )
    if kind == "sharegpt":
        requests = sharegpt(n, seed=seed, max_len=max_len)
    elif kind == "alpaca":
        requests = alpaca(n, seed=seed, max_len=max_len)
    elif kind == "fixed":
        requests = fixed(n, prompt, output, seed=seed, max_len=max_len)
    else:
        requests = uniform(n, (1, prompt), (1, output), seed=seed, max_len=max_len)
    return [(r.prompt_len, r.output_len) for r in requests]


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
class ScenarioResult:
    """Everything the page shows for one scenario."""

    model: ModelSpec
    gpu: GPUSpec
    plan: CapacityPlan
    what_if: WorkloadWhatIf | None
    fragmentation: list[dict[str, float]]
    workload_error: str | None
    other_hybrid: CapacityPlan | None = (
        None  # the plan with the hybrid KV cache manager switched the other way
    )
    other_hybrid_error: str | None = None


def compute_scenario(
    values: dict[str, Any],
    prefix: str,
    requests: list[tuple[int, int]] | None,
    workload_error: str | None = None,
) -> ScenarioResult:
    """Plan one scenario from validated values; raises InvalidArgumentError with the reason."""
    model = build_model(values, prefix)
    gpu = build_gpu(values, prefix)
    act = values[f"{prefix}act"]
    ctx = values[f"{prefix}ctx"]
    if ctx > model.max_position_embeddings:
        raise InvalidArgumentError(
            f"max_model_len {ctx:,} exceeds {model.name}'s max_position_embeddings "
            f"{model.max_position_embeddings:,}"
        )
    capacity = plan(
        model,
        gpu,
        num_gpus=values[f"{prefix}gpus"],
        tensor_parallel=values[f"{prefix}tp"],
        pipeline_parallel=values[f"{prefix}pp"],
        weight_dtype=values[f"{prefix}wdtype"],
        kv_dtype=values[f"{prefix}kvdtype"],
        gpu_memory_utilization=values[f"{prefix}util"],
        block_size=values[f"{prefix}block"],
        max_model_len=ctx,
        activation_reserve=None if act is None else int(act * GiB),
        max_num_seqs=values[f"{prefix}seqs"],
        max_num_batched_tokens=values.get(f"{prefix}mbt", 8192),
        hybrid_kv_cache_manager=values.get(f"{prefix}hybrid", True),
    )
    other, other_error = None, None
    if model.is_hybrid:
        try:
            other = replace_plan(
                capacity, model, gpu, hybrid_kv_cache_manager=not capacity.hybrid_kv_cache_manager
            )
        except InvalidArgumentError as error:
            other_error = str(error)
    what_if = None
    fragmentation: list[dict[str, float]] = []
    if requests:
        try:
            fragmentation = fragmentation_by_block_size(requests)
            if capacity.num_blocks > 0:
                what_if = workload_what_if(capacity, requests)
        except InvalidArgumentError as error:
            workload_error = str(error)
    return ScenarioResult(model, gpu, capacity, what_if, fragmentation, workload_error, other, other_error)


def replace_plan(capacity: CapacityPlan, model: ModelSpec, gpu: GPUSpec, **changes: Any) -> CapacityPlan:
    """`plan()` again with the inputs of `capacity`, some of them changed."""
    inputs = {
        "num_gpus": capacity.num_gpus,
        "tensor_parallel": capacity.tensor_parallel,
        "pipeline_parallel": capacity.pipeline_parallel,
        "weight_dtype": capacity.weight_dtype,
        "kv_dtype": capacity.kv_dtype,
        "gpu_memory_utilization": capacity.gpu_memory_utilization,
        "block_size": capacity.block_size,
        "max_model_len": capacity.max_model_len,
        "activation_reserve": None if capacity.activation_estimated else capacity.activation_bytes,
        "context_len": capacity.context_len,
        "max_num_seqs": capacity.max_num_seqs,
        "max_num_batched_tokens": capacity.max_num_batched_tokens,
        "hybrid_kv_cache_manager": capacity.hybrid_kv_cache_manager,
    }
    return plan(model, gpu, **{**inputs, **changes})


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
    gib = GiB
    context_blocks = blocks_for_tokens(p.context_len, p.block_size)
    layout = p.kv_layout
    if layout is not None and (len(layout.groups) > 1 or layout.groups[0].kind not in ("full", "mla")):
        return [
            f"KV bytes per token per GPU, every layer as full attention = {per_token}",
            *_group_lines(result),
        ]
    return [
        f"KV bytes per token per GPU = {per_token}",
        f"Block bytes = {p.block_size} tokens × {p.kv_bytes_per_token:,} B = **{p.block_bytes:,} B**",
        f"KV budget per GPU = {p.gpu_memory_bytes / gib:,.2f} GiB × {p.gpu_memory_utilization:g} − "
        f"{p.weights_bytes / gib:,.2f} GiB weights − {p.activation_bytes / gib:,.2f} GiB activations"
        f"{' (estimate)' if p.activation_estimated else ''} = **{p.kv_budget_bytes / gib:,.2f} GiB**",
        f"KV blocks = floor({max(p.kv_budget_bytes, 0):,} B / {p.block_bytes:,} B) = **{p.num_blocks:,}**; "
        f"KV tokens = {p.num_blocks:,} × {p.block_size} = **{p.kv_tokens:,}**",
        f"Max concurrent requests of {p.context_len:,} tokens = {p.num_blocks:,} // ceil({p.context_len:,}/"
        f"{p.block_size}) = {p.num_blocks:,} // {context_blocks:,} = **{p.max_concurrency:,}** per replica"
        + (f" × {p.replicas} replicas = **{p.max_concurrency_total:,}**" if p.replicas > 1 else ""),
        f"Weights per GPU = {m.num_params / 1e9:,.2f}B params"
        + (" (estimated from the config's shapes)" if m.params_estimated else "")
        + f" × {DTYPE_BITS[p.weight_dtype] / 8:g} B "
        f"({p.weight_dtype}) / {p.tensor_parallel} TP"
        + (f" (largest of {p.pipeline_parallel} PP stages)" if p.pipeline_parallel > 1 else "")
        + f" = **{p.weights_bytes / gib:,.2f} GiB**",
    ]


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
        f"**{p.max_concurrency:,}** per replica"
        + (f" × {p.replicas} replicas = **{p.max_concurrency_total:,}**" if p.replicas > 1 else ""),
        _weights_line(m, p),
    ]
    return lines


def _weights_line(m: ModelSpec, p: CapacityPlan) -> str:
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


def plan_document(values: dict[str, Any], results: dict[str, ScenarioResult]) -> dict[str, Any]:
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
