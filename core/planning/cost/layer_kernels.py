"""The kernels one forward step launches, counted per decoder layer as the module calls of vLLM's model code, for
the step-time model's per-kernel cost (`from_specs(..., kernel_overhead_s=...)`; issue 40, docs/slo.md 2c).

A decode step of a few sequences is a chain of small kernels, each far from its roofline: a kernel that reads a
few MB or attends over a short batch still pays its ramp-up and tail, also when vLLM replays it from a CUDA graph.
That floor is the per-kernel cost; the step pays it once per kernel, so a layer that runs more of them (MLA's
latent projections and norms, q/k norms, shared experts) costs more than a plain one of the same bytes.

Per layer (vllm/model_executor/models/llama.py, qwen3.py, qwen3_moe.py, gpt_oss.py, minimax_m2.py, deepseek_v2.py
and vllm/model_executor/layers/mla.py; all-reduces are not counted here, they are communication,
`step_time.parallel_traffic`):
- NORMS: the input and post-attention norms (the residual add fused into them);
- attention: GQA / MHA ATTENTION (QKV projection, rotary embedding, attention, output projection), plus QK_NORM
  with q/k norms, per head (Qwen3's q_norm and k_norm) or across heads (MiniMax-M2: the variance and the scaling);
  MLA_ATTENTION for multi-head latent attention (the fused q_a / kv_a projection, the two latent norms, the q_b
  projection, rotary embedding, W_UK, attention on the latent, W_UV, output projection);
- MLP: DENSE_MLP (gate-up projection, activation, down projection); MOE_MLP (router, top-k selection, grouped
  gate-up GEMM, activation, grouped down GEMM, weighted sum) plus DENSE_MLP per shared expert; an MoE model's
  dense layers (`LayerStructure.dense_layers`) count DENSE_MLP.
Linear-attention layers count as attention layers of the model's kind (their kernels are not priced apart).
Outside the layers a step runs OUTSIDE_LAYERS more: the embedding lookup, the final norm, the LM head, the sampler.

Worked counts: Llama-3.1 9 a layer; Qwen3-32B 11; gpt-oss-120b 12; Qwen3-235B-A22B and MiniMax-M2.5 14;
Kimi-K2.5 20 (its first, dense layer 14).
"""

from core.planning.catalog.layer_structure import moe_layers

NORMS = 2
ATTENTION = 4
QK_NORM = 2
MLA_ATTENTION = 9
DENSE_MLP = 3
MOE_MLP = 6
OUTSIDE_LAYERS = 4


def attention_kernels(model) -> int:
    """Kernels of one layer's attention block (module docstring)."""
    if model.is_mla:
        return MLA_ATTENTION
    return ATTENTION + (QK_NORM if model.layer_structure.qk_norm else 0)


def kernels_per_step(model) -> int:
    """Kernels one forward step of `model` launches: its decoder layers' and OUTSIDE_LAYERS (module docstring)."""
    moe = moe_layers(model)
    moe_mlp = MOE_MLP + model.layer_structure.shared_experts * DENSE_MLP
    return (
        OUTSIDE_LAYERS
        + model.num_layers * (NORMS + attention_kernels(model))
        + (model.num_layers - moe) * DENSE_MLP
        + moe * moe_mlp
    )
