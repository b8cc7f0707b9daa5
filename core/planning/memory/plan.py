"""The capacity plan: what fits on one model replica, its verdict, notes, decode roofline and `vllm serve` flags.

`plan(model, gpu, ...)` (or `plan_from(PlanInputs(...))`) resolves the inputs into one `ResolvedDeployment`
(`core.planning.memory.resolved`: checked, defaults applied, the model's KV layer specs derived once), does vLLM's
memory arithmetic, decides whether the deployment fits and writes notes about what the figures leave out; its
types live in `core.planning.memory.plan_types`, the decode roofline in `core.planning.memory.decode_roofline` and the
matching `vllm serve` command in `core.planning.memory.vllm_command` (all re-exported here). Each `CapacityPlan`
keeps the inputs it was planned from (`plan.inputs`), so a variant is
`plan_from(dataclasses.replace(plan.inputs, gpu=other))`. Every number is per GPU (the most loaded one) unless
its name says otherwise.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from core.common import check_int
from core.errors import InvalidArgumentError
from core.kv.layout import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KVCacheLayout,
    longest_fitting_len,
    request_blocks,
)
from core.planning.catalog.hardware import GPUSpec
from core.planning.catalog.models import ModelSpec
from core.planning.catalog.weights import uses_group_quantization
from core.planning.memory.decode_roofline import decode_step_estimate, weight_bytes_read_per_step
from core.planning.memory.kv_accounting import (
    DEFAULT_MAX_NUM_SEQS,
    DTYPE_BITS,
    MAX_CONTEXT_TOKENS,
    VLLM_BLOCK_SIZES,
    blocks_for_tokens,
    check_parallelism,
    resolve_weight_dtype,
)
from core.planning.memory.plan_types import CapacityPlan, PlanInputs
from core.planning.memory.resolved import ResolvedDeployment, resolve_deployment
from core.planning.memory.vllm_command import vllm_serve_command

__all__ = [
    "CapacityPlan",
    "PlanInputs",
    "ReplicaMemory",
    "concurrency_vs_context",
    "decode_step_estimate",
    "plan",
    "plan_from",
    "replica_memory",
    "vllm_serve_command",
    "weight_bytes_read_per_step",
]

GiB = 1024**3


class _Memory(NamedTuple):
    """vLLM's memory arithmetic for one GPU (bytes, blocks, tokens, requests)."""

    usable: int
    weights: int
    kv_budget: int
    per_token: int
    block_bytes: int
    num_blocks: int
    kv_tokens: int
    context_blocks: int
    max_concurrency: int
    vllm_concurrency: float
    layout: KVCacheLayout


class _Verdict(NamedTuple):
    fits: bool
    text: str
    max_fitting_model_len: int | None
    min_tensor_parallel: int | None


def _arithmetic(c: ResolvedDeployment) -> _Memory:
    """usable = memory x utilization; KV budget = usable - weights - activations; blocks and requests in it."""
    usable = int(c.gpu.memory_bytes * c.utilization)
    weights = c.weight_bytes()
    kv_budget = usable - weights - c.activation_bytes
    per_token = c.kv_bytes_per_token()
    layout = c.kv_layout(max(0, kv_budget))
    num_blocks = layout.num_blocks
    # One attention group: every slot is a token slot; otherwise the tokens of max_model_len requests that fit.
    single = len(layout.groups) == 1 and layout.groups[0].kind != "mamba"
    kv_tokens = num_blocks * layout.block_size if single else layout.kv_tokens
    context_blocks = request_blocks(layout, c.context_len)
    return _Memory(
        usable,
        weights,
        kv_budget,
        per_token,
        layout.block_bytes,
        num_blocks,
        kv_tokens,
        context_blocks,
        num_blocks // context_blocks,
        layout.max_concurrency,
        layout,
    )


def _fit_tp(model: ModelSpec, gpu: GPUSpec, utilization: float, bits: int, pp: int) -> int | None:
    """Smallest valid tensor-parallel size whose weights alone fit in the usable memory (None if none <= 64)."""
    for tp in (1, 2, 4, 8, 16, 32, 64):
        try:
            check_parallelism(model, tp, pp)
        except InvalidArgumentError:
            continue
        if model.num_params * bits / 8 / tp / pp < gpu.memory_bytes * utilization * 0.95:
            return tp
    return None


def _verdict(c: ResolvedDeployment, m: _Memory) -> _Verdict:
    """Fits, or why not: no KV budget at all (with a TP size whose weights would fit), or one `max_model_len`
    request needs more blocks than the budget holds (with the longest max_model_len that would fit)."""
    if m.kv_budget <= 0 or m.num_blocks == 0:
        min_tp = _fit_tp(c.model, c.gpu, c.utilization, DTYPE_BITS[c.weight_dtype], c.pipeline_parallel)
        text = (
            f"Does not fit: weights {m.weights / GiB:,.1f} GiB + activations {c.activation_bytes / GiB:,.1f} GiB "
            f"per GPU leave no room for the KV cache in {m.usable / GiB:,.1f} GiB usable "
            f"({c.utilization:.0%} of {c.gpu.memory_bytes / GiB:,.1f} GiB)."
        )
        if min_tp is not None and min_tp > c.tensor_parallel:
            text += f" Weights alone would fit with tensor_parallel >= {min_tp}."
        elif c.weight_dtype not in ("fp8", "int8", "int4"):
            text += " Try more GPUs or fp8 weights."
        return _Verdict(False, text, None, min_tp)
    needed = m.layout.blocks_per_request
    if needed > m.num_blocks:
        max_fit = longest_fitting_len(m.layout, c.model.max_position_embeddings)
        text = (
            f"Does not fit at max_model_len={c.max_model_len:,}: one request needs {needed:,} blocks but the KV "
            f"budget holds {m.num_blocks:,} ({m.num_blocks * m.layout.block_size:,} tokens). The largest "
            f"max_model_len that fits is {max_fit:,}."
        )
        return _Verdict(False, text, max_fit, None)
    text = (
        f"Fits: {m.kv_tokens:,} KV tokens ({m.num_blocks:,} blocks) per replica; {m.max_concurrency:,} requests "
        f"of {c.context_len:,} tokens at once"
    )
    ranks = c.replicas * c.data_parallel
    if c.data_parallel > 1:
        text += (
            f" per DP rank (each its own KV cache), {m.max_concurrency * ranks:,} over {c.data_parallel} DP "
            f"rank(s) x {c.replicas} replica(s)."
        )
    elif c.replicas > 1:
        text += f" per replica, {m.max_concurrency * c.replicas:,} over {c.replicas} replicas."
    else:
        text += "."
    return _Verdict(True, text, None, None)


def _notes(c: ResolvedDeployment, m: _Memory, fits: bool) -> tuple[str, ...]:
    """What the figures leave out or assume, one sentence each."""
    notes = []
    if c.activation_estimated:
        notes.append(
            "Activation reserve is an estimate (token budget x hidden/MLP width, fp32 logits, 1 GiB non-torch); "
            "vLLM measures it at start-up."
        )
    notes += c.layout_notes(m.layout)
    model = c.model
    if model.checkpoint_bytes is not None and c.weight_dtype == resolve_weight_dtype(model, "auto"):
        notes.append(f"Weights: the checkpoint's exact {model.checkpoint_bytes:,} B (safetensors index).")
    elif uses_group_quantization(model) and c.weight_dtype == resolve_weight_dtype(model, "auto"):
        notes.append(
            f"Weights are an estimate from quantization_config ({model.quantization}: packed 4-bit weights with "
            "group scales, embedding, LM head and unquantized modules in 16-bit); a safetensors index gives "
            "the exact size."
        )
    if c.data_parallel > 1 and model.is_moe:
        notes.append(
            f"Data-parallel attention: each of the {c.data_parallel} DP ranks keeps the attention weights (split "
            f"over its tp {c.tensor_parallel}), its own requests and its own KV cache; the routed experts are "
            f"spread over all {c.tensor_parallel * c.data_parallel} GPUs of the server."
        )
    if c.expert_parallel:
        per_gpu = -(-model.num_experts // (c.tensor_parallel * c.data_parallel))
        notes.append(
            f"Expert parallel: each GPU holds {per_gpu} whole routed experts of {model.num_experts} (the most "
            "loaded GPU's share), not a slice of every expert."
        )
    if c.kv_dtype in ("int8", "fp4"):
        notes.append(f"{c.kv_dtype} is not a vLLM --kv-cache-dtype choice; it is shown for comparison.")
    if c.block_size not in VLLM_BLOCK_SIZES:
        notes.append(f"block_size {c.block_size} is not a vLLM --block-size choice ({VLLM_BLOCK_SIZES}).")
    if fits:
        notes.append(
            "Decode throughput is an estimate: a roofline upper bound (weights + KV read per step over memory "
            "bandwidth, or FLOPs over peak), with no scheduling, sampling or kernel overheads."
        )
    return tuple(notes)


def plan(
    model: ModelSpec,
    gpu: GPUSpec,
    num_gpus: int | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    weight_dtype: str = "auto",
    kv_dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    max_model_len: int | None = None,
    activation_reserve: int | None = None,
    context_len: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    hybrid_kv_cache_manager: bool = True,
    data_parallel: int = 1,
    expert_parallel: bool = False,
) -> CapacityPlan:
    """Plan a deployment of `model` on `num_gpus` x `gpu` (default tp x pp) with vLLM's memory rules.

    max_model_len: the longest request (tokens), default the model's max_position_embeddings.
    context_len: the request length the concurrency figures are for (default max_model_len).
    activation_reserve: bytes per GPU for the profiled activation peak (default: `estimate_activation_bytes`).
    The plan does not fit when the weights and activations leave no KV budget (then `min_tensor_parallel`
    suggests a TP size whose weights fit), or when one `max_model_len` request needs more blocks than the
    budget holds (vLLM refuses to start; `max_fitting_model_len` is then the longest that would).
    Blocks, tokens and concurrency follow vLLM V1's KV cache layout (`kv_cache_layout`): for a hybrid model
    (sliding-window, chunked-local or Mamba layers) one block spans a group of layers and a request's blocks
    are summed over the groups; max_num_batched_tokens bounds the window groups and
    `hybrid_kv_cache_manager=False` counts windowed layers as full attention (--disable-hybrid-kv-cache-manager).
    data_parallel: DP ranks per server (--data-parallel-size; for a MoE model data-parallel attention, each rank
    its own KV cache, the experts spread over all ranks); expert_parallel: --enable-expert-parallel
    (`core.planning.memory.kv_accounting`). Raises `InvalidArgumentError` for bad arguments (message says what is allowed).
    """
    return plan_from(
        PlanInputs(
            model,
            gpu,
            num_gpus,
            tensor_parallel,
            pipeline_parallel,
            weight_dtype,
            kv_dtype,
            gpu_memory_utilization,
            block_size,
            max_model_len,
            activation_reserve,
            context_len,
            max_num_seqs,
            max_num_batched_tokens,
            hybrid_kv_cache_manager,
            data_parallel,
            expert_parallel,
        )
    )


def plan_from(inputs: PlanInputs) -> CapacityPlan:
    """The plan for `inputs` (see `plan` for the rules); the result keeps `inputs` as `.inputs`."""
    c = resolve_deployment(inputs)
    m = _arithmetic(c)
    verdict = _verdict(c, m)
    decode_batch = max(1, min(m.max_concurrency, c.max_num_seqs)) if verdict.fits else 0
    step = tokens_per_s = bound = None
    if verdict.fits:
        step, bound = c.decode_step(decode_batch)
        tokens_per_s = decode_batch / step * c.replicas * c.data_parallel
    figures = {
        "inputs": inputs,
        "model": c.model.name,
        "gpu": c.gpu.name,
        "num_gpus": c.num_gpus,
        "tensor_parallel": c.tensor_parallel,
        "pipeline_parallel": c.pipeline_parallel,
        "replicas": c.replicas,
        "weight_dtype": c.weight_dtype,
        "kv_dtype": c.kv_dtype,
        "gpu_memory_utilization": c.utilization,
        "block_size": c.block_size,
        "max_model_len": c.max_model_len,
        "context_len": c.context_len,
        "max_num_seqs": c.max_num_seqs,
        "gpu_memory_bytes": c.gpu.memory_bytes,
        "usable_bytes": m.usable,
        "weights_bytes": m.weights,
        "activation_bytes": c.activation_bytes,
        "activation_estimated": c.activation_estimated,
        "kv_budget_bytes": m.kv_budget,
        "kv_bytes_per_token": m.per_token,
        "block_bytes": m.block_bytes,
        "num_blocks": m.num_blocks,
        "kv_tokens": m.kv_tokens,
        "per_request_bytes": m.context_blocks * m.block_bytes,
        "max_concurrency": m.max_concurrency,
        "max_concurrency_total": m.max_concurrency * c.replicas * c.data_parallel,
        "vllm_max_concurrency": m.vllm_concurrency,
        "fits": verdict.fits,
        "verdict": verdict.text,
        "max_fitting_model_len": verdict.max_fitting_model_len,
        "min_tensor_parallel": verdict.min_tensor_parallel,
        "decode_batch": decode_batch,
        "decode_step_s": step,
        "decode_tokens_per_s": tokens_per_s,
        "decode_bound": bound,
        "notes": _notes(c, m, verdict.fits),
        "max_num_batched_tokens": c.max_num_batched_tokens,
        "hybrid_kv_cache_manager": c.hybrid,
        "kv_layout": m.layout,
        "data_parallel": c.data_parallel,
        "expert_parallel": c.expert_parallel,
    }
    draft = CapacityPlan(**figures)  # the command is written from the plan's own figures
    return CapacityPlan(**figures, vllm_command=vllm_serve_command(draft, c.model))


@dataclass(frozen=True)
class ReplicaMemory:
    """What one replica's memory holds, by a plan's own arithmetic and verdict (`plan_from` runs the same two),
    without the rest of a `CapacityPlan` (notes, the decode roofline, `vllm serve` flags): what a prediction
    asks. deployment: the resolved deployment it is of. The host tier (`core.planning.memory.offload.host_kv_tier`)
    reads it as it reads a plan (tensor_parallel, pipeline_parallel, block_size, replicas, block_bytes,
    kv_tokens)."""

    deployment: ResolvedDeployment
    fits: bool
    verdict: str
    num_blocks: int
    block_bytes: int
    kv_tokens: int

    @property
    def tensor_parallel(self) -> int:
        return self.deployment.tensor_parallel

    @property
    def pipeline_parallel(self) -> int:
        return self.deployment.pipeline_parallel

    @property
    def block_size(self) -> int:
        return self.deployment.block_size

    @property
    def replicas(self) -> int:
        return self.deployment.replicas


def replica_memory(deployment: ResolvedDeployment) -> ReplicaMemory:
    """Whether `deployment` fits and the KV blocks and tokens a replica holds: the plan's arithmetic and verdict
    on the deployment already resolved (`plan_from` gives the same fits, verdict, num_blocks, block_bytes and
    kv_tokens for the same inputs)."""
    m = _arithmetic(deployment)
    verdict = _verdict(deployment, m)
    return ReplicaMemory(deployment, verdict.fits, verdict.text, m.num_blocks, m.block_bytes, m.kv_tokens)


def concurrency_vs_context(capacity: CapacityPlan, contexts: Sequence[int]) -> list[int]:
    """Requests of each context length (tokens) the whole deployment holds at once:
    replicas x data_parallel x (num_blocks // ceil(context / block_size))."""
    out = []
    for context in contexts:
        context = check_int(context, "context length", minimum=1, maximum=MAX_CONTEXT_TOKENS)
        if capacity.kv_layout is not None:
            blocks = request_blocks(capacity.kv_layout, context)
        else:
            blocks = blocks_for_tokens(context, capacity.block_size)
        out.append(capacity.num_blocks // blocks * capacity.replicas * capacity.data_parallel)
    return out
