"""What a decoder layer runs in vLLM's forward beyond its shapes: the facts the step-time model counts operations
by (`core.planning.cost.layer_kernels`), read from a Hugging Face config.

- `qk_norm`: "" (none), "per_head" (an RMSNorm over each head of q and of k after the QKV projection: vLLM's
  Qwen3 / Qwen3-MoE / Qwen3-Next / Gemma 3 attention, `q_norm` and `k_norm`; any config with `use_qk_norm`) or
  "across_heads" (MiniMax-M2: q and k normalised over all their heads, `MiniMaxText01RMSNormTP`, whose variance
  vLLM all-reduces across the tensor-parallel ranks in every layer: vllm/model_executor/models/minimax_m2.py).
- `shared_experts`: shared-expert MLPs an MoE layer runs beside the routed ones (DeepSeek-V2/V3 and Kimi-K2's
  `n_shared_experts`; one for Qwen2-MoE / Qwen3-Next's `shared_expert_intermediate_size` and for Llama 4).
- `dense_layers`: an MoE model's layers with a dense MLP instead (DeepSeek-V3 / Kimi-K2's
  `first_k_dense_replace`; Llama 4's layers between its MoE layers); 0 for a dense model.
"""

from dataclasses import dataclass
from typing import Any

QK_NORMS = ("", "per_head", "across_heads")
_PER_HEAD_QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen3_next", "gemma3", "gemma3_text"})


@dataclass(frozen=True)
class LayerStructure:
    """Module docstring. Invariants: qk_norm in QK_NORMS; shared_experts and dense_layers >= 0."""

    qk_norm: str = ""
    shared_experts: int = 0
    dense_layers: int = 0


PLAIN_LAYERS = LayerStructure()  # no q/k norm, no shared experts, no dense layers among MoE ones


def read_layer_structure(cfg: dict[str, Any], num_layers: int, routed_experts: int) -> LayerStructure:
    """The LayerStructure of a (language) config with `num_layers` layers and `routed_experts` experts (0: dense)."""
    model_type = str(cfg.get("model_type", "unknown"))
    qk_norm = ""
    if model_type == "minimax_m2":
        qk_norm = "across_heads"
    elif model_type in _PER_HEAD_QK_NORM_MODEL_TYPES or cfg.get("use_qk_norm"):
        qk_norm = "per_head"
    if not routed_experts:
        return LayerStructure(qk_norm=qk_norm)
    shared = int(cfg.get("n_shared_experts") or 0)
    if not shared and (cfg.get("shared_expert_intermediate_size") or model_type.startswith("llama4")):
        shared = 1
    dense = min(num_layers, int(cfg.get("first_k_dense_replace") or 0))
    if model_type.startswith("llama4"):
        dense = num_layers - num_layers // int(cfg.get("interleave_moe_layer_step") or 1)
    return LayerStructure(qk_norm=qk_norm, shared_experts=shared, dense_layers=dense)


def moe_layers(model) -> int:
    """The layers of `model` (a ModelSpec) whose MLP is the routed experts: all but `layer_structure.dense_layers`
    for an MoE model, none for a dense one."""
    return model.num_layers - model.layer_structure.dense_layers if model.num_experts else 0
