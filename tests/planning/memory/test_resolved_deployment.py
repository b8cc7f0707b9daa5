"""One plan derives the model's layer specs and KV cache groups once (`ResolvedDeployment`; before it, the
layout and the decode roofline each derived the specs), and what the resolved deployment answers from them
equals the model-based functions, which derive their own."""

import sys

import pytest

import core.kv.hf_config
import core.kv.layout
from core.errors import InvalidArgumentError
from core.kv.layout import kv_cache_layout, kv_read_bytes_per_sequence
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.decode_roofline import decode_step_estimate
from core.planning.memory.plan import plan
from core.planning.memory.plan_types import PlanInputs
from core.planning.memory.resolved import resolve_deployment

GiB = 1024**3


def count_calls(monkeypatch, function) -> list[int]:
    """Replace `function` under every name a loaded module holds it by with a counting wrapper; [calls]."""
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return function(*args, **kwargs)

    for module in list(sys.modules.values()):
        for name, value in list(vars(module).items()) if module is not None else ():
            if value is function:
                monkeypatch.setattr(module, name, counted)
    return calls


# A sliding-window model, chunked-local attention, Mamba + attention, MLA, plain full attention; each fits, so
# the plan also runs the decode roofline (which read the layer specs a second time before).
CASES = [
    ("gpt-oss-20b", "h100-80gb", 1, 1),
    ("llama-4-scout", "h100-80gb", 8, 1),
    ("qwen3-next-80b", "h200-141gb", 2, 1),
    ("deepseek-v3", "h200-141gb", 8, 1),
    ("llama-3.1-70b", "h100-80gb", 4, 2),
]


@pytest.mark.parametrize(("model", "gpu", "tp", "pp"), CASES)
def test_one_plan_derives_the_layer_specs_and_groups_once(monkeypatch, model, gpu, tp, pp):
    core.kv.layout.model_kv_specs.cache_clear()  # every derivation below is computed, none remembered
    derived = count_calls(monkeypatch, core.kv.layout.model_kv_specs)
    specs = count_calls(monkeypatch, core.kv.hf_config.cached_layer_specs)
    groups = count_calls(monkeypatch, core.kv.layout.kv_cache_groups)
    capacity = plan(MODELS[model], GPUS[gpu], tensor_parallel=tp, pipeline_parallel=pp, max_model_len=32_768)
    assert capacity.fits and capacity.decode_step_s is not None
    assert (derived[0], specs[0], groups[0]) == (1, 1, 1)


@pytest.mark.parametrize(("model", "gpu", "tp", "pp"), CASES)
@pytest.mark.parametrize("hybrid", [True, False])
def test_resolved_answers_equal_the_model_based_functions(model, gpu, tp, pp, hybrid):
    inputs = PlanInputs(
        MODELS[model],
        GPUS[gpu],
        tensor_parallel=tp,
        pipeline_parallel=pp,
        kv_dtype="fp8",
        max_model_len=32_768,
        context_len=10_000,
        block_size=32,
        hybrid_kv_cache_manager=hybrid,
    )
    if model == "qwen3-next-80b" and not hybrid:  # vLLM refuses to unify Mamba layers: both paths say so
        with pytest.raises(InvalidArgumentError, match="disable-hybrid-kv-cache-manager"):
            resolve_deployment(inputs)
        with pytest.raises(InvalidArgumentError, match="disable-hybrid-kv-cache-manager"):
            kv_cache_layout(MODELS[model], 20 * GiB, max_model_len=32_768, hybrid_kv_cache_manager=False)
        return
    d = resolve_deployment(inputs)
    assert d.kv_dtype == "fp8" and d.num_gpus == tp * pp and d.replicas == 1
    assert d.kv_layout(20 * GiB) == kv_cache_layout(
        MODELS[model],
        20 * GiB,
        max_model_len=32_768,
        block_size=32,
        kv_dtype="fp8",
        tensor_parallel=tp,
        pipeline_parallel=pp,
        hybrid_kv_cache_manager=hybrid,
    )
    for context in (1, 100, 10_000, 32_768):
        assert d.kv_read_bytes_per_sequence(context) == kv_read_bytes_per_sequence(
            MODELS[model], context, kv_dtype="fp8", tensor_parallel=tp, pipeline_parallel=pp
        )
    assert d.decode_step(64) == decode_step_estimate(
        MODELS[model], GPUS[gpu], 64, 10_000, d.weight_dtype, "fp8", tp, pp
    )
