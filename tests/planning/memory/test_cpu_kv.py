"""vLLM's CPU KV cache sizing (`core.planning.memory.cpu_kv`) against hand-worked figures (the real server's own count is
checked in tests/vllm/test_cpu_plan.py)."""

import json

import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.models import ModelSpec, get_model
from core.planning.commands.dispatch import main
from core.planning.memory.cpu_kv import CpuKVInputs, GiB, cpu_kv_dtype, plan_cpu_kv
from tests.real_model import SMOLLM2_CONFIG as SMOLLM2


def smollm2(dtype="float32") -> ModelSpec:
    return ModelSpec.from_hf_config({**SMOLLM2, "torch_dtype": dtype}, name="smollm2")


def test_smollm2_in_one_gib_at_block_32():
    # bf16 (float32 is served as bfloat16 on a CPU): 2 x 30 layers x 3 heads x 64 x 2 B = 23,040 B per token;
    # x 32 = 737,280 B per block; floor(1,073,741,824 / 737,280) = 1,456 blocks = 46,592 tokens (vLLM's start
    # log: "CPU KV cache size: 46,592 tokens")
    plan = plan_cpu_kv(CpuKVInputs.from_space_gib(smollm2(), 1, block_size=32, max_model_len=2048))
    assert (plan.dtype, plan.kv_dtype) == ("bfloat16", "bf16")
    assert plan.kv_bytes_per_token == 23_040 and plan.block_bytes == 737_280
    assert plan.num_blocks == 1_456 and plan.kv_tokens == 46_592
    assert plan.max_concurrency == 1_456 / 64 and plan.fits
    assert (
        plan.vllm_command
        == "VLLM_CPU_KVCACHE_SPACE=1 vllm serve smollm2 --block-size 32 --max-model-len 2048"
    )


def test_dtype_rules():
    assert cpu_kv_dtype(smollm2("float16")) == "fp16"  # a 16-bit checkpoint keeps its dtype
    assert cpu_kv_dtype(smollm2("float32"), dtype="float32") == "fp32"  # --dtype float32 caches in float32
    assert cpu_kv_dtype(smollm2(), "fp8_e5m2") == "fp8"
    fp8 = plan_cpu_kv(CpuKVInputs.from_space_gib(smollm2(), 1, block_size=32, kv_cache_dtype="fp8"))
    assert fp8.num_blocks == 2_912  # 1 byte per element: floor(2^30 / 368,640)
    assert "--kv-cache-dtype fp8" in fp8.vllm_command
    f32 = plan_cpu_kv(CpuKVInputs.from_space_gib(smollm2(), 1, block_size=32, dtype="float32"))
    assert f32.num_blocks == 728 and "--dtype float32" in f32.vllm_command


def test_default_block_size_and_bytes_not_whole_gib():
    plan = plan_cpu_kv(CpuKVInputs(smollm2(), 3 * GiB // 2))  # vLLM's CPU default block size is 128
    assert plan.block_size == 128 and plan.num_blocks == (3 * GiB // 2) // (23_040 * 128) == 546
    assert plan.vllm_command.endswith(f"--kv-cache-memory-bytes {3 * GiB // 2}")
    assert not plan.vllm_command.startswith("VLLM_CPU_KVCACHE_SPACE")


def test_a_request_that_does_not_fit():
    # Llama-3.1-8B bf16: 2 x 32 x 8 x 128 x 2 = 131,072 B per token, 16 MiB per block of 128: 4 GiB = 256 blocks
    # = 32,768 tokens; one 131,072-token request needs 1,024 blocks, so vLLM refuses to start
    plan = plan_cpu_kv(CpuKVInputs.from_space_gib(get_model("llama-3.1-8b"), 4))
    assert plan.num_blocks == 256 and not plan.fits and plan.max_fitting_model_len == 32_768
    assert "Does not fit" in plan.verdict


@pytest.mark.parametrize(
    "change, words",
    [
        ({"block_size": 16}, "multiples of 32"),
        ({"kv_cache_dtype": "fp16"}, "auto, fp8"),
        ({"dtype": "float64"}, "dtype must be one of"),
        ({"max_model_len": 10_000}, "max_position_embeddings"),
    ],
)
def test_refusals(change, words):
    with pytest.raises(InvalidArgumentError, match=words):
        plan_cpu_kv(CpuKVInputs(smollm2(), GiB, **change))
    with pytest.raises(InvalidArgumentError, match="between 1 and"):
        CpuKVInputs.from_space_gib(smollm2(), 0)


def test_cli(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMOLLM2))
    argv = ["--config", str(config), "--cpu-kv-cache-space-gib", "1", "--block-size", "32"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["num_blocks"], out["kv_tokens"]) == (1_456, 46_592)
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"VLLM_CPU_KVCACHE_SPACE=1 vllm serve {tmp_path} --block-size 32 --max-model-len 8192" in text
    assert main([*argv, "--kv-dtype", "bf16"]) == 2
    assert "auto, fp8" in capsys.readouterr().err


def test_compare_with_a_server_that_names_its_kv_space():
    from core.live.metrics import VllmMetrics
    from core.planning.observed.compare import compare_kv_space_with_server

    def server(blocks, override="None", space=str(GiB)):
        labels = {
            "block_size": "32",
            "cache_dtype": "auto",
            "kv_cache_memory_bytes": space,
            "num_gpu_blocks": str(blocks),
            "num_gpu_blocks_override": override,
        }
        return VllmMetrics(
            num_gpu_blocks=blocks,
            block_size=32,
            model_names=("smollm2",),
            cache_config=tuple(sorted(labels.items())),
        )

    agree = compare_kv_space_with_server(smollm2(), server(1_456), 4096, 2048)
    assert (agree.planned_blocks, agree.observed_blocks, agree.relative_difference) == (1_456, 1_456, 0.0)
    assert agree.planned_concurrency == 1_456 // 128 and "agree" in agree.explanations[0]
    overridden = compare_kv_space_with_server(smollm2(), server(128, "128"), 4096, 2048)
    assert overridden.planned_blocks == 1_456 and overridden.observed_blocks == 128
    assert "--num-gpu-blocks-override 128" in overridden.explanations[0]
    assert "Overriding num_gpu_blocks=N" in overridden.explanations[0]
    f32 = compare_kv_space_with_server(smollm2(), server(728), 4096, 2048)
    assert f32.relative_difference == -0.5 and "float32" in f32.explanations[0]
    told = compare_kv_space_with_server(smollm2(), server(728), 4096, 2048, "float32")  # its --dtype given
    assert (told.planned_blocks, told.relative_difference) == (728, 0.0) and "agree" in told.explanations[0]
    with pytest.raises(InvalidArgumentError, match="kv_cache_memory_bytes"):
        compare_kv_space_with_server(smollm2(), server(1_456, space="None"), 4096)
