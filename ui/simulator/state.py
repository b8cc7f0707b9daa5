"""The Simulator page's inputs as URL fields (types, bounds, steps, defaults), so a run can be sent as a link.

Keys are the page's widget keys. Defaults are `SimulatorParams()`'s: the paper's setup (1,000 ShareGPT-like requests
at 2 req/s, OPT-13B, the paper's 15,728 slots). An uploaded trace cannot travel in a URL: a link to a trace run
says so and falls back to the generated workload. No streamlit here.
"""

import math
from typing import Any

from core.kv.host_tier import OFFLOAD_POLICIES
from core.page_models.simulator import (
    CAPACITY_SOURCES,
    DATASETS,
    DEFAULT_PARAMS,
    SimulatorParams,
    model_kv_groups,
)
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.kv_accounting import BLOCK_SIZES
from core.serving.memory_policies import POLICY_NAMES
from ui.query_state import Field, encode_params

D = DEFAULT_PARAMS

FIELDS = [
    Field("dataset", D.dataset, "choice", DATASETS, label="workload"),
    Field("num_requests", D.num_requests, "int", minimum=1, maximum=10_000, step=100, label="requests"),
    Field("all_at_once", False, "bool", label="all requests at t = 0"),
    Field("rate", D.rate, "float", minimum=0.01, maximum=1_000.0, step=0.5, label="arrival rate, requests/s"),
    Field("seed", D.seed, "int", minimum=0, maximum=2**31 - 1, step=1, label="seed"),
    Field("n", D.n, "int", minimum=1, maximum=16, step=1, label="parallel samples"),
    Field("prefix_len", D.prefix_len, "int", minimum=0, maximum=1024, step=16, label="shared prompt, tokens"),
    Field("prefix_fraction", D.prefix_fraction, "float", minimum=0.0, maximum=1.0, step=0.01, label="share"),
    Field("fixed_prompt", D.prompt_len, "int", minimum=1, maximum=2047, step=1, label="prompt tokens"),
    Field("fixed_output", D.output_len, "int", minimum=1, maximum=2047, step=1, label="output tokens"),
    Field("model", D.model, "choice", tuple(MODELS), label="model"),
    Field("gpu", D.gpu, "choice", tuple(GPUS), label="GPU"),
    Field("capacity", D.capacity_source, "choice", CAPACITY_SOURCES, label="KV capacity source"),
    Field("saturate", True, "bool", label="size the load to the GPU's memory"),
    Field(
        "raw_capacity", D.raw_capacity_tokens, "int", minimum=16, maximum=10_000_000, step=1024, label="slots"
    ),
    Field(
        "overhead_ms", D.overhead_ms, "float", minimum=0.0, maximum=200.0, step=1.0, label="step overhead, ms"
    ),
    Field("policies", D.policies, "multi", POLICY_NAMES, label="policies"),
    Field("block_size", D.block_size, "choice", BLOCK_SIZES, label="block size, tokens"),
    Field("prefix_caching", D.enable_prefix_caching, "bool", label="prefix caching"),
    Field("hybrid", False, "bool", label="hybrid KV cache manager"),
    Field(
        "kv_offload_gib",
        D.kv_offload_gib,
        "float",
        minimum=0.0,
        maximum=4096.0,
        step=1.0,
        label="host KV tier, GiB",
    ),
    Field("offload_policy", D.offload_policy, "choice", OFFLOAD_POLICIES, label="host tier eviction"),
    Field("max_num_seqs", D.max_num_seqs, "int", minimum=1, maximum=4096, step=1, label="max_num_seqs"),
    Field(
        "max_tokens",
        D.max_num_batched_tokens,
        "int",
        minimum=1,
        maximum=65_536,
        step=256,
        label="tokens/step",
    ),
    Field("preemption", D.preemption_mode, "choice", ("recompute", "swap"), label="preemption mode"),
    Field(
        "swap_gib", D.swap_space_gib, "float", minimum=0.0, maximum=512.0, step=1.0, label="swap space, GiB"
    ),
    Field("measure", False, "bool", label="measure attention latency"),
    Field("budget_s", 2.0, "float", minimum=0.5, maximum=30.0, step=0.5, label="measurement budget, s"),
    # the block map's step: one of the run's sampled steps, else (auto, or a step the run did not sample) the middle
    Field("heatmap_step", None, "int", minimum=0, maximum=2**40, optional=True, label="block map step"),
]
FIELDS_BY_KEY = {field.key: field for field in FIELDS}
LOAD_KEYS = ("num_requests", "all_at_once", "rate", "max_num_seqs", "max_tokens")  # what `saturate` replaces


def url_params(values: dict[str, Any]) -> dict[str, str]:
    """The URL parameters of `values`: every field (a link does not depend on defaults), except those that do not
    matter for the choices made (fixed lengths for generated datasets, raw capacity unless raw, the GPU-memory
    load switch unless capacity comes from the GPU, the budget unless measuring)."""
    skip = set()
    if values["dataset"] != "fixed":
        skip |= {"fixed_prompt", "fixed_output"}
    if values["capacity"] != "raw":
        skip.add("raw_capacity")
    if values["capacity"] != "model":
        skip.add("saturate")
    if not values["measure"]:
        skip.add("budget_s")
    if not values["kv_offload_gib"]:
        skip.add("offload_policy")
    return {k: v for k, v in encode_params(values, FIELDS).items() if k not in skip}


def params_from(values: dict[str, Any]) -> SimulatorParams:
    """The page's inputs as `SimulatorParams`: an uploaded trace runs as "sharegpt" (the trace itself is passed
    beside the parameters), "all at t = 0" is an infinite rate, the hybrid switch the model's KV cache groups
    (`model_kv_groups`). Raises what `model_kv_groups` raises for an unknown model; core's other checks run when
    the comparison runs."""
    return SimulatorParams(
        dataset="sharegpt" if values["dataset"] == "trace" else values["dataset"],
        num_requests=int(values["num_requests"]),
        rate=math.inf if values["all_at_once"] else float(values["rate"]),
        seed=int(values["seed"]),
        n=int(values["n"]),
        prefix_len=int(values["prefix_len"]),
        prefix_fraction=float(values["prefix_fraction"]),
        prompt_len=int(values["fixed_prompt"]),
        output_len=int(values["fixed_output"]),
        model=values["model"],
        gpu=values["gpu"],
        capacity_source=values["capacity"],
        raw_capacity_tokens=int(values["raw_capacity"]),
        policies=tuple(values["policies"]),
        block_size=int(values["block_size"]),
        enable_prefix_caching=bool(values["prefix_caching"]),
        max_num_seqs=int(values["max_num_seqs"]),
        max_num_batched_tokens=int(values["max_tokens"]),
        preemption_mode=values["preemption"],
        swap_space_gib=float(values["swap_gib"]),
        overhead_ms=float(values["overhead_ms"]),
        kv_groups=model_kv_groups(values["model"]) if values["hybrid"] else None,
        kv_offload_gib=float(values["kv_offload_gib"]),
        offload_policy=values["offload_policy"],
    )
