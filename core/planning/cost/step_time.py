"""The step-time model of a deployment: a model preset on a GPU preset with tp x pp GPUs per replica (`from_specs`),
of a model's size on a GPU's roofs (`roofline`), of the paper reproduction's OPT-13B on one A100-40GB
(`opt_13b_a100`). The model itself, `StepTimeModel` (the roofline formula, mixture-of-experts routing, sliding-window
layers, the small-step correction, how it prices a step), is `core.planning.cost.step_model`'s; the builders here
return one, and callers import it from here too.

Parallelism (`from_specs`):
- Tensor parallel (tp): weights, KV heads and FLOPs are split over the tp GPUs (`kv_accounting`'s rules); each
  layer all-reduces its hidden activations twice (after attention, after the MLP). A ring all-reduce sends
  2 (tp - 1) / tp x tokens x hidden x 2 bytes per GPU over one direction of the interconnect (half the
  datasheet's bidirectional figure), and each all-reduce costs ALL_REDUCE_LATENCY_S on top.
- Pipeline parallel (pp): each stage holds ceil(layers / pp) layers; a step runs the stages IN SEQUENCE (one
  micro-batch), so the roofline of one stage is paid pp times, plus pp - 1 hand-offs of tokens x hidden x
  2 bytes. This is conservative: vLLM keeps pp micro-batches in flight, so a saturated pipeline can approach
  pp times this throughput; latency per step is as modelled.

Data-parallel attention and expert parallelism (`from_specs(..., data_parallel=D, expert_parallel=...)`, a MoE
model served as vLLM's `--data-parallel-size D [--enable-expert-parallel]`): the model prices ONE DP rank's step on
its own batch of n tokens. Its attention, dense layers and KV are the rank's (tp-split, `kv_accounting`); the
routed experts sit on all tp x D GPUs of the server (`weight_split_per_gpu`: every expert split tp x D ways, or
whole experts per GPU with EP) and serve the batches of all D ranks, which step in lockstep (vLLM runs a dummy
batch on an idle rank). With equal batches per rank:
- expert FLOPs per GPU = 2 x k / E x expert parameters x D x n / (tp x D): the same per own token as tp alone;
- expert bytes read per GPU = this GPU's expert bytes x experts_touched(D x n) (`expert_token_ranks` = D);
- DP collectives: each MoE layer all-gathers the ranks' hidden states and reduce-scatters the output
  (`data_parallel_moe_traffic`), 2 x (D - 1) x hidden x 2 bytes per own token per layer on top of the tp
  all-reduces, 2 latencies per layer.
Left out: unequal batches across ranks (the slowest rank sets the step), routing skew over the GPUs (EP's hot
expert), DeepEP-style all-to-all kernels and their overlap with compute.

Multi-head latent attention (`mla_attention_flops`; the pricing is `step_model`'s module docstring, MLA): per
layer on a GPU, with h = heads / tp query heads (vLLM splits MLA's query heads over TP and keeps the latent whole
on every rank), L = kv_lora_rank, R = qk_rope_head_dim, P = qk_nope_head_dim, V = v_head_dim:
- a decode's pair (the absorbed path over the latent): QK^T 2 h (L + R) + PV 2 h L = 2 h (2L + R);
- a prefill chunk's pair (the up-projected heads): QK^T 2 h (P + R) + PV 2 h V = 2 h (P + R + V);
- a prefill chunk's prior-context token: its latent up-projected to K and V, 2 L h (P + V).
DeepSeek-V3 / Kimi-K2 widths (L 512, R 64, P 128, V 128, 64 heads) at tp 8 over 61 layers: 1,061,888 FLOPs per
decode pair (a head's 2,176), 312,320 per prefill pair (640), 127,926,272 per prior-context token. Before, every
pair was priced 4 x head_dim per head with the latent's 576 as head_dim (2,304); `from_specs(...,
mla_one_attention=True)` still does (an ablation).

Per-layer overhead (`from_specs(..., layer_overhead_s=...)`): a step's fixed cost outside the roofline grows
with the number of layers (each layer's kernels have a floor of launch and synchronisation time however small
the batch): overhead_s + layer_overhead_s x layers. A fixed cost fitted on one model's 80 layers over-prices
a 32- or 36-layer model's step. Per-kernel overhead (`kernel_overhead_s`, the cross-model profile's): the same
floor per kernel, overhead_s + kernel_overhead_s x the kernels a step launches (`layer_kernels.kernels_per_step`:
9 a Llama layer, 20 a Kimi-K2.5 MoE layer with MLA and a shared expert).

MiniMax-M2's q/k norms span all heads (`LayerStructure.qk_norm` "across_heads"): with tp > 1 every layer
all-reduces their variances, 2 fp32 values a token, a third all-reduce beside the two of every model
(`parallel_traffic`; vllm/model_executor/models/minimax_m2.py, `MiniMaxText01RMSNormTP`).

Constants of the paper reproduction: OPT-13B has 12.9e9 parameters (25.8 GB in fp16; the paper's Table 1 says
26 GB), 40 layers and hidden size 5,120, so 2 x 5,120 x 40 x 2 bytes = 800 KiB of K/V per token (section 3);
an A100-SXM4-40GB reads 1,555 GB/s of HBM2 and peaks at 312 TFLOP/s in dense fp16 (NVIDIA's A100 datasheet).
"""

import math

from core.common import cdiv, check_int
from core.errors import InvalidArgumentError
from core.kv.hf_config import SLIDING
from core.planning.catalog.models import MLA_HEAD_DIM_DEFAULT
from core.planning.cost.expert_rows import check_vllm_version, moe_tensor_parallel, release_expert_block_rows
from core.planning.cost.layer_kernels import kernels_per_step
from core.planning.cost.step_model import DEFAULT_OVERHEAD_S, StepTimeModel
from core.planning.memory.kv_accounting import (
    check_moe_parallel,
    expert_byte_share,
    kv_bytes_per_token,
    resolve_weight_dtype,
    weight_bytes_per_gpu,
    weight_split_per_gpu,
)

# The constants used for the paper reproduction (OPT-13B, fp16, one A100-SXM4-40GB).
OPT_13B_PARAMS = 12.9e9
OPT_13B_LAYERS = 40
OPT_13B_HIDDEN = 5120
A100_40GB_BANDWIDTH = 1555e9  # bytes/s (HBM2)
A100_FP16_FLOPS = 312e12  # dense tensor-core FLOP/s
A100_NVLINK_ONE_WAY = 300e9  # bytes/s: half of the datasheet's 600 GB/s bidirectional NVLink
# One all-reduce of a decode-sized message (512 B - 32 KiB) on H100 with vLLM's custom all-reduce: 8.5-10.1 us at
# tp 2 / 4 / 8 (sgl-project/sglang pull request 2904's table; docs/slo.md). PCIe-only GPUs are slower: a floor.
ALL_REDUCE_LATENCY_S = 10e-6
ACTIVATION_BYTES = 2  # hidden states travel in bf16 / fp16
QK_VARIANCE_BYTES = 8  # MiniMax-M2's q and k variances, one fp32 each a token


def roofline(
    num_params: float,
    num_layers: int,
    hidden_size: int,
    kv_bytes_per_token: float,
    memory_bandwidth: float,
    peak_flops: float,
    weight_bytes_per_param: float = 2.0,
    **kwargs,
) -> StepTimeModel:
    """A StepTimeModel from a model's size and a GPU's bandwidth / FLOP/s (fp16 weights by default).

    hidden_size is num_heads x head_dim (the query width attention multiplies with).
    """
    return StepTimeModel(
        weight_bytes=num_params * weight_bytes_per_param,
        kv_bytes_per_token=kv_bytes_per_token,
        flops_per_token=2.0 * num_params,
        attention_flops_per_pair=4.0 * num_layers * hidden_size,
        memory_bandwidth=memory_bandwidth,
        peak_flops=peak_flops,
        **kwargs,
    )


def opt_13b_a100(**kwargs) -> StepTimeModel:
    """OPT-13B in fp16 on one A100-40GB: 25.8 GB of weights, 800 KiB of KV per token, 1,555 GB/s, 312 TFLOP/s,
    80% of bandwidth, 50% of peak FLOP/s, 15 ms per-step overhead (override any field by keyword)."""
    return roofline(
        OPT_13B_PARAMS,
        OPT_13B_LAYERS,
        OPT_13B_HIDDEN,
        kv_bytes_per_token=2 * OPT_13B_HIDDEN * OPT_13B_LAYERS * 2,
        memory_bandwidth=A100_40GB_BANDWIDTH,
        peak_flops=A100_FP16_FLOPS,
        **({"interconnect_bandwidth": A100_NVLINK_ONE_WAY} | kwargs),
    )


def parallel_traffic(model, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> tuple[float, float]:
    """(bytes per token per GPU, latency seconds per step) of tensor- and pipeline-parallel communication.

    All-reduces: 2 per layer on every stage when tp > 1 (pp x 2 x ceil(layers / pp) per step, run in sequence),
    each sending 2 (tp - 1) / tp x hidden x ACTIVATION_BYTES per token (ring), and one more per layer of
    QK_VARIANCE_BYTES per token for q/k norms across heads (module docstring); hand-offs: pp - 1 per step of
    hidden x ACTIVATION_BYTES per token. Every collective or hand-off costs ALL_REDUCE_LATENCY_S.
    """
    tp, pp = tensor_parallel, pipeline_parallel
    all_reduces = 2 * cdiv(model.num_layers, pp) * pp if tp > 1 else 0
    hidden_bytes = model.hidden_size * ACTIVATION_BYTES
    per_token = all_reduces * 2 * (tp - 1) / tp * hidden_bytes + (pp - 1) * hidden_bytes
    qk_reduces = all_reduces // 2 if model.layer_structure.qk_norm == "across_heads" else 0
    per_token += qk_reduces * 2 * (tp - 1) / tp * QK_VARIANCE_BYTES
    return float(per_token), (all_reduces + qk_reduces + pp - 1) * ALL_REDUCE_LATENCY_S


def data_parallel_moe_traffic(model, data_parallel: int, pipeline_parallel: int = 1) -> tuple[float, float]:
    """(bytes per token per GPU, latency seconds per step) of a MoE model's data-parallel collectives (module
    docstring: data-parallel attention): each MoE layer all-gathers the DP ranks' hidden states before the experts
    and reduce-scatters the experts' output after them, (D - 1) x hidden x ACTIVATION_BYTES per own token each
    (a ring), and costs 2 x ALL_REDUCE_LATENCY_S; every layer of the stage counts as a MoE layer (DeepSeek-V3: 61
    for its 58), the stages run in sequence. Zero for data_parallel 1."""
    if data_parallel <= 1:
        return 0.0, 0.0
    layers = cdiv(model.num_layers, pipeline_parallel) * pipeline_parallel
    per_token = layers * 2 * (data_parallel - 1) * model.hidden_size * ACTIVATION_BYTES
    return float(per_token), 2 * layers * ALL_REDUCE_LATENCY_S


def expert_weight_share(model, weight_dtype: str = "auto") -> float:
    """The routed experts' share of the model's stored weight bytes (0 for a dense model):
    `core.planning.memory.kv_accounting.expert_byte_share`, the one home of that rule."""
    return expert_byte_share(model, weight_dtype)


def from_specs(
    model,
    gpu,
    tensor_parallel: int = 1,
    weight_dtype: str = "auto",
    kv_dtype: str = "auto",
    pipeline_parallel: int = 1,
    **kwargs,
) -> StepTimeModel:
    """A StepTimeModel for `model` (core.planning.catalog.models.ModelSpec) on `gpu` (core.planning.catalog.hardware.GPUSpec)
    with tp x pp GPUs per replica (module docstring: Parallelism).

    Weight and KV bytes per GPU come from core.planning.memory.kv_accounting (vLLM's rules, the largest pipeline stage);
    FLOPs use the active parameters (MoE) split over tp x pp. fp8 weights run at the GPU's FP8 peak when it has
    one. A GPU without a known peak is treated as memory-bound (its compute roof set at 1,000 FLOP per byte of
    bandwidth, far above any decode step's intensity). Efficiencies and overheads: keyword arguments (fitted
    ones from `fit_step_time`, `core.planning.cost.fits.published`), else the defaults. data_parallel /
    expert_parallel (keywords): a MoE model's DP ranks and EP (module docstring: data-parallel attention); the
    model is that of one DP rank. vllm_version (keyword, None by default: today's vLLM): the vLLM release whose MoE
    kernel prices the routed experts (`core.planning.cost.expert_rows.vllm_expert_block_rows`: vLLM 0.12's padded
    DeepGEMM kernel for block-scaled FP8 experts), unless expert_block_rows is given.
    """
    tp, pp = tensor_parallel, pipeline_parallel
    dp = kwargs.pop("data_parallel", 1)
    ep = kwargs.pop("expert_parallel", False)
    check_moe_parallel(model, tp, dp, ep)
    _fold_fixed_cost(kwargs, "layer_overhead_s", model.num_layers)
    _fold_fixed_cost(kwargs, "kernel_overhead_s", kernels_per_step(model))
    _fp8_expert_efficiencies(model, weight_dtype, kwargs)
    fp8_ratio = kwargs.pop("fp8_flops_ratio", None)
    if fp8_ratio is not None and not 0 < fp8_ratio <= 2:
        raise InvalidArgumentError(f"fp8_flops_ratio must be in (0, 2] or None, got {fp8_ratio!r}")
    peak = gpu.peak_bf16_flops
    if resolve_weight_dtype(model, weight_dtype) == "fp8" and getattr(gpu, "peak_fp8_flops", None):
        peak = gpu.peak_fp8_flops if fp8_ratio is None or not peak else peak * fp8_ratio
    peak = peak or gpu.memory_bandwidth * 1000.0
    link = getattr(gpu, "interconnect_bandwidth", None)
    comm_bytes, comm_latency = parallel_traffic(model, tp, pp)
    if dp > 1 and model.is_moe:
        dp_bytes, dp_latency = data_parallel_moe_traffic(model, dp, pp)
        comm_bytes, comm_latency = comm_bytes + dp_bytes, comm_latency + dp_latency
    extra = {"pipeline_stages": pp} if pp > 1 else {}
    attention = _attention_flops(model, tp, pp, kwargs)
    if comm_bytes or comm_latency:
        extra |= {"comm_bytes_per_token": comm_bytes, "comm_latency_s": comm_latency}
    weights = float(weight_bytes_per_gpu(model, weight_dtype, tp, pp, dp, ep))
    share = expert_weight_share(model, weight_dtype)
    if share and (dp > 1 or ep):  # the experts' share of this GPU's bytes (kv_accounting: DP ranks and EP)
        dense, experts = weight_split_per_gpu(model, weight_dtype, tp, pp, dp, ep)
        share = experts / (dense + experts)
    # moe_reads_all_experts=True: every expert read every step, the model before issue 40 (an ablation)
    routed = not kwargs.pop("moe_reads_all_experts", False)
    block_rows = check_int(kwargs.pop("expert_block_rows", 0), "expert_block_rows", minimum=0)
    version = check_vllm_version(kwargs.pop("vllm_version", None))
    if version and not block_rows:  # the release's MoE kernel, unless expert_block_rows is given
        block_rows = release_expert_block_rows(
            version, model, weight_dtype, gpu, moe_tensor_parallel(tp, dp, ep)
        )
    if routed and share and block_rows:  # no routed rows to pad otherwise (core.planning.cost.expert_rows)
        kwargs["expert_block_rows"] = block_rows
    if share:
        active_experts = model.expert_params * model.num_experts_per_tok / model.num_experts
        extra |= {
            "expert_weight_bytes": weights * share,
            "expert_flops_per_token": 2.0 * active_experts / (tp * pp),
        }
        if routed:
            extra |= {"num_experts": model.num_experts, "experts_per_token": model.num_experts_per_tok}
            if dp > 1:
                extra["expert_token_ranks"] = dp
    kv_token = float(kv_bytes_per_token(model, kv_dtype, tp, pp))
    sliding = model.layer_kinds.count(SLIDING) / model.num_layers
    if sliding and model.sliding_window:  # step_model's module docstring: sliding-window layers
        extra |= {"sliding_layer_fraction": sliding, "sliding_window": int(model.sliding_window)}
    return StepTimeModel(
        weight_bytes=weights * (1.0 - share),
        kv_bytes_per_token=kv_token,
        flops_per_token=2.0 * model.num_params_active / (tp * pp),
        memory_bandwidth=float(gpu.memory_bandwidth),
        peak_flops=float(peak),
        **({"interconnect_bandwidth": link / 2 if link else math.inf} | attention | extra | kwargs),
    )


def mla_attention_flops(model, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> dict:
    """An MLA model's attention FLOPs on one GPU (module docstring: multi-head latent attention), as StepTimeModel
    fields: attention_flops_per_pair (a decode's, the absorbed path), prefill_attention_flops_per_pair (a prefill
    chunk's, the up-projected heads) and prefill_context_flops_per_token (a chunk's prior context up-projected),
    over the largest pipeline stage's layers."""
    layers = cdiv(model.num_layers, pipeline_parallel)
    heads = model.num_attention_heads / tensor_parallel
    latent, rope = model.kv_lora_rank, model.qk_rope_head_dim
    nope = model.qk_nope_head_dim or MLA_HEAD_DIM_DEFAULT  # a spec built by hand may leave them out
    v_dim = model.v_head_dim or MLA_HEAD_DIM_DEFAULT
    return {
        "attention_flops_per_pair": 2.0 * layers * heads * (2 * latent + rope),
        "prefill_attention_flops_per_pair": 2.0 * layers * heads * (nope + rope + v_dim),
        "prefill_context_flops_per_token": 2.0 * layers * latent * heads * (nope + v_dim),
    }


def _attention_flops(model, tp: int, pp: int, kwargs: dict) -> dict:
    """The attention FLOPs fields of `from_specs`: 4 x layers x heads x head_dim / tp per pair, or an MLA model's
    two paths (`mla_attention_flops`) unless the keyword mla_one_attention=True (popped from kwargs) prices it
    as the model did before them, a standard head over the latent's width (an ablation)."""
    if model.is_mla and not kwargs.pop("mla_one_attention", False):
        return mla_attention_flops(model, tp, pp)
    kwargs.pop("mla_one_attention", None)
    heads = model.num_attention_heads * model.head_dim
    return {"attention_flops_per_pair": 4.0 * cdiv(model.num_layers, pp) * heads / tp}


def _fold_fixed_cost(kwargs: dict, name: str, count: int) -> None:
    """Fold the keyword `name` (seconds per unit per step: layer_overhead_s a layer, kernel_overhead_s a kernel)
    into `overhead_s` as that cost x `count` units, in place."""
    cost = kwargs.pop(name, 0.0)
    if not cost >= 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {cost!r}")
    if cost:
        kwargs["overhead_s"] = kwargs.get("overhead_s", DEFAULT_OVERHEAD_S) + cost * count


def _fp8_expert_efficiencies(model, weight_dtype: str, kwargs: dict) -> None:
    """The FP8 experts' own efficiencies (docs/slo.md 2c, the fourth stage: tried, not adopted, so no stored profile
    sets them; `bench.slo_published --train-minimax` fits them), in place: FP8 block-quantized experts run another
    grouped-GEMM kernel than MXFP4 (or 16-bit) ones, so a profile may give them their own share of the bandwidth
    and of the FLOP/s; the keywords fp8_expert_{bandwidth,flops}_efficiency replace expert_bandwidth_efficiency /
    expert_flops_efficiency when the experts are stored in FP8 (None: the shared ones)."""
    fp8_moe = model.is_moe and resolve_weight_dtype(model, weight_dtype) == "fp8"
    for name in ("bandwidth", "flops"):
        value = kwargs.pop(f"fp8_expert_{name}_efficiency", None)
        if value is None:
            continue
        if not 0 < value <= 1:
            raise InvalidArgumentError(
                f"fp8_expert_{name}_efficiency must be in (0, 1] or None, got {value!r}"
            )
        if fp8_moe:
            kwargs[f"expert_{name}_efficiency"] = value
