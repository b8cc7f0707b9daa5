"""One Planner scenario: its model, GPU and plan inputs from the page's values, its workload, and the plan with
its workload what-if (`compute_scenario`).

A scenario's inputs arrive as a flat mapping keyed `{prefix}{name}` (prefix "a_" or "b_"; names in
SCENARIO_KEYS) plus the workload keys in WORKLOAD_KEYS, already parsed and bounded by the page's URL schema.
Every function raises `InvalidArgumentError` (a `LabError`) with the reason for bad input.
"""

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from core.errors import InvalidArgumentError, LabError
from core.fields import field_named
from core.page_models.planner_config import decode_config, model_from_config
from core.planning.catalog.hardware import GPUSpec, get_gpu
from core.planning.catalog.models import MODELS, ModelSpec, get_model
from core.planning.memory.cpu_kv import CpuKVPlan, plan_cpu_kv
from core.planning.memory.offload import HostKVTier, host_kv_tier
from core.planning.memory.plan import CapacityPlan, PlanInputs, plan_from
from core.planning.memory.what_if import WorkloadWhatIf, fragmentation_by_block_size, workload_what_if
from core.planning.predict.inputs import cpu_inputs_from, custom_gpu_from, plan_inputs_from
from core.planning.predict.plan_fields import CPU_FIELDS, CUSTOM_GPU_FIELDS, OFFLOAD_FIELD, PLANNER_FIELDS
from core.serving.workload import alpaca, fixed, sharegpt, uniform

CUSTOM = "custom"
WORKLOADS = ("sharegpt", "alpaca", "fixed", "uniform")
SCENARIO_KEYS = (
    "model",
    "config",
    "gpu",
    "gpu_mem",
    "gpu_bw",
    "gpu_tflops",
    "gpus",
    "tp",
    "pp",
    "wdtype",
    "kvdtype",
    "util",
    "block",
    "ctx",
    "act",
    "seqs",
    "mbt",
    "hybrid",
    "ckpt",
    "offload",
    "dp",
    "ep",
)
WORKLOAD_KEYS = ("wl", "wl_n", "wl_prompt", "wl_output", "wl_seed")
GiB = 1024**3


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
    `gpu_tflops` (dense bf16, optional), checked by their fields (`custom_gpu_from`)."""
    slug = values[f"{prefix}gpu"]
    if slug != CUSTOM:
        return get_gpu(slug)
    return custom_gpu_from(by_name(values, prefix, CUSTOM_GPU_FIELDS))


def by_name(values: Mapping[str, Any], prefix: str, fields=PLANNER_FIELDS) -> dict[str, Any]:
    """One scenario's values (keyed `{prefix}{url_key}`) keyed by their fields' names, as the converters of
    `core.planning.predict.inputs` take them (a key the page left out: left out, its field's default)."""
    return {f.name: values[prefix + f.url_key] for f in fields if prefix + f.url_key in values}


def plan_inputs(values: Mapping[str, Any], prefix: str) -> PlanInputs:
    """The plan's inputs for one scenario (`plan_inputs_from`, the `plan` command's converter: each value checked
    by its field, with the command line's message), its model and GPU a preset or the page's custom one."""
    named = by_name(values, prefix) | {"model": build_model(values, prefix), "gpu": build_gpu(values, prefix)}
    return plan_inputs_from(named)


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
    host_tier: HostKVTier | None = (
        None  # the host KV tier of `{prefix}offload` GiB (vLLM's native offloading)
    )


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
    gib = OFFLOAD_FIELD.check(values.get(f"{prefix}offload", 0.0))  # as `plan --kv-offload-gib` checks it
    host_tier = host_kv_tier(capacity, gib) if gib else None
    return ScenarioResult(
        inputs.model,
        inputs.gpu,
        capacity,
        what_if,
        fragmentation,
        workload_error,
        other,
        other_error,
        host_tier,
    )


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


def cpu_plan(values: Mapping[str, Any]) -> CpuKVPlan:
    """Scenario A's model served by vLLM's CPU backend: the CPU section's inputs (`CPU_FIELDS`, `plan
    --cpu-kv-cache-space-gib`'s: the KV space, block size, dtype and KV dtype) with scenario A's max_model_len,
    max_num_batched_tokens and hybrid setting, through the `plan` command's converter (`cpu_inputs_from`);
    raises InvalidArgumentError."""
    names = ("max_model_len", "max_num_batched_tokens", "hybrid_kv_cache_manager")
    scenario = by_name(values, "a_", tuple(field_named(PLANNER_FIELDS, name) for name in names))
    named = {f.name: values[f.url_key] for f in CPU_FIELDS} | scenario
    return plan_cpu_kv(cpu_inputs_from(named | {"model": build_model(values, "a_")}))
