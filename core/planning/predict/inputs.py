"""One converter from a values dict (keyed by the input groups' field names, `core.fields`) to the planner's
domain types, used by the command line (`vars(args)`: `core.planning.commands.flags` makes each flag's dest its
field's name) and the pages (`core.page_models.slo_predict`) alike: `deployment_from` -> `Deployment`,
`disagg_from` -> `DisaggDeployment`, `load_from` -> `Load`, `speculation_from` -> `Speculation` (and back:
`speculation_words`), and for the capacity plan (the `plan` command and the Capacity Planner page)
`plan_inputs_from` -> `PlanInputs`, `custom_gpu_from` -> a custom `GPUSpec`, and for vLLM on a CPU
`cpu_inputs_from` -> `CpuKVInputs`. A key left out takes its field's default; each value is checked once, by the domain type's
constructor (or here, for the inputs no type holds), with the message that names its flag."""

from collections.abc import Mapping
from typing import Any

from core.errors import InvalidArgumentError
from core.fields import check_values, field_named
from core.planning.catalog.hardware import GPUSpec, get_gpu
from core.planning.catalog.models import get_model
from core.planning.cost.speculative import SPECULATION_FIELDS, Speculation, parse_acceptance
from core.planning.memory.cpu_kv import CPU_DEFAULT_BLOCK_SIZE, CpuKVInputs
from core.planning.memory.plan import PlanInputs
from core.planning.predict.deployment import Deployment
from core.planning.predict.deployment_fields import (
    DEPLOYMENT_FIELDS,
    MODEL_FIELD,
    OFFLOAD_FIELDS,
    ROUTING_FIELD,
    SETTING_FIELDS,
)
from core.planning.predict.disagg import DISAGG_FIELDS, DisaggDeployment
from core.planning.predict.load import LOAD_FIELDS, Load
from core.planning.predict.plan_fields import (
    CPU_DTYPE_FIELD,
    CPU_FIELDS,
    CPU_SPACE_FIELD,
    CUSTOM_GPU_FIELDS,
    HYBRID_FIELD,
    MAX_MODEL_LEN_FIELD,
    PLAN_CHECKED_FIELDS,
)


def _values(fields, values: Mapping[str, Any]) -> dict[str, Any]:
    return {field.name: values.get(field.name, field.default) for field in fields}


def load_from(values: Mapping[str, Any]) -> Load:
    """The `Load` of `values` (rate or concurrency, exactly one not None; the lengths; the levers)."""
    return Load(**_values(LOAD_FIELDS, values))


def speculation_from(values: Mapping[str, Any]) -> Speculation | None:
    """The `Speculation` of spec_tokens (None or 0: none), spec_acceptance ("a1,...,aK"), spec_method and
    draft_model (counted only for the "draft-model" method). Raises InvalidArgumentError naming the flag: an
    acceptance or a method without K, K without an acceptance, or what `Speculation` refuses."""
    v = _values(SPECULATION_FIELDS, values)
    if not v["spec_tokens"]:
        if v["spec_acceptance"] or v["spec_method"] != "ngram":
            raise InvalidArgumentError(
                "--spec-acceptance, --spec-method and --draft-model need --spec-tokens K"
            )
        return None
    if v["spec_acceptance"] is None:
        raise InvalidArgumentError(
            "--spec-tokens needs --spec-acceptance a1,...,aK (one rate per draft token)"
        )
    draft = v["draft_model"] if v["spec_method"] == "draft-model" else None
    rates = parse_acceptance(v["spec_acceptance"])
    return Speculation(v["spec_tokens"], rates, v["spec_method"], draft)


def speculation_words(speculation: Speculation | None) -> list[str]:
    """The command-line words of `speculation` (none for None): what `speculation_from` reads back."""
    if speculation is None:
        return []
    values = {
        "spec_tokens": speculation.num_tokens,
        "spec_acceptance": ",".join(repr(a) for a in speculation.acceptance),
        "spec_method": speculation.method,
        "draft_model": speculation.draft_model,
    }
    return [word for field in SPECULATION_FIELDS for word in field.words(values[field.name])]


MBT_FIELD = field_named(SETTING_FIELDS, "max_num_batched_tokens")
# every input of one aggregated deployment but speculation's (a values dict's keys; `deployment_from` reads them)
AGG_FIELDS = (MODEL_FIELD, *DEPLOYMENT_FIELDS, *OFFLOAD_FIELDS, ROUTING_FIELD)


def deployment_from(values: Mapping[str, Any]) -> Deployment:
    """The `Deployment` of `values`: the model (a preset slug or a ModelSpec), the GPU, parallelism, vLLM's
    settings, the host tier, the router and speculation (`speculation_from`)."""
    return Deployment(**_values(AGG_FIELDS, values), speculation=speculation_from(values))


def disagg_from(values: Mapping[str, Any]) -> DisaggDeployment:
    """The `DisaggDeployment` of `values`: each pool's workers and TP, the KV link ("auto": None, NVLink within
    8 GPUs), and the aggregated deployment's model, GPU and settings, which both pools share. Raises
    InvalidArgumentError naming the flag for a bad pool, or for what a disaggregated deployment does not take
    (speculation, PP, DP ranks, expert parallelism, a host tier: each pool is TP only)."""
    v = _values(AGG_FIELDS + SPECULATION_FIELDS + DISAGG_FIELDS, values)
    v = check_values(v, DISAGG_FIELDS)
    if (
        v["spec_tokens"]
        or v["pp"] != 1
        or v["data_parallel"] != 1
        or v["expert_parallel"]
        or v["kv_offload_gib"]
    ):
        raise InvalidArgumentError(
            "--disagg takes neither --spec-tokens, --pp, --data-parallel-size, --enable-expert-parallel nor "
            "--kv-offload-gib (each pool is tp-only): leave them at 0 / 1 / off"
        )
    shared = ("max_num_seqs", "max_num_batched_tokens", "weight_dtype", "kv_dtype", "engine", "vllm_version")
    return DisaggDeployment.of(
        v["model"],
        v["gpu"],
        (v["prefill_workers"], v["prefill_tp"]),
        (v["decode_workers"], v["decode_tp"]),
        None if v["kv_link"] == "auto" else v["kv_link"],
        **{name: v[name] for name in shared},
    )


def plan_inputs_from(values: Mapping[str, Any]) -> PlanInputs:
    """The `PlanInputs` of `values`: the model (a preset slug or a ModelSpec), the GPU (a preset slug or a
    GPUSpec), and the plan's settings (`core.planning.predict.plan_fields.PLAN_CHECKED_FIELDS`, each checked by
    its field: the message names its flag; a key left out takes its field's default, block_size None: 16),
    activation_reserve_gib in GiB (None: the estimate) and hybrid_kv_cache_manager (`HYBRID_FIELD`, default on)."""
    v = check_values(_values(PLAN_CHECKED_FIELDS, values), PLAN_CHECKED_FIELDS)
    model, gpu = values["model"], values["gpu"]
    gib = v.pop("activation_reserve_gib")
    block_size = v.pop("block_size")
    return PlanInputs(
        model=get_model(model) if isinstance(model, str) else model,
        gpu=get_gpu(gpu) if isinstance(gpu, str) else gpu,
        tensor_parallel=v.pop("tp"),
        pipeline_parallel=v.pop("pp"),
        activation_reserve=None if gib is None else int(gib * 1024**3),
        block_size=16 if block_size is None else block_size,
        **v,
    )


def cpu_inputs_from(values: Mapping[str, Any]) -> CpuKVInputs:
    """The `CpuKVInputs` of `values` (vLLM on a CPU, `plan --cpu-kv-cache-space-gib` and the Capacity Planner
    page's CPU section): the model (a ModelSpec, or a preset slug), the KV space in whole GiB, block_size (None:
    the CPU's default, 128), dtype and kv_dtype (`CPU_FIELDS`), max_model_len (None: the model's),
    max_num_batched_tokens, hybrid_kv_cache_manager and model_path (what `vllm serve` is given; None: the
    model's repository). The KV space and --dtype are checked by their fields (the message names the flag), the
    rest by `plan_cpu_kv` with vLLM's CPU rules."""
    v = _values((*CPU_FIELDS, MAX_MODEL_LEN_FIELD, MBT_FIELD, HYBRID_FIELD), values)
    gib = CPU_SPACE_FIELD.check(v["cpu_kv_cache_space_gib"])
    if gib is None:
        raise InvalidArgumentError(f"{CPU_SPACE_FIELD.flag} is needed for a CPU plan")
    model = values["model"]
    return CpuKVInputs.from_space_gib(
        get_model(model) if isinstance(model, str) else model,
        gib,
        block_size=CPU_DEFAULT_BLOCK_SIZE if v["block_size"] is None else v["block_size"],
        dtype=CPU_DTYPE_FIELD.check(v["dtype"]),
        kv_cache_dtype=v["kv_dtype"],
        max_model_len=v["max_model_len"],
        max_num_batched_tokens=v["max_num_batched_tokens"],
        hybrid_kv_cache_manager=v["hybrid_kv_cache_manager"],
        model_path=values.get("model_path"),
    )


def custom_gpu_from(values: Mapping[str, Any]) -> GPUSpec:
    """The custom GPU of gpu_memory_gib, gpu_bandwidth_gbps and gpu_tflops (optional;
    `core.planning.predict.plan_fields.CUSTOM_GPU_FIELDS`), checked by `GPUSpec.custom` (positive, finite, not
    absurd: the same message for a flag and a page). Raises InvalidArgumentError, also for a memory without a
    bandwidth."""
    v = _values(CUSTOM_GPU_FIELDS, values)
    if v["gpu_bandwidth_gbps"] is None or v["gpu_memory_gib"] is None:
        raise InvalidArgumentError("--gpu-memory-gib needs --gpu-bandwidth-gbps too")
    return GPUSpec.custom("custom GPU", v["gpu_memory_gib"], v["gpu_bandwidth_gbps"], v["gpu_tflops"])
