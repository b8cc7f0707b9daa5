"""A deployment's inputs, declared once (`core.fields`): the model and GPU presets, parallelism (TP, PP,
replicas, a MoE model's DP ranks and expert parallelism), vLLM's scheduler settings and dtypes, the engine
profile, the host KV tier and the router. `Deployment` checks its values by them, the command line's flags
(`predict`, `max-rate`; `plan` and the Capacity Planner page take them with their own keys:
`core.planning.predict.plan_fields`) and the SLO planner page's
URL fields and widgets are made from them, and `core.planning.predict.inputs.deployment_from` is the one
converter. Speculation's inputs are `core.planning.cost.speculative.SPECULATION_FIELDS`, a disaggregated
deployment's `core.planning.predict.disagg.DISAGG_FIELDS`."""

from core.fields import InputField
from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.fits.engine_profiles import DEFAULT_ENGINE, ENGINES
from core.planning.memory.kv_accounting import KV_DTYPES, MAX_CONTEXT_TOKENS, WEIGHT_DTYPES
from core.serving.host_offload import DEFAULT_OFFLOAD_BANDWIDTH
from core.serving.router import DEFAULT_ROUTING, ROUTING_POLICIES

MODEL_FIELD = InputField(
    "model",
    "--model",
    "model",
    "choice",
    None,
    "Model",
    f"preset: {', '.join(MODELS)}",
    choices=tuple(MODELS),
)
GPU_FIELD = InputField(
    "gpu",
    "--gpu",
    "gpu",
    "choice",
    None,
    "GPU",
    f"GPU preset: {', '.join(GPUS)}",
    choices=tuple(GPUS),
    required=True,
)
PARALLEL_FIELDS = (
    InputField("tp", "--tp", "tp", "int", 1, "TP", "tensor parallel size", minimum=1, maximum=64, step=1),
    InputField("pp", "--pp", "pp", "int", 1, "PP", "pipeline parallel size", minimum=1, maximum=64, step=1),
    InputField(
        "replicas",
        "--replicas",
        "replicas",
        "int",
        1,
        "Replicas",
        "identical vLLM servers that share the load, tp x pp x D GPUs each",
        minimum=1,
        maximum=1024,
        step=1,
    ),
)
MOE_FIELDS = (
    InputField(
        "data_parallel",
        "--data-parallel-size",
        None,
        "int",
        1,
        "Data-parallel ranks",
        "DP ranks of one vLLM server, each its own requests and KV cache (a MoE model: data-parallel "
        "attention, the routed experts spread over all tp x D GPUs)",
        minimum=1,
        maximum=1024,
        step=1,
        metavar="D",
    ),
    InputField(
        "expert_parallel",
        "--enable-expert-parallel",
        None,
        "bool",
        False,
        "Expert parallel",
        "MoE: whole routed experts per GPU over tp x D GPUs instead of every expert split over them",
    ),
)
SETTING_FIELDS = (
    InputField(
        "max_num_seqs",
        "--max-num-seqs",
        "seqs",
        "int",
        256,
        "max_num_seqs",
        "vLLM's --max-num-seqs: the most sequences in one step's batch",
        minimum=1,
        maximum=65_536,
        step=32,
    ),
    InputField(
        "max_num_batched_tokens",
        "--max-num-batched-tokens",
        None,
        "int",
        DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "max_num_batched_tokens",
        "tokens scheduled per step; sizes the sliding-window groups (async scheduling doubles them in flight)",
        minimum=1,
        maximum=MAX_CONTEXT_TOKENS,
        step=1024,
    ),
    InputField(
        "weight_dtype",
        "--weight-dtype",
        "weight_dtype",
        "choice",
        "auto",
        "Weight dtype",
        f"stored weights: one of {', '.join(WEIGHT_DTYPES)} (auto: the checkpoint's, fp8 for an FP8 one)",
        choices=WEIGHT_DTYPES,
    ),
    InputField(
        "kv_dtype",
        "--kv-dtype",
        "kv_dtype",
        "choice",
        "auto",
        "KV cache dtype",
        f"vLLM's --kv-cache-dtype: one of {', '.join(KV_DTYPES)} (auto: the model's compute dtype)",
        choices=KV_DTYPES,
    ),
    InputField(
        "engine",
        "--engine",
        "engine",
        "choice",
        DEFAULT_ENGINE,
        "Engine (step-time profile)",
        f"one of {', '.join(ENGINES)}",
        choices=tuple(ENGINES),
    ),
    InputField(
        "vllm_version",
        "--vllm-version",
        "vllm",
        "str",
        None,
        "vLLM release",
        "the vLLM release whose MoE kernels price the steps, e.g. 0.12.0 (vLLM 0.12 pads block-FP8 experts' "
        "DeepGEMM rows: docs/slo.md 2c); left out: today's vLLM",
        optional=True,
        metavar="X.Y.Z",
    ),
)
# a host-memory KV tier (vLLM's native offloading, core.serving.host_offload)
OFFLOAD_FIELDS = (
    InputField(
        "kv_offload_gib",
        "--kv-offload-gib",
        "offload",
        "float",
        0.0,
        "Host KV tier per replica, GiB (--kv-offload-gib; 0: none)",
        "GiB of host memory per replica for vLLM's native KV offloading (--kv-offloading-size)",
        minimum=0.0,
        maximum=4096.0,
        step=10.0,
    ),
    InputField(
        "offload_policy",
        "--offload-policy",
        "offload_policy",
        "choice",
        "lru",
        "Host tier eviction (--offload-policy)",
        "host tier eviction: lru or arc",
        choices=("lru", "arc"),
    ),
    InputField(
        "offload_bandwidth_gbps",
        "--offload-bandwidth-gbps",
        None,
        "float",
        DEFAULT_OFFLOAD_BANDWIDTH / 1e9,
        "Host to GPU bandwidth, GB/s per GPU",
        "host->GPU GB/s per GPU",
        minimum=0.0,
        exclusive_minimum=True,
    ),
)
# vLLM's --gpu-memory-utilization: the capacity command's flag (predict takes the default)
GPU_MEMORY_FIELD = InputField(
    "gpu_memory_utilization",
    "--gpu-memory-utilization",
    None,
    "float",
    0.9,
    "GPU memory utilization",
    "vLLM's --gpu-memory-utilization: the share of each GPU's memory for weights, activations and KV cache",
    minimum=0.01,
    maximum=1.0,
    step=0.01,
)
ROUTING_FIELD = InputField(
    "routing",
    "--routing",
    None,
    "choice",
    DEFAULT_ROUTING,
    "Replica router",
    f"replica router: one of {', '.join(ROUTING_POLICIES)}",
    choices=tuple(ROUTING_POLICIES),
)
# every flag of one aggregated deployment but --model (a preset or --config, `config_flags`) and speculation's,
# in the command line's order
DEPLOYMENT_FIELDS = (GPU_FIELD, *PARALLEL_FIELDS, *MOE_FIELDS, *SETTING_FIELDS)
# the values `Deployment` checks by their field (the others have their own checks: a preset or a spec object,
# max_num_batched_tokens at least max_num_seqs, the engine's profile, the host tier, the router)
CHECKED_FIELDS = (
    *PARALLEL_FIELDS,
    MOE_FIELDS[0],
    SETTING_FIELDS[0],
    *SETTING_FIELDS[2:4],
    GPU_MEMORY_FIELD,
    OFFLOAD_FIELDS[2],
)
