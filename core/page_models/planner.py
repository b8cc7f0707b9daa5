"""What the Planner page computes: one scenario's model, GPU, plan, workload what-if and their presentation data.

A scenario's inputs arrive as a flat mapping keyed `{prefix}{name}` (prefix "a_" or "b_"; names in
SCENARIO_KEYS) plus the workload keys in WORKLOAD_KEYS, already parsed and bounded by the page's URL schema.
A custom model travels as a compact encoded config.json (`encode_config` / `decode_config`, URL-safe).
Every function raises `InvalidArgumentError` (a `LabError`) with the reason for bad input; none imports
streamlit.
"""

import base64
import binascii
import functools
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from core.errors import InvalidArgumentError, LabError
from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS, request_blocks
from core.planning.hardware import GPUS, GPUSpec, get_gpu
from core.planning.kv_accounting import (
    DTYPE_BITS,
    blocks_for_tokens,
    kv_bytes_per_token,
    kv_heads_per_gpu,
    layers_per_gpu,
    resolve_weight_dtype,
)
from core.planning.models import MODELS, ModelSpec, get_model
from core.planning.plan import CapacityPlan, PlanInputs, concurrency_vs_context, plan_from
from core.planning.weights import bits_per_quantized_param, quantized_params, uses_group_quantization
from core.planning.what_if import WorkloadWhatIf, fragmentation_by_block_size, workload_what_if
from core.serving.workload import alpaca, fixed, sharegpt, uniform
from core.uploads import parse_json, upload_text

CUSTOM = "custom"
WORKLOADS = ("sharegpt", "alpaca", "fixed", "uniform")
SCENARIO_KEYS = (
    "model", "config", "gpu", "gpu_mem", "gpu_bw", "gpu_tflops", "gpus", "tp", "pp", "wdtype", "kvdtype",
    "util", "block", "ctx", "act", "seqs", "mbt", "hybrid", "ckpt",
)  # fmt: skip
WORKLOAD_KEYS = ("wl", "wl_n", "wl_prompt", "wl_output", "wl_seed")
GiB = 1024**3
MAX_CONFIG_CHARS = 200_000  # a pasted or uploaded config.json
MAX_CONFIG_BYTES = 64 * 1024  # a decoded config from the URL
_CONFIG_ERRORS = (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError)


# --------------------------------------------------------------------------------------------------------------
# A custom model's config.json: parsing, the fields kept, the URL encoding
# --------------------------------------------------------------------------------------------------------------


def config_from_text(text: str) -> dict[str, Any]:
    """Parse a pasted config.json into a dict; raises InvalidArgumentError (with the JSON error's position)
    for empty, oversized, malformed, too deeply nested or non-object text."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError("paste or upload a Hugging Face config.json for the custom model")
    if len(text) > MAX_CONFIG_CHARS:
        raise InvalidArgumentError(
            f"the config.json has {len(text):,} characters; at most {MAX_CONFIG_CHARS:,} are accepted"
        )
    config = parse_json(text, "config.json")
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"config.json must be a JSON object, not a JSON {type(config).__name__}")
    return config


def config_from_bytes(data: bytes) -> dict[str, Any]:
    """Parse an uploaded config.json (UTF-8 text); oversized (over 4 x MAX_CONFIG_CHARS bytes), empty,
    compressed, binary or non-UTF-8 files are refused (`core.uploads.upload_text`). The caller checks the
    operator's upload limit before reading the file (`core.uploads.read_upload`)."""
    text = upload_text(
        data, "the uploaded config.json", "a Hugging Face config.json", max_bytes=4 * MAX_CONFIG_CHARS
    )
    return config_from_text(text)


_KEPT_FIELDS = {
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


def compact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a config.json that the planner reads (what goes into the URL)."""
    out = {k: v for k, v in config.items() if k in _KEPT_FIELDS}
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


def encode_config(config: dict[str, Any]) -> str:
    """The compacted config as a URL-safe string: sorted compact JSON, zlib level 9, base64url without '='."""
    raw = json.dumps(compact_config(config), separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def decode_config(text: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """Inverse of `encode_config`; raises InvalidArgumentError for anything malformed, not an object, or
    inflating past `max_bytes` (a zip bomb stops there)."""
    reason = "it is not an encoded configuration"
    try:
        packed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, max_bytes + 1)
        if len(raw) > max_bytes or inflater.unconsumed_tail:
            reason = f"it decodes to more than {max_bytes:,} bytes"
            raise ValueError(reason)
        config = json.loads(raw)
    except (binascii.Error, zlib.error, UnicodeDecodeError, RecursionError, TypeError, ValueError):
        raise InvalidArgumentError(f"the custom model in the URL cannot be read: {reason}") from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"the custom model in the URL cannot be read: {reason}")
    return config


def model_from_config(config: dict[str, Any]) -> ModelSpec:
    """`ModelSpec.from_hf_config`, with any wrongly typed field reported as InvalidArgumentError."""
    name = config.get("_name_or_path")
    try:
        return ModelSpec.from_hf_config(
            config, name=name if isinstance(name, str) and name else "custom model"
        )
    except LabError:
        raise
    except _CONFIG_ERRORS as error:
        raise InvalidArgumentError(f"config.json has a field of the wrong type or size: {error}") from None


# --------------------------------------------------------------------------------------------------------------
# One scenario
# --------------------------------------------------------------------------------------------------------------


def build_model(values: Mapping[str, Any], prefix: str) -> ModelSpec:
    """The scenario's model: a preset, or the custom config carried (encoded) in `{prefix}config`, with the
    exact checkpoint bytes of an uploaded safetensors index when `{prefix}ckpt` is set."""
    model = _base_model(values, prefix)
    checkpoint = values.get(f"{prefix}ckpt")
    return model if checkpoint is None else replace(model, checkpoint_bytes=int(checkpoint))


def _base_model(values: Mapping[str, Any], prefix: str) -> ModelSpec:
    slug = values[f"{prefix}model"]
    if slug != CUSTOM:
        return get_model(slug)
    blob = values.get(f"{prefix}config") or ""
    if not blob:
        raise InvalidArgumentError("paste or upload a Hugging Face config.json for the custom model")
    return model_from_config(decode_config(blob))


def build_gpu(values: Mapping[str, Any], prefix: str) -> GPUSpec:
    """The scenario's GPU: a preset, or a custom one from `{prefix}gpu_mem` (GiB), `gpu_bw` (GB/s) and
    `gpu_tflops` (dense bf16, optional)."""
    slug = values[f"{prefix}gpu"]
    if slug != CUSTOM:
        return get_gpu(slug)
    return GPUSpec.custom(
        "custom GPU", values[f"{prefix}gpu_mem"], values[f"{prefix}gpu_bw"], values[f"{prefix}gpu_tflops"]
    )


def plan_inputs(values: Mapping[str, Any], prefix: str) -> PlanInputs:
    """The plan's inputs for one scenario (activation reserve `{prefix}act` in GiB, None for the estimate)."""
    act = values[f"{prefix}act"]
    return PlanInputs(
        model=build_model(values, prefix),
        gpu=build_gpu(values, prefix),
        num_gpus=values[f"{prefix}gpus"],
        tensor_parallel=values[f"{prefix}tp"],
        pipeline_parallel=values[f"{prefix}pp"],
        weight_dtype=values[f"{prefix}wdtype"],
        kv_dtype=values[f"{prefix}kvdtype"],
        gpu_memory_utilization=values[f"{prefix}util"],
        block_size=values[f"{prefix}block"],
        max_model_len=values[f"{prefix}ctx"],
        activation_reserve=None if act is None else int(act * GiB),
        max_num_seqs=values[f"{prefix}seqs"],
        max_num_batched_tokens=values.get(f"{prefix}mbt", DEFAULT_MAX_NUM_BATCHED_TOKENS),
        hybrid_kv_cache_manager=values.get(f"{prefix}hybrid", True),
    )


def clamp_context(model_slug: str, context_len: int) -> int:
    """`context_len` brought within the preset's max_position_embeddings (unchanged for a custom model)."""
    if model_slug in MODELS:
        return min(context_len, MODELS[model_slug].max_position_embeddings)
    return context_len


def workload_max_len(values: Mapping[str, Any], prefixes: tuple[str, ...] | list[str]) -> int:
    """The longest request the shown scenarios all accept: the shortest of their max_model_len."""
    return min(values[f"{prefix}ctx"] for prefix in prefixes)


def make_workload(values: Mapping[str, Any], max_len: int) -> list[tuple[int, int]]:
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
    elif kind == "uniform":
        requests = uniform(n, (1, prompt), (1, output), seed=seed, max_len=max_len)
    else:
        raise InvalidArgumentError(f"unknown workload {kind!r}; allowed: {', '.join(WORKLOADS)}")
    return [(r.prompt_len, r.output_len) for r in requests]


@dataclass(frozen=True)
class ScenarioResult:
    """Everything the page shows for one scenario. `what_if` is None without requests or KV blocks;
    `workload_error` says why the workload could not be evaluated (None when it was)."""

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


@functools.lru_cache(maxsize=32)
def _fragmentation(requests: tuple[tuple[int, int], ...]) -> tuple[dict[str, float], ...]:
    """`fragmentation_by_block_size`, computed once per workload (every render of the page asks again)."""
    return tuple(fragmentation_by_block_size(requests))


@functools.lru_cache(maxsize=64)
def _what_if(capacity: CapacityPlan, requests: tuple[tuple[int, int], ...]) -> WorkloadWhatIf:
    """`workload_what_if`, computed once per plan and workload (the result is frozen)."""
    return workload_what_if(capacity, requests)


def compute_scenario(
    values: Mapping[str, Any],
    prefix: str,
    requests: list[tuple[int, int]] | None,
    workload_error: str | None = None,
) -> ScenarioResult:
    """Plan one scenario from validated values; raises InvalidArgumentError with the reason."""
    inputs = plan_inputs(values, prefix)
    capacity = plan_from(inputs)
    other, other_error = None, None
    if inputs.model.is_hybrid:
        try:
            flipped = not capacity.hybrid_kv_cache_manager
            other = plan_from(replace(inputs, hybrid_kv_cache_manager=flipped))
        except InvalidArgumentError as error:
            other_error = str(error)
    what_if = None
    fragmentation: list[dict[str, float]] = []
    if requests:
        try:
            workload = tuple(map(tuple, requests))
            fragmentation = [dict(row) for row in _fragmentation(workload)]
            if capacity.num_blocks > 0:
                what_if = _what_if(capacity, workload)
        except InvalidArgumentError as error:
            workload_error = str(error)
    return ScenarioResult(
        inputs.model, inputs.gpu, capacity, what_if, fragmentation, workload_error, other, other_error
    )


# --------------------------------------------------------------------------------------------------------------
# What the page shows beside the plan
# --------------------------------------------------------------------------------------------------------------


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
        f"{p.block_size}) = {p.num_blocks:,} // {context_blocks:,} = **{p.max_concurrency:,}** per replica"
        + (f" × {p.replicas} replicas = **{p.max_concurrency_total:,}**" if p.replicas > 1 else ""),
        f"Weights per GPU = {m.num_params / 1e9:,.2f}B params"
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


DEPLOYMENT_TP = (1, 2, 4, 8)  # tensor-parallel sizes tried, one replica each


def smallest_deployment(values: dict[str, Any], prefix: str) -> tuple[int, int] | None:
    """(GPUs, tensor parallel) of the smallest single-replica deployment of the scenario's model that fits with its
    other settings (pipeline parallel kept: GPUs = TP x PP), trying TP 1, 2, 4, 8; None when none fits. A TP the
    model's heads do not allow is skipped. Raises LabError when the scenario itself is invalid (e.g. a bad custom
    config), whatever the deployment."""
    pp = int(values[f"{prefix}pp"])
    errors = []
    for tp in DEPLOYMENT_TP:
        trial = {**values, f"{prefix}gpus": tp * pp, f"{prefix}tp": tp}
        try:
            result = compute_scenario(trial, prefix, None)
        except LabError as error:
            errors.append(error)
            continue
        if result.plan.fits:
            return tp * pp, tp
    if len(errors) == len(
        DEPLOYMENT_TP
    ):  # nothing could even be planned: the scenario's own inputs are wrong
        raise errors[-1]
    return None
