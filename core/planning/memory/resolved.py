"""One capacity plan's deployment, resolved: the inputs validated, every default rule applied, dtypes resolved
and the model's KV layers (`KVLayers`) and per-layer KV cache specs derived once.

`resolve_deployment(PlanInputs)` makes it; `core.planning.memory.plan` asks it every memory question (weights, KV
bytes per token, the KV cache layout, the KV a decode step reads, the decode roofline), and none of those
answers derives the model's layer specs again. Not to be confused with `core.planning.predict.deployment.Deployment`,
the steady-state predictor's description of a serving setup (slugs, engine, replicas).
"""

from dataclasses import dataclass

from core.common import cdiv, check_float, check_int
from core.errors import InvalidArgumentError
from core.kv.hf_config import KVLayers
from core.kv.layout import (
    KVCacheLayout,
    ModelKVSpecs,
    kv_read_bytes_of,
    layout_notes,
    layout_of,
    model_kv_specs,
)
from core.planning.catalog.hardware import GPUSpec
from core.planning.catalog.models import ModelSpec
from core.planning.memory.decode_roofline import decode_step_estimate
from core.planning.memory.kv_accounting import (
    BLOCK_SIZES,
    MAX_CONTEXT_TOKENS,
    MAX_GPUS,
    check_moe_parallel,
    check_parallelism,
    estimate_activation_bytes,
    kv_bytes_per_token,
    resolve_kv_dtype,
    resolve_weight_dtype,
    weight_bytes_per_gpu,
    weight_split_per_gpu,
)
from core.planning.memory.plan_types import PlanInputs

MAX_ACTIVATION_BYTES = 1024 * 1024**4  # 1 PiB: refuse absurd activation reserves
MAX_NUM_SEQS = 65_536


@dataclass(frozen=True)
class ResolvedDeployment:
    """The deployment one capacity plan is for, checked and complete (no None left, dtypes concrete).

    Invariants: num_gpus = replicas x data_parallel x tensor_parallel x pipeline_parallel (data_parallel: DP ranks
    of one server, each its own KV cache; expert_parallel: --enable-expert-parallel; `kv_accounting`); context_len <= max_model_len <=
    model.max_position_embeddings; weight_dtype and kv_dtype are short dtype names ("bf16", "fp8", ...);
    activation_bytes is the given reserve or `estimate_activation_bytes` (activation_estimated says which);
    hybrid is --enable/--disable-hybrid-kv-cache-manager. kv_layers is `model.kv_layers` and kv_specs its
    layer specs, KV cache groups and pipeline stages on one tensor-parallel rank (`model_kv_specs` at
    `block_size`, `kv_dtype`, `max_model_len`, tp, pp and `hybrid`): derived once, in `resolve_deployment`,
    and read by every method below.
    """

    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int
    tensor_parallel: int
    pipeline_parallel: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    utilization: float
    block_size: int
    max_model_len: int
    context_len: int
    max_num_seqs: int
    activation_bytes: int
    activation_estimated: bool
    max_num_batched_tokens: int
    hybrid: bool
    kv_layers: KVLayers
    kv_specs: ModelKVSpecs
    data_parallel: int = 1
    expert_parallel: bool = False

    def weight_bytes(self) -> int:
        """Weight bytes on the most loaded GPU (`weight_bytes_per_gpu`, with the DP ranks and EP)."""
        return weight_bytes_per_gpu(
            self.model,
            self.weight_dtype,
            self.tensor_parallel,
            self.pipeline_parallel,
            self.data_parallel,
            self.expert_parallel,
        )

    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies on the most loaded GPU (`kv_bytes_per_token`)."""
        return kv_bytes_per_token(self.model, self.kv_dtype, self.tensor_parallel, self.pipeline_parallel)

    def kv_layout(self, available_bytes: int) -> KVCacheLayout:
        """vLLM V1's KV cache layout in `available_bytes` (>= 0) per GPU, from the specs held here
        (`layout_of`; the same as `kv_cache_layout` of the model)."""
        return layout_of(
            self.kv_specs,
            available_bytes,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )

    def layout_notes(self, layout: KVCacheLayout) -> list[str]:
        """Notes on the model's KV cache groups in `layout` (`layout_notes`)."""
        return layout_notes(self.kv_layers, layout)

    def kv_read_bytes_per_sequence(self, context_len: int) -> int:
        """KV bytes one decode step reads for one sequence of `context_len` tokens on the most loaded GPU (the
        same as `kv_read_bytes_per_sequence` of the model), from the specs held here."""
        return kv_read_bytes_of(self.kv_specs, context_len)

    def decode_step(self, batch: int) -> tuple[float, str]:
        """(seconds per decode step, "memory" or "compute") for `batch` requests of `context_len` tokens on one DP
        rank: the decode roofline (`decode_step_estimate`) with the KV read from the specs held here. With DP
        ranks or EP the weights read are this GPU's (`weight_bytes`): its dense part, and its experts that the
        batches of all data_parallel ranks (batch each, in lockstep) route to."""
        weights_read = None
        if self.data_parallel > 1 or self.expert_parallel:
            weights_read = self._weights_read(batch)
        return decode_step_estimate(
            self.model,
            self.gpu,
            batch,
            self.context_len,
            self.weight_dtype,
            self.kv_dtype,
            self.tensor_parallel,
            self.pipeline_parallel,
            kv_read_bytes=self.kv_read_bytes_per_sequence(self.context_len),
            weights_read_bytes=weights_read,
        )

    def _weights_read(self, batch: int) -> float:
        """Weight bytes this GPU reads in one decode step of `batch` sequences per DP rank, over its pp
        micro-batches (`decode_step_estimate`): the dense part each time, and the share of its experts that at
        least one of the data_parallel ranks' tokens routes to, 1 - (1 - k / E)^(data_parallel x micro-batch)."""
        pp, model = self.pipeline_parallel, self.model
        dense, experts = weight_split_per_gpu(
            model, self.weight_dtype, self.tensor_parallel, pp, self.data_parallel, self.expert_parallel
        )
        if experts:
            micro = max(1, cdiv(batch, pp))
            experts *= 1 - (1 - model.num_experts_per_tok / model.num_experts) ** (micro * self.data_parallel)
        return float(pp * (dense + experts))


def checked_max_model_len(model, max_model_len: int | None) -> int:
    """`max_model_len` (default the model's max_position_embeddings), checked as vLLM checks it at start.
    Raises InvalidArgumentError (not an int >= 1, or over the model's positions: vLLM refuses it)."""
    max_len = model.max_position_embeddings if max_model_len is None else max_model_len
    max_len = check_int(max_len, "max_model_len", minimum=1, maximum=MAX_CONTEXT_TOKENS)
    if max_len > model.max_position_embeddings:
        raise InvalidArgumentError(
            f"max_model_len {max_len:,} exceeds {model.name}'s max_position_embeddings "
            f"{model.max_position_embeddings:,} (vLLM refuses it)"
        )
    return max_len


def resolve_deployment(inputs: PlanInputs) -> ResolvedDeployment:
    """`inputs` checked (raising `InvalidArgumentError` that says what is allowed), the defaults applied (see
    `core.planning.memory.plan.plan`) and the model's layer specs, groups and stages derived (`model_kv_specs`):
    the one place a plan derives them. Raises `InvalidArgumentError` also when hybrid_kv_cache_manager is
    False for layers vLLM cannot unify (Mamba layers)."""
    model = inputs.model
    tp = check_int(inputs.tensor_parallel, "tensor_parallel", minimum=1)
    pp = check_int(inputs.pipeline_parallel, "pipeline_parallel", minimum=1)
    check_parallelism(model, tp, pp)
    dp, ep = inputs.data_parallel, inputs.expert_parallel
    check_moe_parallel(model, tp, dp, ep)
    per_replica = tp * pp * dp
    num_gpus = per_replica if inputs.num_gpus is None else inputs.num_gpus
    num_gpus = check_int(num_gpus, "num_gpus", minimum=1, maximum=MAX_GPUS)
    if num_gpus % per_replica:
        raise InvalidArgumentError(
            f"num_gpus={num_gpus} is not a multiple of tensor_parallel x pipeline_parallel x data_parallel = "
            f"{per_replica}"
        )
    utilization = check_float(
        inputs.gpu_memory_utilization, "gpu_memory_utilization", minimum=0.01, maximum=1.0
    )
    if inputs.block_size not in BLOCK_SIZES:
        raise InvalidArgumentError(
            f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))} tokens, got {inputs.block_size!r}"
        )
    max_len = checked_max_model_len(model, inputs.max_model_len)
    context_len = max_len if inputs.context_len is None else inputs.context_len
    context_len = check_int(context_len, "context_len", minimum=1, maximum=max_len)
    max_num_seqs = check_int(inputs.max_num_seqs, "max_num_seqs", minimum=1, maximum=MAX_NUM_SEQS)
    batched = check_int(
        inputs.max_num_batched_tokens, "max_num_batched_tokens", minimum=1, maximum=MAX_CONTEXT_TOKENS
    )
    weight_dtype = resolve_weight_dtype(model, inputs.weight_dtype)
    kv_dtype = resolve_kv_dtype(model, inputs.kv_dtype)
    estimated = inputs.activation_reserve is None
    reserve = (
        estimate_activation_bytes(model, tp, batched, max_num_seqs)
        if estimated
        else inputs.activation_reserve
    )
    reserve = check_int(reserve, "activation_reserve (bytes)", minimum=0, maximum=MAX_ACTIVATION_BYTES)
    if not isinstance(inputs.hybrid_kv_cache_manager, bool):
        raise InvalidArgumentError(
            f"hybrid_kv_cache_manager must be True or False, got {inputs.hybrid_kv_cache_manager!r}"
        )
    layers = model.kv_layers
    kv_specs = model_kv_specs(
        layers, inputs.block_size, kv_dtype, (tp, pp), max_len, inputs.hybrid_kv_cache_manager
    )
    return ResolvedDeployment(
        model,
        inputs.gpu,
        num_gpus,
        tp,
        pp,
        num_gpus // per_replica,
        weight_dtype,
        kv_dtype,
        utilization,
        inputs.block_size,
        max_len,
        context_len,
        max_num_seqs,
        reserve,
        estimated,
        batched,
        inputs.hybrid_kv_cache_manager,
        layers,
        kv_specs,
        dp,
        ep,
    )
