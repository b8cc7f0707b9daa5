"""The capacity plan's two types: `PlanInputs` (the arguments of one plan, as given) and `CapacityPlan` (what fits
on one model replica). `core.planning.memory.plan` makes them, and re-exports both."""

from dataclasses import dataclass, field, fields
from typing import Any

from core.kv.layout import DEFAULT_MAX_NUM_BATCHED_TOKENS, KVCacheLayout
from core.planning.catalog.hardware import GPUSpec
from core.planning.catalog.models import ModelSpec
from core.planning.memory.kv_accounting import DEFAULT_MAX_NUM_SEQS


@dataclass(frozen=True)
class PlanInputs:
    """The arguments of one plan, exactly as given (None means the default rule, see `plan`).

    Frozen, so a variant is `dataclasses.replace(inputs, gpu=other)`; `plan_from` validates it.
    """

    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_model_len: int | None = None
    activation_reserve: int | None = None
    context_len: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    hybrid_kv_cache_manager: bool = True
    data_parallel: int = 1  # DP ranks of one vLLM server (--data-parallel-size); MoE: data-parallel attention
    expert_parallel: bool = (
        False  # --enable-expert-parallel (MoE): whole experts per GPU over tp x data_parallel
    )


@dataclass(frozen=True)
class CapacityPlan:
    """What fits on one model replica (tp x pp GPUs); per-GPU figures are for the most loaded GPU.

    Bytes are bytes; `*_tokens` are token slots; `num_blocks` counts blocks of `block_size` slots.
    kv_budget_bytes = gpu_memory_bytes x gpu_memory_utilization - weights_bytes - activation_bytes
    (negative when the model does not fit at all); num_blocks = max(0, kv_budget_bytes // block_bytes);
    kv_tokens = num_blocks x block_size; max_concurrency = num_blocks // ceil(context_len / block_size)
    (requests of `context_len` tokens held at once by one replica). For a hybrid model these follow
    `kv_layout` (vLLM V1's KV cache groups): block_bytes = group_size x page, a request's blocks are summed
    over the groups, kv_tokens = int(vllm_max_concurrency x max_model_len); replicas = num_gpus // (tp x pp x
    data_parallel) copies of the model serve in parallel, each a server of data_parallel DP ranks (tp x pp GPUs
    each, its own scheduler and KV cache: every KV figure is per DP rank; for a MoE model the routed experts
    are spread over a server's tp x data_parallel GPUs, with expert_parallel whole experts per GPU:
    `core.planning.memory.kv_accounting`); max_concurrency_total = max_concurrency x data_parallel x replicas.
    Decode figures are estimates from a roofline.
    `inputs` are the arguments the plan was made from (not part of `to_dict` or equality).
    """

    inputs: PlanInputs = field(repr=False, compare=False)
    model: str
    gpu: str
    num_gpus: int
    tensor_parallel: int
    pipeline_parallel: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    gpu_memory_utilization: float
    block_size: int
    max_model_len: int
    context_len: int
    max_num_seqs: int
    gpu_memory_bytes: int
    usable_bytes: int
    weights_bytes: int
    activation_bytes: int
    activation_estimated: bool
    kv_budget_bytes: int
    kv_bytes_per_token: int
    block_bytes: int
    num_blocks: int
    kv_tokens: int
    per_request_bytes: int
    max_concurrency: int
    max_concurrency_total: int
    vllm_max_concurrency: float
    fits: bool
    verdict: str
    max_fitting_model_len: int | None
    min_tensor_parallel: int | None
    decode_batch: int
    decode_step_s: float | None
    decode_tokens_per_s: float | None
    decode_bound: str | None
    notes: tuple[str, ...] = ()
    vllm_command: str = ""
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    hybrid_kv_cache_manager: bool = True
    kv_layout: KVCacheLayout | None = None  # the layout behind num_blocks, kv_tokens and the concurrency
    data_parallel: int = 1
    expert_parallel: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Every figure as plain JSON-able values (`inputs` left out; `notes` as a list)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "inputs"}
        data["notes"] = list(self.notes)
        if self.kv_layout is not None:
            data["kv_layout"] = self.kv_layout.to_dict()
        return data
