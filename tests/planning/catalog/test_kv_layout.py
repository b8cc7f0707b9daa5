"""vLLM V1's KV cache layout against the worked numbers in docs/figures.md ("vLLM V1's KV cache layout") and
hand checks."""

import pytest

from core.errors import InvalidArgumentError
from core.kv.layout import kv_cache_layout
from core.planning.catalog.models import MODELS, ModelSpec

GiB, KiB = 1024**3, 1024


def kinds(layout):
    return [(g.kind, len(g.layers), g.window) for g in layout.groups]


def test_gemma_2_9b_published_layout():
    layout = kv_cache_layout(MODELS["gemma-2-9b"], 60 * GiB, max_model_len=8192)
    assert kinds(layout) == [("sliding_window", 21, 4096), ("full", 21, None)]
    assert layout.groups[0].layers == tuple(range(0, 42, 2)) and layout.groups[1].layers == tuple(
        range(1, 42, 2)
    )
    assert (layout.group_size, layout.padding_layers) == (21, 0)
    assert layout.page_bytes == 2 * 16 * 8 * 256 * 2 == 131_072
    assert layout.block_bytes == 2_752_512 and layout.num_blocks == 23_405
    assert layout.group_blocks == (513, 512) and layout.blocks_per_request == 1_025
    assert round(layout.max_concurrency, 2) == 22.83
    assert layout.kv_tokens == int(23_405 / 1_025 * 8192)


def test_gemma_2_9b_fewer_tokens_in_flight_shrink_the_window_group():
    layout = kv_cache_layout(MODELS["gemma-2-9b"], 60 * GiB, max_model_len=8192, max_num_batched_tokens=2048)
    assert layout.group_blocks == (385, 512) and layout.blocks_per_request == 897
    assert round(layout.max_concurrency, 2) == 26.09


def test_gemma_2_9b_without_the_hybrid_manager_counts_every_layer_as_full():
    layout = kv_cache_layout(
        MODELS["gemma-2-9b"], 60 * GiB, max_model_len=8192, hybrid_kv_cache_manager=False
    )
    assert kinds(layout) == [("full", 42, None)]
    assert (layout.num_blocks, layout.blocks_per_request) == (11_702, 512)
    assert round(layout.max_concurrency, 2) == 22.86


def test_gpt_oss_20b_at_131072_tokens():
    model = MODELS["gpt-oss-20b"]
    on = kv_cache_layout(model, 60 * GiB, max_model_len=131_072)
    assert kinds(on) == [("sliding_window", 12, 128), ("full", 12, None)]
    assert on.page_bytes == 32 * KiB and on.block_bytes == 12 * 32 * KiB
    assert on.group_blocks == (521, 8192)
    assert round(on.request_bytes / GiB, 2) == 3.19
    off = kv_cache_layout(model, 60 * GiB, max_model_len=131_072, hybrid_kv_cache_manager=False)
    assert off.blocks_per_request == 8192 and off.block_bytes == 24 * 32 * KiB
    assert off.request_bytes == 6 * GiB
    assert on.max_concurrency / off.max_concurrency == pytest.approx(8192 * 2 / 8713)


def test_gemma_3_27b_groups_and_padding():
    layout = kv_cache_layout(MODELS["gemma-3-27b"], 40 * GiB, max_model_len=131_072)
    full = [len(g.layers) for g in layout.groups if g.kind == "full"]
    sliding = [len(g.layers) for g in layout.groups if g.kind == "sliding_window"]
    assert full == [10] and sorted(sliding, reverse=True) == [9, 9, 9, 9, 8, 8]
    assert (layout.group_size, layout.padding_layers) == (10, 8)
    assert sorted(layout.group_blocks) == [577] * 6 + [8192]
    # Striding: the first sliding group takes every sixth sliding layer.
    sliding_layers = [i for i in range(62) if (i + 1) % 6]
    assert layout.groups[0].layers == tuple(sliding_layers[0::6])
    assert sorted(i for g in layout.groups for i in g.layers) == list(range(62))


@pytest.mark.parametrize("hybrid", [True, False])
def test_mistral_7b_all_sliding_is_one_window_group_either_way(hybrid):
    layout = kv_cache_layout(
        MODELS["mistral-7b"], 30 * GiB, max_model_len=32_768, hybrid_kv_cache_manager=hybrid
    )
    assert kinds(layout) == [("sliding_window", 32, 4096)]
    assert layout.blocks_per_request == -(-(4095 + 8192) // 16) + 1 == 769


def test_all_full_attention_matches_the_plain_block_formula():
    model = MODELS["llama-3.1-70b"]
    layout = kv_cache_layout(model, 50 * GiB, max_model_len=131_072, kv_dtype="fp8", tensor_parallel=4)
    assert kinds(layout) == [("full", 80, None)]
    assert layout.block_bytes == 16 * 2 * 80 * 2 * 128 * 1
    assert layout.num_blocks == 50 * GiB // layout.block_bytes
    assert layout.blocks_per_request == 8192 and layout.kv_tokens == int(layout.num_blocks / 8192 * 131_072)


def test_pipeline_parallel_uses_the_largest_stage():
    layout = kv_cache_layout(MODELS["llama-3.1-405b"], 30 * GiB, max_model_len=131_072, pipeline_parallel=4)
    assert layout.group_size == 32  # 126 layers over 4 stages: 31, 32, 32, 31
    # Gemma-2 over 2 stages: stage 0 holds layers 0..20, 11 sliding and 10 full.
    gemma = kv_cache_layout(MODELS["gemma-2-9b"], 60 * GiB, max_model_len=8192, pipeline_parallel=2)
    assert gemma.group_size == 11 and gemma.num_blocks == 60 * GiB // 131_072 // 11


def test_mla_is_one_latent_per_layer():
    layout = kv_cache_layout(MODELS["deepseek-v3"], 30 * GiB, max_model_len=163_840, tensor_parallel=8)
    assert kinds(layout) == [("mla", 61, None)]
    assert layout.page_bytes == 16 * (512 + 64) * 2 and layout.block_bytes == 1_124_352
    assert layout.num_blocks == 28_649 and layout.blocks_per_request == 10_240


def test_llama_4_chunked_local_attention():
    layout = kv_cache_layout(MODELS["llama-4-scout"], 30 * GiB, max_model_len=131_072, tensor_parallel=8)
    assert sorted(kinds(layout)) == [("chunked_local", 12, 8192)] * 3 + [("full", 12, None)]
    assert sorted(layout.group_blocks) == [1024, 1024, 1024, 8192]  # cdiv(min(8192 + 8192, L), 16)
    off = kv_cache_layout(
        MODELS["llama-4-scout"],
        30 * GiB,
        max_model_len=131_072,
        tensor_parallel=8,
        hybrid_kv_cache_manager=False,
    )
    assert kinds(off) == [("full", 48, None)]


def test_qwen3_next_gated_delta_net_state_raises_the_block_size():
    # Gated DeltaNet state per layer (tp 1, bf16): conv (4 - 1) x (2 x 16 x 128 + 32 x 128) + SSM 32 x 128 x 128.
    state = (3 * 8192 + 32 * 128 * 128) * 2
    assert state == 1_097_728
    layout = kv_cache_layout(MODELS["qwen3-next-80b"], 30 * GiB, max_model_len=262_144)
    token = 2 * 2 * 256 * 2  # one token of one attention layer: 2 KV heads of 256, bf16
    assert layout.block_size == 16 * -(-state // (16 * token)) == 544
    assert layout.page_bytes == 544 * token == 1_114_112
    assert sorted(kinds(layout)) == [("full", 12, None)] + [("mamba", 12, None)] * 3
    assert sorted(layout.group_blocks) == [1, 1, 1, -(-262_144 // 544)]
    assert layout.num_blocks == 30 * GiB // 1_114_112 // 12
    assert all(g.block_size == 262_144 for g in layout.groups if g.kind == "mamba")
    with pytest.raises(InvalidArgumentError, match="disable-hybrid-kv-cache-manager"):
        kv_cache_layout(MODELS["qwen3-next-80b"], GiB, max_model_len=4096, hybrid_kv_cache_manager=False)


GRANITE_LIKE = {
    "model_type": "granitemoehybrid",
    "hidden_size": 1536,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "num_hidden_layers": 4,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
    "layer_types": ["mamba", "mamba", "mamba", "attention"],
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
}


def test_mamba2_state_hand_checked():
    model = ModelSpec.from_hf_config(GRANITE_LIKE)
    # conv (4 - 1) x (2 x 1536 + 2 x 1 x 128) + SSM 48 x 64 x 128, bf16.
    assert model.recurrent_state.state_bytes(1, "bfloat16") == (3 * 3328 + 48 * 64 * 128) * 2 == 806_400
    # tp 2 does not divide the one group: vLLM replicates it to 2 groups, conv width (3072 + 2 x 2 x 128) / 2.
    assert model.recurrent_state.state_shapes(2) == ((3, 1792), (24, 64, 128))
    layout = kv_cache_layout(model, GiB, max_model_len=4096)
    assert layout.block_size == 16 * -(-806_400 // (16 * 2048)) == 400
    assert (layout.group_size, layout.padding_layers) == (1, 0) and len(layout.groups) == 4
    assert layout.num_blocks == GiB // (400 * 2048) and layout.blocks_per_request == -(-4096 // 400) + 3
    # A block size the user chose above the minimum is kept.
    assert kv_cache_layout(model, GiB, max_model_len=4096, block_size=1024).block_size == 1024


def test_group_size_takes_the_largest_bucket_when_close():
    # 12 full + 13 sliding layers (gpt-oss with a drafter layer): padded to 13 + 13, not 24 + 13.
    config = {
        "model_type": "gpt_oss",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 25,
        "vocab_size": 100,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12 + ["sliding_attention"],
    }
    layout = kv_cache_layout(ModelSpec.from_hf_config(config), GiB, max_model_len=4096)
    assert kinds(layout) == [("sliding_window", 13, 128), ("full", 12, None)]
    assert (layout.group_size, layout.padding_layers) == (13, 1)


def test_no_memory_means_no_blocks():
    layout = kv_cache_layout(MODELS["gemma-2-9b"], 0, max_model_len=8192)
    assert layout.num_blocks == 0 and layout.max_concurrency == 0 and layout.kv_tokens == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"available_bytes": -1}, "available_bytes"),
        ({"available_bytes": 1.5}, "available_bytes"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"block_size": 0}, "block_size"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"hybrid_kv_cache_manager": "yes"}, "hybrid_kv_cache_manager"),
        ({"kv_dtype": "int3"}, "kv_dtype"),
        ({"tensor_parallel": 3}, "tensor_parallel"),
        ({"pipeline_parallel": 0}, "pipeline_parallel"),
    ],
)
def test_bad_arguments_raise_typed_errors(kwargs, message):
    args = {"available_bytes": GiB, "max_model_len": 8192, **kwargs}
    available = args.pop("available_bytes")
    with pytest.raises(InvalidArgumentError, match=message):
        kv_cache_layout(MODELS["gemma-2-9b"], available, **args)


def test_plan_uses_the_layout_and_prints_the_flags():
    from core.planning.catalog.hardware import GPUS
    from core.planning.memory.plan import concurrency_vs_context, plan

    model, gpu = MODELS["gpt-oss-20b"], GPUS["h100-80gb"]
    on = plan(model, gpu, max_model_len=131_072)
    off = plan(model, gpu, max_model_len=131_072, hybrid_kv_cache_manager=False, max_num_batched_tokens=2048)
    assert on.kv_layout.blocks_per_request == 8192 + 521 and on.num_blocks == on.kv_layout.num_blocks
    assert on.block_bytes == 12 * 32 * KiB and on.per_request_bytes == (8192 + 521) * 12 * 32 * KiB
    assert on.max_concurrency == on.num_blocks // 8713 and off.max_concurrency == off.num_blocks // 8192
    assert on.max_concurrency >= 1.9 * off.max_concurrency
    assert concurrency_vs_context(on, [131_072])[0] == on.max_concurrency
    assert "--disable-hybrid-kv-cache-manager" in off.vllm_command
    assert "--max-num-batched-tokens 2048" in off.vllm_command
    assert "--max-num-batched-tokens" not in on.vllm_command and "hybrid" not in on.vllm_command
    assert any("KV cache groups" in note for note in on.notes)


def test_gpt_oss_weights_are_estimated_from_mxfp4_unless_an_index_is_given():
    from core.planning.catalog.weights import (
        checkpoint_weight_bytes,
        read_safetensors_index,
        with_checkpoint_bytes,
    )
    from core.planning.memory.kv_accounting import weight_bytes_per_gpu

    model = MODELS["gpt-oss-20b"]
    estimate, estimated = checkpoint_weight_bytes(model)
    # Packed: 20.91B - 2 x 579M embedding / LM head - attention, at 4 + 8/32 bits; the rest in bf16.
    packed = model.num_params - 2 * 201_088 * 2880 - model.attention_params
    assert estimated and estimate == round(packed * 4.25 / 8 + (model.num_params - packed) * 2)
    assert 12.5 < estimate / GiB < 13.2
    assert weight_bytes_per_gpu(model) == estimate
    exact = with_checkpoint_bytes(model, '{"metadata": {"total_size": 13761264768}, "weight_map": {}}')
    assert checkpoint_weight_bytes(exact) == (13_761_264_768, False)
    assert weight_bytes_per_gpu(exact, tensor_parallel=2) == 13_761_264_768 // 2
    for bad in ("not json", {"metadata": {}}, {"metadata": {"total_size": -5}}, [1]):
        with pytest.raises(InvalidArgumentError, match=r"safetensors index|total_size"):
            read_safetensors_index(bad)


def test_cli_flags(tmp_path, capsys):
    from core.planning.commands.dispatch import main

    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"metadata": {"total_size": 14000000000}}')
    argv = [
        "--model",
        "gemma-2-9b",
        "--gpu",
        "h100-80gb",
        "--max-model-len",
        "8192",
        "--json",
        "--safetensors-index",
        str(index),
        "--max-num-batched-tokens",
        "2048",
    ]
    assert main(argv) == 0
    data = __import__("json").loads(capsys.readouterr().out)
    assert data["weights_bytes"] == 14_000_000_000 and data["kv_layout"]["group_blocks"] == [385, 512]
    assert main([*argv[:-2], "--disable-hybrid-kv-cache-manager"]) == 0
    data = __import__("json").loads(capsys.readouterr().out)
    assert data["kv_layout"]["blocks_per_request"] == 512 and data["hybrid_kv_cache_manager"] is False


def test_decode_reads_only_the_windows_of_hybrid_layers():
    from core.kv.layout import kv_read_bytes_per_sequence
    from core.planning.memory.kv_accounting import kv_bytes_per_token

    llama = MODELS["llama-3.1-70b"]
    assert kv_read_bytes_per_sequence(
        llama, 4096, tensor_parallel=4, pipeline_parallel=3
    ) == 4096 * kv_bytes_per_token(llama, tensor_parallel=4, pipeline_parallel=3)
    layer = 2 * 8 * 64 * 2  # gpt-oss: bytes of one token of one layer
    assert kv_read_bytes_per_sequence(MODELS["gpt-oss-20b"], 10_000) == 12 * (10_000 + 128) * layer
    scout = MODELS["llama-4-scout"]
    assert (
        kv_read_bytes_per_sequence(scout, 10_000, tensor_parallel=8)
        == (12 * 10_000 + 36 * 1808) * 2 * 128 * 2
    )
    qwen = MODELS["qwen3-next-80b"]
    assert kv_read_bytes_per_sequence(qwen, 1000) == 12 * 1000 * 2 * 2 * 256 * 2 + 36 * 1_097_728
