"""How many rows a step's routed-expert GEMMs compute and which experts it reads, by the kernel vLLM runs them with
(`StepTimeModel`'s MoE terms; issue 40, docs/slo.md 2c).

Routed (every vLLM kernel but the one below: Triton's fused_moe, FlashInfer's CUTLASS MoE, DeepGEMM once it skips
the padding, as in 0.16's source): n tokens at k experts each make n x k rows; a tile no routed row fills is skipped, so the FLOPs are those of
n x k rows (a tile's padding is what the fitted expert efficiency absorbs) and only the experts reached are read,
1 - (1 - k / E)^n of them under uniform routing (`uniform_experts_touched`).

Padded (vLLM 0.12 on block-quantized FP8 experts: DeepGEMM's contiguous grouped GEMM, which vLLM 0.12
selects on Hopper and Blackwell at MoE TP below 8 when the deep_gemm package is installed, as in its release
image; `get_fp8_moe_backend` in vllm/model_executor/layers/quantization/fp8.py): without the experts' row counts
on the host, vLLM sizes the grouped GEMM for the worst case, round_up(n x k + E x (B - 1), B) rows in tiles of
B = 128 for E local experts (`compute_aligned_M`, vllm/model_executor/layers/fused_moe/deep_gemm_utils.py), and
labels the rows no token fills expert 0, so the kernel computes every tile (vLLM pull request 30494, merged after
0.12.0, labels them -1 and DeepGEMM skips them). Worked: a decode step of 4 tokens at 8 of Qwen3-235B-A22B's 128
experts computes round_up(32 + 128 x 127, 128) = 16,384 rows where routing fills 32; at TP 2 (4,096 x 768 x 3
weights an expert on a GPU, 94 layers) that is 2 x 16,384 x 9.44M x 94 = 29 TFLOP a step, whatever the batch up
to a few hundred tokens. The padding is whole 128-row FP8 tensor-core tiles, a dense GEMM's shape, so it is priced
at the dense FLOP/s efficiency; the routed rows keep their own price (the fitted expert efficiency, which carries
what routing, permutation and uneven experts cost beyond the tiles: at that efficiency the padding alone would
take longer than the whole measured step, docs/slo.md 2c); the weights read stay the routed experts' (the
padding's tiles reuse expert 0's). With D attention-DP ranks and no EP, vLLM 0.12 gathers every rank's tokens
into one call and splits each expert tp x D ways (`StepTimeModel.expert_token_ranks`).
"""

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.memory.kv_accounting import resolve_weight_dtype

# DeepGEMM's row alignment for its contiguous grouped GEMM, the FP8 blocks' 128 (vLLM 0.12's
# `get_mk_alignment_for_contiguous_layout`)
DEEPGEMM_BLOCK_ROWS = 128
# The GPUs with DeepGEMM kernels among the lab's presets: Hopper (SM 90) and Blackwell (SM 100).
DEEPGEMM_GPUS = frozenset({"h100-80gb", "h200-141gb", "b200"})
# vLLM 0.12 turns DeepGEMM MoE off by default at MoE TP >= 8 (fp8.py, VLLM_MOE_USE_DEEP_GEMM)
DEEPGEMM_MAX_MOE_TP = 7
# The vLLM releases whose source says they compute the padding: 0.12 (read in 0.12.0; 0.16's source has pull request
# 30494, 0.13-0.15 were not read). Earlier ones were not read either and are taken as routed; the sample's rows are
# 0.11.2 (MXFP4) or later.
PADDED_RELEASES = ((0, 12),)


def uniform_experts_touched(new_tokens, experts_per_token: int, num_experts: int, ranks: int = 1):
    """1 - (1 - k / E)^(ranks x n), the fraction of E experts n tokens a DP rank reach routed uniformly to k each."""
    miss = 1.0 - experts_per_token / num_experts
    if isinstance(new_tokens, np.ndarray):
        return 1.0 - miss ** (ranks * np.maximum(new_tokens, 0.0))
    return 1.0 - miss ** (ranks * max(new_tokens, 0.0))


def padded_expert_rows(new_tokens, experts_per_token: int, num_experts: int, block_rows: int):
    """round_up(n x k + E x (B - 1), B): the rows the padded kernel computes for a step of n tokens (module
    docstring), a float or a float64 array like new_tokens; 0 for a step of no tokens."""
    rows = np.asarray(new_tokens, dtype=np.float64) * experts_per_token + num_experts * (block_rows - 1)
    padded = np.where(np.asarray(new_tokens) > 0, np.ceil(rows / block_rows) * block_rows, 0.0)
    return padded if isinstance(new_tokens, np.ndarray) else float(padded)


def padding_flops(
    new_tokens,
    expert_flops_per_token: float,
    experts_per_token: int,
    num_experts: int,
    block_rows: int,
    ranks=1,
):
    """FLOPs of the padded kernel's rows beyond the routed ones in a step of n tokens on one GPU (module docstring).
    expert_flops_per_token: the routed experts' FLOPs of one token on the GPU (k rows). With D = `ranks`
    attention-DP ranks the kernel runs on all ranks' n x D tokens, each expert split D ways more than
    expert_flops_per_token counts (the rank's own tokens), so a row costs expert_flops_per_token / k / D."""
    tokens = new_tokens * ranks
    rows = padded_expert_rows(tokens, experts_per_token, num_experts, block_rows) - tokens * experts_per_token
    return rows * expert_flops_per_token / (experts_per_token * ranks)


def vllm_version(text: str) -> tuple[int, ...] | None:
    """ "0.12.0" -> (0, 12, 0); None for text that names no version ("", "unknown")."""
    parts = str(text).strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def check_vllm_version(text: str | None) -> str | None:
    """`text` when it names a vLLM release ("0.12.0", "0.12"), None for None or "" (today's vLLM, whose kernels the
    profile prices: a page's empty box); InvalidArgumentError otherwise."""
    if text is None or text == "":
        return None
    if not isinstance(text, str) or vllm_version(text) is None:
        raise InvalidArgumentError(
            f"--vllm-version takes a vLLM release such as 0.12.0 (or nothing: today's vLLM), got {text!r}"
        )
    return text


def moe_tensor_parallel(tensor_parallel: int, data_parallel: int = 1, expert_parallel: bool = False) -> int:
    """The GPUs each routed expert is split over in vLLM: 1 with expert parallelism (whole experts per GPU), else
    tp x D (vLLM's `FusedMoEParallelConfig.make` flattens D data-parallel ranks into the MoE TP group)."""
    return 1 if expert_parallel else tensor_parallel * data_parallel


def block_fp8_experts(model, resolved_weight_dtype: str) -> bool:
    """Whether `model`'s routed experts are served as block-scaled FP8: a checkpoint stored so
    (`ModelSpec.quantization_block`, e.g. Qwen/Qwen3-235B-A22B-FP8's 128 x 128) loaded as it is. A 16-bit
    checkpoint served with --quantization fp8 is quantized online with one scale per tensor, not in blocks."""
    return (
        bool(model.num_experts)
        and model.quantization == "fp8"
        and bool(model.quantization_block)
        and resolved_weight_dtype == "fp8"
    )


def _deepgemm_gpu(gpu) -> bool:
    """A GPU preset slug in DEEPGEMM_GPUS, or a GPUSpec equal to one of those presets."""
    if isinstance(gpu, str):
        return gpu in DEEPGEMM_GPUS
    return any(GPUS[slug] == gpu for slug in DEEPGEMM_GPUS)


def vllm_expert_block_rows(
    version: str | None, block_fp8_experts: bool, gpu, moe_tensor_parallel: int
) -> int:
    """The `StepTimeModel.expert_block_rows` of vLLM `version` serving routed experts: DEEPGEMM_BLOCK_ROWS where it
    runs them with the padded kernel (module docstring: a release in PADDED_RELEASES, block-quantized FP8 experts,
    a GPU in DEEPGEMM_GPUS (a slug or its GPUSpec), MoE TP at most DEEPGEMM_MAX_MOE_TP), else 0 (routed). An
    unknown version (None or "": today's vLLM) is taken as routed (0)."""
    parsed = vllm_version(version or "")
    padded = (
        parsed is not None
        and parsed[:2] in PADDED_RELEASES
        and block_fp8_experts
        and moe_tensor_parallel <= DEEPGEMM_MAX_MOE_TP
        and _deepgemm_gpu(gpu)
    )
    return DEEPGEMM_BLOCK_ROWS if padded else 0


def release_expert_block_rows(
    version: str | None, model, weight_dtype: str, gpu, moe_tensor_parallel: int
) -> int:
    """`vllm_expert_block_rows` of `model` (a ModelSpec) served at `weight_dtype` ("auto": its checkpoint's): its
    experts block-scaled FP8 or not (`block_fp8_experts`). The one application of the rule to a deployment
    (`core.planning.cost.step_time.from_specs`) and to a published row (`published_vllm_rows.expert_block_rows`)."""
    block_fp8 = block_fp8_experts(model, resolve_weight_dtype(model, weight_dtype))
    return vllm_expert_block_rows(version, block_fp8, gpu, moe_tensor_parallel)
