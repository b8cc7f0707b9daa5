"""The capacity plan's inputs, declared once (`core.fields`): what `python -m core.planning` (the `plan` command,
`core.planning.commands.capacity`) takes as flags and the Capacity Planner page (`app_pages/planner.py`) as URL
fields and widgets. A deployment's inputs are the deployment's fields (`deployment_fields`: the same flag, bounds,
label and default), here with the Capacity Planner page's URL keys (each under a scenario's prefix, "a_" or "b_",
so shared links keep working); the plan's own inputs (the GPU count, block size, max_model_len, activation
reserve, a custom GPU's figures, a config.json and its parameter count) are declared here.
`core.planning.predict.inputs.plan_inputs_from` is the one converter to `PlanInputs`, checking every value by its
field, so a bad value has one message on the command line and on the page.

The hybrid KV cache manager's switch (`HYBRID_FIELD`: on by default, `--disable-hybrid-kv-cache-manager` turns it
off) is a scenario's input too. vLLM on a CPU (`plan --cpu-kv-cache-space-gib G`, the page's "vLLM on a CPU"
section) has `CPU_FIELDS`: the KV space, and the block size and dtypes with the CPU backend's choices (the same
flags as a GPU plan's: the command line takes one --block-size and --kv-dtype for both, the page has a CPU copy of
each, keyed cpu_block and cpu_kvdtype); `core.planning.predict.inputs.cpu_inputs_from` converts them.

The page-only inputs (an encoded config.json, checkpoint bytes from an uploaded index) stay the page's."""

from dataclasses import replace

from core.fields import InputField, field_named
from core.planning.memory.cpu_kv import (
    CPU_DEFAULT_BLOCK_SIZE,
    CPU_KV_CACHE_DTYPES,
    CPU_MODEL_DTYPES,
    MAX_KV_CACHE_SPACE_GIB,
)
from core.planning.memory.kv_accounting import BLOCK_SIZES, MAX_CONTEXT_TOKENS
from core.planning.predict.deployment_fields import (
    GPU_FIELD,
    GPU_MEMORY_FIELD,
    MODEL_FIELD,
    MOE_FIELDS,
    OFFLOAD_FIELDS,
    PARALLEL_FIELDS,
    SETTING_FIELDS,
)


def _on_planner(field: InputField, url_key: str) -> InputField:
    """`field` with the Capacity Planner page's URL key (its flag, bounds, label and default unchanged)."""
    return replace(field, url_key=url_key)


NUM_GPUS_FIELD = InputField(
    "num_gpus",
    "--num-gpus",
    "gpus",
    "int",
    None,
    "GPUs",
    "GPUs in all (default: tp x pp x data-parallel size, one replica)",
    minimum=1,
    maximum=4096,
    optional=True,
    step=1,
)
BLOCK_SIZE_FIELD = InputField(
    "block_size",
    "--block-size",
    "block",
    "choice",
    None,
    "Block size (tokens)",
    "tokens per block (default 16; 128 on a CPU, as vLLM's)",
    optional=True,
    choices=BLOCK_SIZES,
)
MAX_MODEL_LEN_FIELD = InputField(
    "max_model_len",
    "--max-model-len",
    "ctx",
    "int",
    None,
    "Context length: max_model_len (tokens)",
    "vLLM's --max-model-len (default: the model's max_position_embeddings)",
    unit="tokens",
    minimum=16,
    maximum=MAX_CONTEXT_TOKENS,
    optional=True,
    step=1024,
)
ACTIVATION_FIELD = InputField(
    "activation_reserve_gib",
    "--activation-reserve-gib",
    "act",
    "float",
    None,
    "Activation reserve per GPU (GiB)",
    "measured activation peak, GiB per GPU (default: the estimate)",
    unit="GiB",
    minimum=0,
    maximum=1024,
    optional=True,
    step=0.5,
)
CONTEXT_LEN_FIELD = InputField(
    "context_len",
    "--context-len",
    None,
    "int",
    None,
    "Request length (tokens)",
    "request length for the concurrency figure (default: max_model_len)",
    unit="tokens",
    minimum=1,
    maximum=MAX_CONTEXT_TOKENS,
    optional=True,
)
# a custom GPU (instead of --gpu's preset): its memory, bandwidth and dense bf16 compute
CUSTOM_GPU_FIELDS = (
    InputField(
        "gpu_memory_gib",
        "--gpu-memory-gib",
        "gpu_mem",
        "float",
        None,
        "Memory (GiB)",
        "custom GPU memory in GiB (overrides --gpu)",
        unit="GiB",
        minimum=0.5,
        maximum=4096,
        optional=True,
        step=1,
    ),
    InputField(
        "gpu_bandwidth_gbps",
        "--gpu-bandwidth-gbps",
        "gpu_bw",
        "float",
        None,
        "Bandwidth (GB/s)",
        "custom GPU bandwidth in GB/s",
        unit="GB/s",
        minimum=1,
        maximum=100_000,
        optional=True,
        step=100,
    ),
    InputField(
        "gpu_tflops",
        "--gpu-tflops",
        "gpu_tflops",
        "float",
        None,
        "bf16 TFLOP/s (dense)",
        "custom GPU dense bf16 TFLOP/s (default: unknown, the decode estimate memory-bound)",
        unit="TFLOP/s",
        minimum=0,
        maximum=100_000,
        optional=True,
        step=10,
    ),
)
# a model from a Hugging Face config.json (instead of --model's preset); the page carries the config itself
CONFIG_FIELDS = (
    InputField(
        "config",
        "--config",
        None,
        "str",
        None,
        help="path of a Hugging Face config.json (instead of --model)",
    ),
    InputField(
        "num_params",
        "--num-params",
        None,
        "float",
        None,
        "Parameters",
        "parameter count for --config (default: estimated)",
        minimum=0,
        exclusive_minimum=True,
        optional=True,
    ),
)

HYBRID_FIELD = InputField(
    "hybrid_kv_cache_manager",
    "--disable-hybrid-kv-cache-manager",
    "hybrid",
    "bool",
    True,
    "Hybrid KV cache manager",
    "count sliding-window and chunked layers as full attention, as vLLM does with this flag",
)

TP_FIELD, PP_FIELD = PARALLEL_FIELDS[:2]
KV_DTYPE_FIELD = field_named(SETTING_FIELDS, "kv_dtype")
OFFLOAD_FIELD = field_named(OFFLOAD_FIELDS, "kv_offload_gib")  # the host KV tier's GiB per replica
# the scenario's deployment, as the Capacity Planner page keys it (before its scenario's prefix), in its order
PLANNER_FIELDS = (
    _on_planner(MODEL_FIELD, "model"),
    _on_planner(GPU_FIELD, "gpu"),
    *CUSTOM_GPU_FIELDS,
    NUM_GPUS_FIELD,
    _on_planner(TP_FIELD, "tp"),
    _on_planner(PP_FIELD, "pp"),
    _on_planner(field_named(SETTING_FIELDS, "weight_dtype"), "wdtype"),
    _on_planner(KV_DTYPE_FIELD, "kvdtype"),
    _on_planner(GPU_MEMORY_FIELD, "util"),
    BLOCK_SIZE_FIELD,
    MAX_MODEL_LEN_FIELD,
    ACTIVATION_FIELD,
    _on_planner(field_named(SETTING_FIELDS, "max_num_seqs"), "seqs"),
    _on_planner(field_named(SETTING_FIELDS, "max_num_batched_tokens"), "mbt"),
    _on_planner(OFFLOAD_FIELD, "offload"),
    _on_planner(MOE_FIELDS[0], "dp"),
    _on_planner(MOE_FIELDS[1], "ep"),
    HYBRID_FIELD,
)
# every value `plan_inputs_from` checks by its field (the model and GPU: a preset or a spec, checked as such)
PLAN_CHECKED_FIELDS = (
    NUM_GPUS_FIELD,
    TP_FIELD,
    PP_FIELD,
    *(field_named(SETTING_FIELDS, name) for name in ("weight_dtype", "kv_dtype")),
    GPU_MEMORY_FIELD,
    BLOCK_SIZE_FIELD,
    MAX_MODEL_LEN_FIELD,
    ACTIVATION_FIELD,
    CONTEXT_LEN_FIELD,
    *(field_named(SETTING_FIELDS, name) for name in ("max_num_seqs", "max_num_batched_tokens")),
    *MOE_FIELDS,
    HYBRID_FIELD,
)

# vLLM on a CPU (`core.planning.memory.cpu_kv`): the KV space in whole GiB (VLLM_CPU_KVCACHE_SPACE; the command
# line plans a CPU when it is given), vllm serve's --dtype, and the CPU backend's block sizes and KV dtypes (the
# command line's --block-size and --kv-dtype, with the CPU's choices on the page); the page seeds 4 GiB.
CPU_SPACE_FIELD = InputField(
    "cpu_kv_cache_space_gib",
    "--cpu-kv-cache-space-gib",
    "cpu_gib",
    "int",
    None,
    "VLLM_CPU_KVCACHE_SPACE (GiB, whole)",
    "plan vLLM's CPU backend with VLLM_CPU_KVCACHE_SPACE=G (whole GiB) instead of a GPU",
    unit="GiB",
    minimum=1,
    maximum=MAX_KV_CACHE_SPACE_GIB,
    optional=True,
    step=1,
    metavar="G",
)
CPU_DTYPE_FIELD = InputField(
    "dtype",
    "--dtype",
    "cpu_dtype",
    "choice",
    "auto",
    "vllm serve --dtype",
    f"vllm serve --dtype: one of {', '.join(CPU_MODEL_DTYPES)} (the CPU plan's KV dtype auto)",
    choices=CPU_MODEL_DTYPES,
)
CPU_FIELDS = (
    CPU_SPACE_FIELD,
    replace(
        BLOCK_SIZE_FIELD,
        url_key="cpu_block",
        default=CPU_DEFAULT_BLOCK_SIZE,
        label="CPU block size (tokens; multiples of 32)",
        choices=(32, 64, 128, 256, 512),
    ),
    CPU_DTYPE_FIELD,
    replace(
        KV_DTYPE_FIELD,
        url_key="cpu_kvdtype",
        label="CPU KV cache dtype (--kv-cache-dtype)",
        choices=CPU_KV_CACHE_DTYPES,
    ),
)
