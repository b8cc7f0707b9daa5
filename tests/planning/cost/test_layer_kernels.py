"""The kernels a step launches (`core.planning.cost.layer_kernels`), the layer facts they are counted from
(`core.planning.catalog.layer_structure`), the per-kernel cost in `from_specs` and MiniMax-M2's q/k-norm
all-reduce in `parallel_traffic` (issue 40, docs/slo.md 2c, fifth stage)."""

import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.layer_structure import LayerStructure, read_layer_structure
from core.planning.catalog.models import MODELS
from core.planning.cost import layer_kernels as lk
from core.planning.cost.step_time import ALL_REDUCE_LATENCY_S, from_specs, parallel_traffic
from core.serve.vllm_env import VLLMUnavailableError, _site_packages, find_vllm


def test_the_presets_layer_facts_from_their_configs():
    assert MODELS["llama-3.1-70b"].layer_structure == LayerStructure()
    assert MODELS["gpt-oss-120b"].layer_structure == LayerStructure()
    assert MODELS["qwen3-32b"].layer_structure == LayerStructure(qk_norm="per_head")
    assert MODELS["qwen3-235b-a22b"].layer_structure == LayerStructure(qk_norm="per_head")
    assert MODELS["minimax-m2.5"].layer_structure == LayerStructure(qk_norm="across_heads")
    # DeepSeek-V3: first_k_dense_replace 3, n_shared_experts 1; Kimi-K2.5 (its text_config): 1 and 1
    assert MODELS["deepseek-v3"].layer_structure == LayerStructure(shared_experts=1, dense_layers=3)
    assert MODELS["kimi-k2.5"].layer_structure == LayerStructure(shared_experts=1, dense_layers=1)
    # Llama 4: one shared expert, MoE every interleave_moe_layer_step layers (Scout: every layer)
    assert read_layer_structure(
        {"model_type": "llama4_text", "interleave_moe_layer_step": 2}, 48, 128
    ) == LayerStructure(shared_experts=1, dense_layers=24)
    # a dense model has no shared experts or dense layers to count, whatever its config says
    assert (
        read_layer_structure({"model_type": "llama", "first_k_dense_replace": 3}, 32, 0) == LayerStructure()
    )


def test_kernels_per_step_by_hand():
    """Module docstring's table, counted by hand: 4 outside the layers, then per layer 2 norms + attention + MLP."""
    assert lk.kernels_per_step(MODELS["llama-3.1-70b"]) == 4 + 80 * (2 + 4 + 3)  # 724
    assert lk.kernels_per_step(MODELS["qwen3-32b"]) == 4 + 64 * (2 + 4 + 2 + 3)  # q_norm, k_norm
    assert lk.kernels_per_step(MODELS["gpt-oss-120b"]) == 4 + 36 * (2 + 4 + 6)
    assert lk.kernels_per_step(MODELS["minimax-m2.5"]) == 4 + 62 * (2 + 4 + 2 + 6)
    # Kimi-K2.5: 61 MLA layers (9 kernels of attention), the first with a dense MLP, 60 with the routed experts
    # and one shared expert
    assert lk.kernels_per_step(MODELS["kimi-k2.5"]) == 4 + 61 * (2 + 9) + 1 * 3 + 60 * (6 + 3)  # 1,218


def test_the_per_kernel_cost_folds_into_the_fixed_cost():
    model, gpu = MODELS["kimi-k2.5"], GPUS["h200-141gb"]
    plain = from_specs(model, gpu, 8, overhead_s=0.001)
    priced = from_specs(model, gpu, 8, overhead_s=0.001, kernel_overhead_s=6e-6)
    assert priced.overhead_s == pytest.approx(0.001 + 6e-6 * 1218, rel=1e-12)
    assert priced.weight_bytes == plain.weight_bytes and priced.flops_per_token == plain.flops_per_token
    both = from_specs(model, gpu, 8, overhead_s=0.0, kernel_overhead_s=6e-6, layer_overhead_s=1e-5)
    assert both.overhead_s == pytest.approx(6e-6 * 1218 + 1e-5 * 61, rel=1e-12)
    with pytest.raises(InvalidArgumentError, match="kernel_overhead_s"):
        from_specs(model, gpu, 8, kernel_overhead_s=-1e-6)


def test_minimax_all_reduces_its_qk_variance_every_layer():
    """MiniMax-M2.5 at tp 4: 3 all-reduces a layer (attention output, MoE output, the q/k variances), 62 layers;
    a ring all-reduce sends 2 (tp - 1) / tp of its bytes a GPU: 3,072 x 2 bytes of hidden state, 8 of variances."""
    minimax = MODELS["minimax-m2.5"]
    per_token, latency = parallel_traffic(minimax, 4)
    assert latency == pytest.approx(3 * 62 * ALL_REDUCE_LATENCY_S)
    assert per_token == pytest.approx(62 * 1.5 * (2 * 3072 * 2 + 8))
    assert parallel_traffic(minimax, 1) == (0.0, 0.0)  # no TP: nothing to reduce
    # per-head q/k norms (Qwen3) need no all-reduce: the two of every model
    assert parallel_traffic(MODELS["qwen3-32b"], 4)[1] == pytest.approx(2 * 64 * ALL_REDUCE_LATENCY_S)


def test_spec_round_trips_its_layer_facts():
    spec = MODELS["kimi-k2.5"]
    assert spec.to_dict()["layer_structure"] == {"qk_norm": "", "shared_experts": 1, "dense_layers": 1}


def _vllm_models():
    try:
        install = find_vllm()
    except VLLMUnavailableError as err:
        pytest.skip(str(err))
    return _site_packages(install.python) / "vllm" / "model_executor"


def test_the_counted_modules_are_vllms():
    """The counts follow vLLM's model code (the installed CPU build): Qwen3's attention calls q_norm and k_norm,
    MiniMax-M2's attention normalises q and k with MiniMaxText01RMSNormTP, whose variance is all-reduced across
    the TP ranks, and MLA runs the two latent norms and the q_b projection around its attention."""
    root = _vllm_models()
    qwen3 = (root / "models" / "qwen3.py").read_text()
    assert "self.q_norm(" in qwen3 and "self.k_norm(" in qwen3
    minimax = (root / "models" / "minimax_m2.py").read_text()
    assert "MiniMaxText01RMSNormTP" in minimax
    norm = next((root / "layers").rglob("*.py"), None)
    sources = "".join(
        p.read_text() for p in (root / "layers").rglob("*.py") if "MiniMaxText01RMSNormTP" in p.read_text()
    )
    assert norm is not None and "tensor_model_parallel_all_reduce" in sources
    mla = (root / "layers" / "mla.py").read_text()
    assert all(f"self.{name}" in mla for name in ("q_a_layernorm", "kv_a_layernorm", "q_b_proj", "o_proj"))
