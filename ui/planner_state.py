"""The Planner page's inputs as URL fields: their types, bounds, widget steps and defaults, in one schema.

Two scenarios share one schema under the prefixes "a_" and "b_"; the workload fields are shared so that both
scenarios serve the same requests. The page's widgets read their bounds from these fields, and
`core.page_models.planner` computes from the parsed values (keys `{prefix}{name}`). No streamlit here.
"""

from typing import Any

from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from core.page_models.planner import CUSTOM, SCENARIO_KEYS, WORKLOAD_KEYS, WORKLOADS
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.cpu_kv import (
    CPU_DEFAULT_BLOCK_SIZE,
    CPU_KV_CACHE_DTYPES,
    CPU_MODEL_DTYPES,
    MAX_KV_CACHE_SPACE_GIB,
)
from core.planning.memory.kv_accounting import (
    BLOCK_SIZES,
    KV_DTYPES,
    MAX_CONTEXT_TOKENS,
    WEIGHT_DTYPES,
)
from ui.query_state import Field, encode_params

SCENARIO_NAMES = {"a_": "Scenario A", "b_": "Scenario B"}
SCENARIO_DEFAULTS = {
    "a_": {"model": "llama-3.1-70b", "gpu": "h100-80gb", "gpus": 4, "tp": 4, "kvdtype": "fp8", "ctx": 4096},
    "b_": {"model": "llama-3.1-70b", "gpu": "h200-141gb", "gpus": 2, "tp": 2, "kvdtype": "fp8", "ctx": 4096},
}
WORKLOAD_LABELS = {
    "sharegpt": "ShareGPT-like (161 in / 338 out)",
    "alpaca": "Alpaca-like (19 in / 58 out)",
    "fixed": "Fixed lengths",
    "uniform": "Uniform lengths",
}


def scenario_fields(prefix: str) -> list[Field]:
    """The URL fields of one scenario; keys are `prefix` + a name of SCENARIO_KEYS (e.g. "a_model")."""
    d = {"wdtype": "auto", "pp": 1, "util": 0.9, "block": 16, "seqs": 256, **SCENARIO_DEFAULTS[prefix]}
    p = prefix
    fields = [
        *_model_and_gpu_fields(p, d),
        *_deployment_fields(p, d),
        *_vllm_setting_fields(p, d),
        Field(
            f"{p}ckpt", None, "int", minimum=1, maximum=2**50, optional=True, label="checkpoint bytes (index)"
        ),
        Field(f"{p}offload", 0.0, "float", minimum=0, maximum=4096, step=10, label="host KV tier, GiB"),
        Field(
            f"{p}dp",
            1,
            "int",
            minimum=1,
            maximum=1024,
            step=1,
            label="data-parallel ranks (MoE: attention DP)",
        ),
        Field(f"{p}ep", False, "bool", label="expert parallel"),
    ]
    assert tuple(f.key[len(p) :] for f in fields) == SCENARIO_KEYS
    return fields


def _model_and_gpu_fields(p: str, d: dict[str, Any]) -> list[Field]:
    """What runs: the model (a preset, or a custom config.json) and the GPU (a preset, or custom figures)."""
    return [
        Field(f"{p}model", d["model"], "choice", (*MODELS, CUSTOM), label="model"),
        Field(f"{p}config", "", "str", max_length=8000, label="custom config.json (encoded)"),
        Field(f"{p}gpu", d["gpu"], "choice", (*GPUS, CUSTOM), label="GPU"),
        Field(
            f"{p}gpu_mem", 80.0, "float", minimum=0.5, maximum=4096, step=1, label="custom GPU memory, GiB"
        ),
        Field(
            f"{p}gpu_bw",
            3350.0,
            "float",
            minimum=1,
            maximum=100_000,
            step=100,
            label="custom GPU bandwidth, GB/s",
        ),
        Field(
            f"{p}gpu_tflops",
            None,
            "float",
            minimum=0,
            maximum=100_000,
            step=10,
            optional=True,
            label="custom TFLOP/s",
        ),
    ]


def _deployment_fields(p: str, d: dict[str, Any]) -> list[Field]:
    """How it is deployed: the number of GPUs, tensor and pipeline parallel, weight and KV cache dtypes."""
    return [
        Field(f"{p}gpus", d["gpus"], "int", minimum=1, maximum=4096, step=1, label="number of GPUs"),
        Field(f"{p}tp", d["tp"], "int", minimum=1, maximum=1024, step=1, label="tensor parallel"),
        Field(f"{p}pp", d["pp"], "int", minimum=1, maximum=1024, step=1, label="pipeline parallel"),
        Field(f"{p}wdtype", d["wdtype"], "choice", WEIGHT_DTYPES, label="weight dtype"),
        Field(f"{p}kvdtype", d["kvdtype"], "choice", KV_DTYPES, label="KV cache dtype"),
    ]


def _vllm_setting_fields(p: str, d: dict[str, Any]) -> list[Field]:
    """vLLM's settings that size the KV cache: memory utilization, block size, max_model_len, activation
    reserve, max_num_seqs, max_num_batched_tokens and the hybrid KV cache manager."""
    return [
        Field(
            f"{p}util",
            d["util"],
            "float",
            minimum=0.05,
            maximum=1.0,
            step=0.01,
            label="gpu_memory_utilization",
        ),
        Field(f"{p}block", d["block"], "choice", BLOCK_SIZES, label="block size, tokens"),
        Field(
            f"{p}ctx",
            d["ctx"],
            "int",
            minimum=16,
            maximum=MAX_CONTEXT_TOKENS,
            step=1024,
            label="max_model_len, tokens",
        ),
        Field(
            f"{p}act",
            None,
            "float",
            minimum=0,
            maximum=1024,
            step=0.5,
            optional=True,
            label="activation reserve, GiB",
        ),
        Field(f"{p}seqs", d["seqs"], "int", minimum=1, maximum=65_536, step=16, label="max_num_seqs"),
        Field(
            f"{p}mbt",
            DEFAULT_MAX_NUM_BATCHED_TOKENS,
            "int",
            minimum=1,
            maximum=MAX_CONTEXT_TOKENS,
            step=1024,
            label="max_num_batched_tokens",
        ),
        Field(f"{p}hybrid", True, "bool", label="hybrid KV cache manager"),
    ]


WORKLOAD_FIELDS = [
    Field("compare", True, "bool", label="show scenario B"),
    Field("wl", "sharegpt", "choice", WORKLOADS, label="workload"),
    Field("wl_n", 1000, "int", minimum=1, maximum=20_000, step=100, label="requests"),
    Field("wl_prompt", 512, "int", minimum=1, maximum=MAX_CONTEXT_TOKENS, step=64, label="prompt tokens"),
    Field("wl_output", 256, "int", minimum=1, maximum=MAX_CONTEXT_TOKENS, step=64, label="output tokens"),
    Field("wl_seed", 0, "int", minimum=0, maximum=2**31 - 1, step=1, label="seed"),
]
assert tuple(f.key for f in WORKLOAD_FIELDS[1:]) == WORKLOAD_KEYS

# What the page shows besides the plans: the presets' tables and a config template are drawn only on request (they
# load Streamlit's table and JSON viewers, which a browser fetches and runs before it draws the charts).
VIEW_FIELDS = [Field("presets", False, "bool", label="show the presets")]

# vLLM on a CPU: scenario A's model in VLLM_CPU_KVCACHE_SPACE (core.planning.memory.cpu_kv), drawn when `cpu` is on.
CPU_FIELDS = [
    Field("cpu", False, "bool", label="plan vLLM on a CPU"),
    Field(
        "cpu_gib",
        4,
        "int",
        minimum=1,
        maximum=MAX_KV_CACHE_SPACE_GIB,
        step=1,
        label="VLLM_CPU_KVCACHE_SPACE, GiB",
    ),
    Field(
        "cpu_block", CPU_DEFAULT_BLOCK_SIZE, "choice", (32, 64, 128, 256, 512), label="CPU block size, tokens"
    ),
    Field("cpu_dtype", "auto", "choice", CPU_MODEL_DTYPES, label="vllm serve --dtype"),
    Field("cpu_kvdtype", "auto", "choice", CPU_KV_CACHE_DTYPES, label="CPU KV cache dtype"),
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
        for key, default in (
            ("mbt", DEFAULT_MAX_NUM_BATCHED_TOKENS),
            ("hybrid", True),
            ("ckpt", None),
            ("offload", 0.0),
            ("dp", 1),
            ("ep", False),
        ):
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
