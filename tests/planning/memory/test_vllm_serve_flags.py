"""Every kind of `vllm serve` command the lab prints, parsed by vLLM 0.32's own `vllm serve` parser (in its venv:
tests/planning/memory/vllm_serve_args_script.py): each flag is one vLLM knows, with a value it takes, and the engine
arguments it sets are the plan's (a renamed or retired flag, a value vLLM refuses or a misspelt connector would
fail here, not on a user's GPU box)."""

from pathlib import Path

import pytest

from core.page_models.slo_predict import disagg_serve_command
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.offload import offload_flags
from core.planning.memory.plan import plan
from core.planning.predict.disagg import DisaggDeployment
from core.planning.predict.load import Load
from tests.vllm_reference import run_vllm_script

SCRIPT = Path(__file__).with_name("vllm_serve_args_script.py")
# commands vLLM 0.32 refuses: a flag it retired and a KV cache dtype it does not take
CONTROLS = ["vllm serve m \\\n  --use-v2-block-manager", "vllm serve m \\\n  --kv-cache-dtype int4"]


# What each command must ask of vLLM beyond the plan's own figures, written out by hand (not by the rules of
# `vllm_serve_command` under test): DP ranks, EP, the KV cache dtype flag, quantization, --dtype, the token budget
# and the hybrid manager (None: the flag is left to vLLM's default, as the plan assumes)
BY_HAND = {
    "data_parallel_size": 1,
    "enable_expert_parallel": False,
    "kv_cache_dtype": "fp8",
    "quantization": None,
    "dtype": "auto",
    "max_num_batched_tokens": None,
    "disable_hybrid_kv_cache_manager": None,
}


def _capacity_cases() -> list:
    """(capacity plan, its engine arguments by hand) for commands that use every flag `vllm_serve_command` writes."""
    return [
        # the Capacity planner's default: TP, an fp8 KV cache
        (
            plan(
                MODELS["llama-3.1-70b"],
                GPUS["h100-80gb"],
                tensor_parallel=4,
                kv_dtype="fp8",
                max_model_len=4096,
            ),
            BY_HAND,
        ),
        # a MoE model's data-parallel attention with expert parallelism: 4 DP ranks of tp 2
        (
            plan(
                MODELS["qwen3-235b-a22b"],
                GPUS["h200-141gb"],
                num_gpus=8,
                tensor_parallel=2,
                data_parallel=4,
                expert_parallel=True,
                kv_dtype="fp8",
                max_model_len=8192,
            ),
            BY_HAND | {"data_parallel_size": 4, "enable_expert_parallel": True},
        ),
        # a dense model's 2 replicas as 2 DP ranks, a bf16 KV cache (vLLM's auto), a larger token budget
        (
            plan(
                MODELS["llama-3.1-8b"],
                GPUS["h100-80gb"],
                num_gpus=2,
                max_model_len=2300,
                max_num_seqs=64,
                max_num_batched_tokens=16384,
            ),
            BY_HAND | {"data_parallel_size": 2, "kv_cache_dtype": "auto", "max_num_batched_tokens": 16384},
        ),
        # pipeline parallel, FP8 weights quantized at load, an fp16 KV cache under a bf16 model (--dtype float16),
        # and the hybrid KV cache manager off for a sliding-window model
        (
            plan(
                MODELS["gemma-2-9b"],
                GPUS["l40s"],
                num_gpus=2,
                pipeline_parallel=2,
                weight_dtype="fp8",
                kv_dtype="fp16",
                max_model_len=4096,
                hybrid_kv_cache_manager=False,
            ),
            BY_HAND
            | {
                "kv_cache_dtype": "auto",
                "quantization": "fp8",
                "dtype": "float16",
                "disable_hybrid_kv_cache_manager": True,
            },
        ),
    ]


def _expected(capacity, by_hand: dict) -> dict:
    """The engine arguments a command of `capacity` must set, as vLLM names them: the plan's own figures, and
    `by_hand` for the rest."""
    return {
        "model": capacity.inputs.model.hf_repo,
        "tensor_parallel_size": capacity.tensor_parallel,
        "pipeline_parallel_size": capacity.pipeline_parallel,
        "gpu_memory_utilization": capacity.gpu_memory_utilization,
        "max_model_len": capacity.max_model_len,
        "block_size": capacity.block_size,
        "max_num_seqs": capacity.max_num_seqs,
        **by_hand,
    }


@pytest.fixture(scope="module")
def parsed() -> list:
    cases = _capacity_cases()
    disagg = DisaggDeployment.of(
        MODELS["llama-3.1-8b"],
        GPUS["h100-80gb"],
        (1, 2),
        (2, 1),
        max_num_seqs=128,
        max_num_batched_tokens=8192,
    )
    texts = [capacity.vllm_command for capacity, _ in cases]
    texts.append(cases[0][0].vllm_command + " \\\n  " + offload_flags(8))  # the host KV tier's flags
    texts.append(disagg_serve_command(disagg, Load(12.0, 2000, 300)))
    texts += CONTROLS  # one run of the script (its vLLM import is ~10 s of CPU)
    return [cases, run_vllm_script(SCRIPT, {"texts": texts})["parsed"]]


def test_the_capacity_planners_commands_set_the_plans_engine_arguments(parsed):
    cases, results = parsed
    for (capacity, by_hand), [engine] in zip(cases, results[: len(cases)], strict=True):
        assert capacity.fits and "error" not in engine, engine
        expected = _expected(capacity, by_hand)
        assert {k: engine[k] for k in expected} == expected, capacity.vllm_command


def test_the_host_tier_and_the_disaggregated_pools_flags(parsed):
    cases, results = parsed
    [tier] = results[len(cases)]
    assert "error" not in tier, tier
    assert (tier["kv_offloading_size"], tier["kv_offloading_backend"]) == (8.0, "native")
    prefill, decode = results[len(cases) + 1]
    assert "error" not in prefill and "error" not in decode, (prefill, decode)
    assert (prefill["tensor_parallel_size"], decode["tensor_parallel_size"]) == (2, 1)
    assert prefill["kv_transfer_config"] == decode["kv_transfer_config"] == ["NixlConnector", "kv_both"]
    assert prefill["max_model_len"] == decode["max_model_len"] == 2300


def test_a_flag_vllm_does_not_know_is_refused_by_the_script(parsed):
    """The control: the same parser refuses a retired flag and a value it does not take."""
    [retired], [bad_value] = parsed[1][-len(CONTROLS) :]
    assert "unrecognized arguments: --use-v2-block-manager" in retired["error"]
    assert "--kv-cache-dtype" in bad_value["error"] and "int4" in bad_value["error"]
