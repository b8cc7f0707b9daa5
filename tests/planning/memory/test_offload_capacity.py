"""`python -m core.planning ... --kv-offload-gib G`: the host tier's tokens by vLLM's arithmetic
(`CPUOffloadingSpec`: size x 2**30 // round_up(GPU block bytes per rank x world size, 4096)), checked against
hand-worked numbers for Qwen3-32B (262,144 B a token, 64 layers x 8 KV heads x 128 x 2 x 2 B)."""

import json

import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import get_gpu
from core.planning.catalog.models import ModelSpec
from core.planning.commands.dispatch import main
from core.planning.memory.offload import host_kv_tier
from core.planning.memory.plan import plan

QWEN3_32B = {  # Qwen/Qwen3-32B config.json, the fields the planner reads
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 25600,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def qwen_plan(num_gpus=2):
    model = ModelSpec.from_hf_config(QWEN3_32B, name="qwen3-32b")
    return plan(model, get_gpu("h100-80gb"), num_gpus=num_gpus, tensor_parallel=2, max_model_len=32768)


def test_qwen3_32b_tp2_200_gib_holds_819200_tokens():
    capacity = qwen_plan()
    assert capacity.kv_bytes_per_token * 2 == 262_144  # per GPU x 2 ranks
    tier = host_kv_tier(capacity, 200)
    assert tier.host_block_bytes == 262_144 * 16  # 4 MiB: 2 MiB a rank x 2
    assert (tier.host_kv_blocks, tier.host_kv_tokens) == (51_200, 819_200)
    assert tier.host_extra_tokens == 819_200 - capacity.kv_tokens
    assert tier.vllm_flags == "--kv-offloading-size 200 --kv-offloading-backend native"


def test_pod_memory_is_the_size_times_the_replicas():
    tier = host_kv_tier(qwen_plan(num_gpus=16), 200)  # 8 x TP2, the guide's fleet
    assert tier.host_memory_bytes_total == 8 * 200 * 2**30
    assert tier.host_kv_tokens == 819_200  # per replica: the size is per data-parallel engine


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_bad_sizes_are_one_plain_error(bad):
    with pytest.raises(InvalidArgumentError, match="kv-offload-gib"):
        host_kv_tier(qwen_plan(), bad)


def test_cli_prints_host_kv_tokens_and_the_vllm_flags(tmp_path, capsys):
    config = tmp_path / "qwen3-32b.json"
    config.write_text(json.dumps(QWEN3_32B))
    args = ["--config", str(config), "--tp", "2", "--max-model-len", "32768", "--kv-offload-gib", "200"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["host_kv_tokens"] == 819_200 and out["kv_offload_gib"] == 200
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "host_kv_tokens" in text and "819,200" in text
    assert "--kv-offloading-size 200 --kv-offloading-backend native" in text
    assert main([*args[:-1], "nan"]) == 2
    assert capsys.readouterr().err.strip() == "error: --kv-offload-gib must be a finite number, got nan"
