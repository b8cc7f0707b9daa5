"""The Planner page's inputs as URL fields: a scenario's deployment and vLLM on a CPU from the capacity plan's field
schema (`core.planning.predict.plan_fields.PLANNER_FIELDS` and `CPU_FIELDS`: the `plan` command's flags, bounds and
labels), the rest (the workload, the view, the CPU section's switch) declared here.

Two scenarios share one schema under the prefixes "a_" and "b_"; the workload fields are shared so that both
scenarios serve the same requests. The page's widgets read their bounds from these fields, and
`core.page_models.planner` computes from the parsed values (keys `{prefix}{name}`). No streamlit here.
"""

from dataclasses import replace
from typing import Any

from core.page_models.planner import CUSTOM, SCENARIO_KEYS, WORKLOAD_KEYS, WORKLOADS
from core.planning.memory.kv_accounting import MAX_CONTEXT_TOKENS
from core.planning.predict.plan_fields import CPU_FIELDS as PLAN_CPU_FIELDS
from core.planning.predict.plan_fields import CPU_SPACE_FIELD, PLANNER_FIELDS
from ui.input_fields import url_field
from ui.query_state import Field, encode_params

SCENARIO_NAMES = {"a_": "Scenario A", "b_": "Scenario B"}
SCENARIO_DEFAULTS = {
    "a_": {"model": "llama-3.1-70b", "gpu": "h100-80gb", "gpus": 4, "tp": 4, "kvdtype": "fp8", "ctx": 4096},
    "b_": {"model": "llama-3.1-70b", "gpu": "h200-141gb", "gpus": 2, "tp": 2, "kvdtype": "fp8", "ctx": 4096},
}
# the page's seeds where they differ from the plan's command line (which leaves out GPUs, max_model_len, block
# size and a custom GPU's figures): a custom GPU starts as an H100's memory and bandwidth
SCENARIO_SEEDS = {"block": 16, "gpu_mem": 80.0, "gpu_bw": 3350.0}
# the scenario's deployment inputs by the page's key (before the scenario's prefix)
PLANNER = {field.url_key: field for field in PLANNER_FIELDS}
WORKLOAD_LABELS = {
    "sharegpt": "ShareGPT-like (161 in / 338 out)",
    "alpaca": "Alpaca-like (19 in / 58 out)",
    "fixed": "Fixed lengths",
    "uniform": "Uniform lengths",
}


def scenario_fields(prefix: str) -> list[Field]:
    """The URL fields of one scenario; keys are `prefix` + a name of SCENARIO_KEYS (e.g. "a_model"). A
    deployment's inputs are the capacity plan's fields (`PLANNER_FIELDS`: their kind, bounds, step and label;
    the page's seeds below, the hybrid KV cache manager's switch among them), a custom model and GPU add "custom"
    to the presets; the page's own: the encoded config.json and an uploaded index's checkpoint bytes."""
    seeds = {**SCENARIO_SEEDS, **SCENARIO_DEFAULTS[prefix]}
    fields = {
        field.url_key: url_field(field, seeds.get(field.url_key, field.default), bounded=True, prefix=prefix)
        for field in PLANNER_FIELDS
    }
    for key in ("model", "gpu"):  # a preset, or "custom" (a pasted config.json, a custom GPU's figures)
        fields[key] = replace(fields[key], choices=(*fields[key].choices, CUSTOM))
    p = prefix
    fields |= {
        "config": Field(f"{p}config", "", "str", max_length=8000, label="custom config.json (encoded)"),
        "ckpt": Field(
            f"{p}ckpt", None, "int", minimum=1, maximum=2**50, optional=True, label="checkpoint bytes (index)"
        ),
    }
    assert set(fields) == set(SCENARIO_KEYS)
    return [fields[key] for key in SCENARIO_KEYS]


# The workload what-if's requests (the page's own: no command takes them); each label is its widget's too.
WORKLOAD_FIELDS = [
    Field("compare", True, "bool", label="Compare with scenario B"),
    Field("wl", "sharegpt", "choice", WORKLOADS, label="Requests"),
    Field("wl_n", 1000, "int", minimum=1, maximum=20_000, step=100, label="Number of requests"),
    Field("wl_prompt", 512, "int", minimum=1, maximum=MAX_CONTEXT_TOKENS, step=64, label="Prompt tokens"),
    Field("wl_output", 256, "int", minimum=1, maximum=MAX_CONTEXT_TOKENS, step=64, label="Output tokens"),
    Field("wl_seed", 0, "int", minimum=0, maximum=2**31 - 1, step=1, label="Seed"),
]
assert tuple(f.key for f in WORKLOAD_FIELDS[1:]) == WORKLOAD_KEYS

# What the page shows besides the plans: the presets' tables and a config template are drawn only on request (they
# load Streamlit's table and JSON viewers, which a browser fetches and runs before it draws the charts).
VIEW_FIELDS = [
    Field("presets", False, "bool", label="Show the presets: models and GPUs (the data behind the numbers)")
]

# vLLM on a CPU: scenario A's model in VLLM_CPU_KVCACHE_SPACE (core.planning.memory.cpu_kv), drawn when `cpu` is on;
# its inputs are the capacity plan's CPU fields (`CPU_FIELDS`: `plan --cpu-kv-cache-space-gib`'s), seeded 4 GiB.
CPU_FIELDS = [
    Field(
        "cpu", False, "bool", label="Plan scenario A's model on vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE)"
    ),
    *(url_field(f, 4 if f is CPU_SPACE_FIELD else f.default, bounded=True) for f in PLAN_CPU_FIELDS),
]

ALL_FIELDS = scenario_fields("a_") + scenario_fields("b_") + WORKLOAD_FIELDS + VIEW_FIELDS + CPU_FIELDS
FIELDS = {field.key: field for field in ALL_FIELDS}


def url_params(values: dict[str, Any]) -> dict[str, str]:
    """The URL parameters that matter for `values`: scenario B only when compared, a custom GPU's figures only
    for a custom GPU, the encoded config only for a custom model, fixed lengths only for fixed/uniform loads."""
    skip = set()
    for prefix in SCENARIO_NAMES:
        if values[f"{prefix}gpu"] != CUSTOM:
            skip |= {f"{prefix}gpu_mem", f"{prefix}gpu_bw", f"{prefix}gpu_tflops"}
        if values[f"{prefix}model"] != CUSTOM:
            skip.add(f"{prefix}config")
        for key in ("mbt", "hybrid", "ckpt", "offload", "dp", "ep"):
            default = PLANNER[key].default if key in PLANNER else None
            if values.get(f"{prefix}{key}", default) == default:
                skip.add(f"{prefix}{key}")  # only a changed setting goes into the URL
    if not values["compare"]:
        skip |= {f.key for f in scenario_fields("b_")}
    if values["wl"] in ("sharegpt", "alpaca"):
        skip |= {"wl_prompt", "wl_output"}
    if not values.get("presets"):
        skip.add("presets")
    if not values.get("cpu"):
        skip |= {f.key for f in CPU_FIELDS}
    return {k: v for k, v in encode_params(values, ALL_FIELDS).items() if k not in skip}
