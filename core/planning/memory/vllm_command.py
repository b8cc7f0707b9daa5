"""The `vllm serve` command line that matches a capacity plan, with a comment for what vLLM cannot be told. The
`vllm bench serve` command that replays a load against that server is `core.planning.predict.vllm_bench`'s."""

from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from core.planning.catalog.models import ModelSpec
from core.planning.memory.kv_accounting import COMPUTE_DTYPE_SHORT, resolve_weight_dtype
from core.planning.memory.plan_types import CapacityPlan


def vllm_serve_command(capacity: CapacityPlan, model: ModelSpec | None = None) -> str:
    """The `vllm serve` flags matching the plan (`model` defaults to the plan's own). max-num-seqs is the plan's
    scheduler cap (vLLM's default 256 unless chosen), not the number of full-length requests that fit: with
    paging, shorter requests share the cache, and vLLM's scheduler admits them while blocks remain.
    Data parallel: a dense model's replicas and DP ranks are one `--data-parallel-size` (independent ranks in
    vLLM); a MoE model's DP ranks (data-parallel attention, the experts spread over them) are
    `--data-parallel-size data_parallel`, and its replicas separate servers (a comment says so), since one
    server's DP ranks share the experts. expert_parallel adds `--enable-expert-parallel`."""
    model = capacity.inputs.model if model is None else model
    kv_flag = {"fp8": "fp8"}.get(capacity.kv_dtype, "auto")
    comments = []
    checkpoint_weights = resolve_weight_dtype(model, "auto")
    quantize = None
    if capacity.weight_dtype != checkpoint_weights:
        if capacity.weight_dtype == "fp8":
            quantize = "--quantization fp8"  # vLLM quantizes a 16-bit checkpoint to FP8 at load time
        else:
            comments.append(
                f"# {capacity.weight_dtype} weights need a checkpoint stored that way (the preset's is "
                f"{checkpoint_weights}), e.g. a GPTQ/AWQ/W8A8 export of {model.name}"
            )
    if capacity.kv_dtype in ("int8", "fp4"):
        comments.append(
            f"# {capacity.kv_dtype} KV cache is not a vLLM --kv-cache-dtype choice: with auto, vLLM holds fewer "
            "tokens than this plan"
        )
    parts = [
        f"vllm serve {model.hf_repo or model.name}",
        f"--tensor-parallel-size {capacity.tensor_parallel}",
    ]
    if capacity.pipeline_parallel > 1:
        parts.append(f"--pipeline-parallel-size {capacity.pipeline_parallel}")
    data_parallel = capacity.data_parallel
    if model.is_moe and capacity.replicas > 1:
        # vLLM's --data-parallel-size would spread a MoE model's experts over the replicas too (one server)
        comments.append(
            f"# {capacity.replicas} replicas: run this command on each of {capacity.replicas} groups of "
            f"{capacity.num_gpus // capacity.replicas} GPUs (independent servers)"
        )
        if data_parallel > 1:
            parts.append(f"--data-parallel-size {data_parallel}")
    elif capacity.replicas * data_parallel > 1:
        parts.append(f"--data-parallel-size {capacity.replicas * data_parallel}")
    if capacity.expert_parallel:
        parts.append("--enable-expert-parallel")
    if (
        capacity.kv_dtype in ("fp16", "bf16")
        and capacity.kv_dtype != COMPUTE_DTYPE_SHORT[model.compute_dtype]
    ):
        parts.append(f"--dtype {'float16' if capacity.kv_dtype == 'fp16' else 'bfloat16'}")
    if quantize:
        parts.append(quantize)
    parts += [
        f"--kv-cache-dtype {kv_flag}",
        f"--gpu-memory-utilization {capacity.gpu_memory_utilization:g}",
        f"--max-model-len {capacity.max_fitting_model_len or capacity.max_model_len}",
        f"--block-size {capacity.block_size}",
        f"--max-num-seqs {capacity.max_num_seqs}",
    ]
    if capacity.max_num_batched_tokens != DEFAULT_MAX_NUM_BATCHED_TOKENS:
        parts.append(f"--max-num-batched-tokens {capacity.max_num_batched_tokens}")
    if not capacity.hybrid_kv_cache_manager:
        parts.append("--disable-hybrid-kv-cache-manager")
    return "\n".join([*comments, " \\\n  ".join(parts)])


def parallel_flags(
    tensor_parallel: int, pipeline_parallel: int = 1, data_parallel: int = 1, expert_parallel: bool = False
) -> str:
    """The `vllm serve` parallelism flags of one server: --tensor-parallel-size, --pipeline-parallel-size (when
    > 1), --data-parallel-size (when > 1) and --enable-expert-parallel (when set)."""
    parts = [f"--tensor-parallel-size {tensor_parallel}"]
    if pipeline_parallel > 1:
        parts.append(f"--pipeline-parallel-size {pipeline_parallel}")
    if data_parallel > 1:
        parts.append(f"--data-parallel-size {data_parallel}")
    if expert_parallel:
        parts.append("--enable-expert-parallel")
    return " ".join(parts)
