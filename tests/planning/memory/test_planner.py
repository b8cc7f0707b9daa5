"""core.planning (KV accounting, plan, what-if, CLI) against the published figures in docs/figures.md."""

import itertools
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS, GPUSpec
from core.planning.catalog.models import MODELS, ModelSpec, preset_configs
from core.planning.commands.dispatch import main
from core.planning.memory.kv_accounting import (
    kv_bytes_per_token,
    kv_capacity,
    resolve_kv_dtype,
    weight_bytes_per_gpu,
)
from core.planning.memory.plan import (
    concurrency_vs_context,
    decode_step_estimate,
    plan,
    weight_bytes_read_per_step,
)
from core.planning.memory.what_if import fragmentation_by_block_size, workload_what_if
from tests.conftest import ROOT

KiB = 1024

# docs/figures.md, "Model configurations", KV bytes/token (bf16; fp16 for the fp16 checkpoints: same 2 bytes).
PUBLISHED_KV_BYTES = {
    "llama-2-7b": 524_288,
    "llama-2-13b": 819_200,
    "llama-2-70b": 327_680,
    "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 327_680,
    "llama-3.1-405b": 516_096,
    "mistral-7b": 131_072,
    "mixtral-8x7b": 131_072,
    "qwen2.5-7b": 57_344,
    "qwen2.5-72b": 327_680,
    "opt-13b": 819_200,
    "opt-66b": 2_359_296,
    "gemma-2-9b": 344_064,
    "phi-3-mini": 393_216,
    "deepseek-v3": 70_272,
}


@pytest.mark.parametrize("slug", sorted(PUBLISHED_KV_BYTES))
def test_kv_bytes_per_token_matches_reference_table(slug):
    assert kv_bytes_per_token(MODELS[slug]) == PUBLISHED_KV_BYTES[slug]


def test_opt_13b_is_800_kib_per_token_in_fp16():
    # PagedAttention paper section 3: 2 x 5120 x 40 x 2 bytes = 800 KiB; 2048 tokens need ~1.6 GB.
    assert resolve_kv_dtype(MODELS["opt-13b"]) == "fp16"
    assert kv_bytes_per_token(MODELS["opt-13b"], "fp16") == 800 * KiB
    assert 2048 * 800 * KiB == pytest.approx(1.68e9, rel=0.01)


def test_llama_3_1_8b_is_128_kib():
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], "bf16") == 128 * KiB
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], "fp8") == 64 * KiB


def test_gemma_2_uses_published_head_dim():
    # 2 x 42 layers x 8 KV heads x 256 x 2 bytes; hidden/heads (224) would give 301,056.
    assert kv_bytes_per_token(MODELS["gemma-2-9b"]) == 2 * 42 * 8 * 256 * 2 == 344_064


def test_deepseek_v3_mla_latent_no_factor_two_replicated_on_tp():
    model = MODELS["deepseek-v3"]
    assert kv_bytes_per_token(model) == 61 * (512 + 64) * 2 == 70_272
    # Replicated on every TP rank: TP does not shrink it.
    assert kv_bytes_per_token(model, tensor_parallel=8) == 70_272
    assert kv_bytes_per_token(model, "fp8", tensor_parallel=8) == 35_136
    # PP splits layers: ceil(61 / 4) = 16 layers on the largest stage.
    assert kv_bytes_per_token(model, pipeline_parallel=4) == 16 * 576 * 2


def test_llama_3_1_70b_per_gpu_at_tp4_and_tp16():
    model = MODELS["llama-3.1-70b"]
    # tp 4: 8 KV heads / 4 = 2 per GPU.
    assert kv_bytes_per_token(model, "bf16", tensor_parallel=4) == 2 * 80 * 2 * 128 * 2 == 81_920
    # tp 16 > 8 KV heads: each head replicated on 2 GPUs, still 1 head per GPU (not 0.5).
    assert kv_bytes_per_token(model, "bf16", tensor_parallel=16) == 2 * 80 * 1 * 128 * 2 == 40_960
    assert kv_bytes_per_token(model, "bf16", tensor_parallel=8) == 40_960
    assert kv_bytes_per_token(model, "fp8", tensor_parallel=4) == 40_960


def test_pipeline_parallel_uses_largest_stage():
    model = MODELS["llama-3.1-405b"]  # 126 layers
    assert kv_bytes_per_token(model, "bf16", pipeline_parallel=4) == 2 * 32 * 8 * 128 * 2  # ceil(126/4) = 32


@pytest.mark.parametrize(
    "kv_dtype, expected",
    [("fp16", 131_072), ("bf16", 131_072), ("fp8", 65_536), ("int8", 65_536), ("fp4", 32_768)],
)
def test_kv_dtypes(kv_dtype, expected):
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], kv_dtype) == expected


def test_auto_dtype_follows_vllm():
    assert resolve_kv_dtype(MODELS["llama-2-7b"]) == "fp16"  # float16 checkpoint
    assert resolve_kv_dtype(MODELS["llama-3.1-8b"]) == "bf16"
    assert resolve_kv_dtype(MODELS["gemma-2-9b"]) == "bf16"  # float32 checkpoint, fp16-unsafe family
    assert resolve_kv_dtype(MODELS["deepseek-v3"]) == "bf16"  # FP8 weights, bf16 compute and cache


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kv_dtype": "fp3"}, "allowed"),
        ({"tensor_parallel": 0}, "between 1 and 1,024"),
        ({"tensor_parallel": 3}, "divisible"),
        ({"pipeline_parallel": 81}, "exceeds"),
        ({"tensor_parallel": 2.0}, "integer"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        kv_bytes_per_token(MODELS["llama-3.1-70b"], **kwargs)


def test_kv_heads_neither_dividing_nor_multiple_is_refused():
    model = ModelSpec.from_hf_config(
        {
            "hidden_size": 768,
            "num_attention_heads": 12,
            "num_key_value_heads": 4,
            "num_hidden_layers": 2,
            "vocab_size": 100,
        }
    )
    with pytest.raises(InvalidArgumentError, match="KV heads"):
        kv_bytes_per_token(model, tensor_parallel=6)
    assert kv_bytes_per_token(model, "fp16", tensor_parallel=2) == 2 * 2 * 2 * 64 * 2


# ---------------------------------------------------------------------------------------------------------
# plan(): vLLM's budget rule, Table 1, verdicts
# ---------------------------------------------------------------------------------------------------------

GiB = 1024**3


def _table1_plan(**kwargs):
    """OPT-13B on one A100-40GB with exactly 12 GiB left for KV, as in the paper's Table 1."""
    model, gpu = MODELS["opt-13b"], GPUS["a100-40gb"]
    weights = weight_bytes_per_gpu(model)
    return plan(
        model,
        gpu,
        gpu_memory_utilization=1.0,
        activation_reserve=40 * GiB - weights - 12 * GiB,
        max_model_len=2048,
        **kwargs,
    )


def test_table1_opt_13b_12gb_of_kv_gives_15_7k_slots():
    capacity = _table1_plan()
    assert capacity.kv_budget_bytes == 12 * GiB
    assert capacity.block_bytes == 16 * 800 * 1024
    assert capacity.num_blocks == 983  # floor(12 GiB / 12.5 MiB)
    assert capacity.kv_tokens == 15_728  # "15.7K KV slots"
    assert round(capacity.kv_tokens / 1000, 1) == 15.7
    # The paper's weights: "26 GB" for 13B parameters in fp16 (12.9e9 x 2 bytes = 25.8e9 bytes).
    assert weight_bytes_per_gpu(MODELS["opt-13b"]) == pytest.approx(26e9, rel=0.01)
    # Orca (Max) reserves 2048 tokens per request: 15,728 // 2048 = 7 requests, the paper's 7.00 batched.
    assert capacity.max_concurrency == 7


def test_table1_larger_models_slots():
    # 66B: 21 GB of KV at 2.25 MiB per token ~ 9.7K slots (Table 1 rounds the 21 GB); 175B-like (96 layers x
    # 12288 hidden): 264 GiB over 8 GPUs -> 60.1K slots.
    opt66 = MODELS["opt-66b"]
    assert kv_capacity(21 * GiB, kv_bytes_per_token(opt66)) == pytest.approx(9.7e3, rel=0.02)
    opt175 = ModelSpec.from_hf_config(
        {
            "model_type": "opt",
            "hidden_size": 12288,
            "num_attention_heads": 96,
            "num_hidden_layers": 96,
            "ffn_dim": 49152,
            "vocab_size": 50272,
            "torch_dtype": "float16",
        }
    )
    assert opt175.num_params == pytest.approx(175e9, rel=0.01)
    assert round(kv_capacity(264 * GiB, kv_bytes_per_token(opt175)) / 1000, 1) == 60.1


def test_plan_follows_vllm_budget_rule_by_hand():
    model, gpu = MODELS["llama-3.1-70b"], GPUS["h100-80gb"]
    capacity = plan(
        model, gpu, tensor_parallel=4, kv_dtype="fp8", max_model_len=4096, activation_reserve=2 * GiB
    )
    weights = 70.6e9 * 2 / 4
    assert capacity.weights_bytes == pytest.approx(weights, abs=1)
    budget = int(81_559 * 1024**2 * 0.9) - capacity.weights_bytes - 2 * GiB  # the H100 reports 81,559 MiB
    assert capacity.kv_budget_bytes == budget
    assert capacity.kv_bytes_per_token == 40_960
    assert capacity.num_blocks == budget // (16 * 40_960)
    assert capacity.kv_tokens == capacity.num_blocks * 16
    assert capacity.max_concurrency == capacity.num_blocks // 256  # 4096 tokens = 256 blocks
    assert capacity.per_request_bytes == 256 * 16 * 40_960
    assert capacity.fits and capacity.verdict.startswith("Fits")
    assert capacity.vllm_max_concurrency == pytest.approx(capacity.kv_tokens / 4096)


def test_an_l4_plans_with_its_driver_reported_memory():
    """Llama-3.1-8B on one L4 at 8,192 tokens: the L4 reports 23,034 MiB (ECC takes 1/16 of its 24 GiB), not 24
    GiB. KV budget = int(23,034 MiB x 0.9) - 14.96 GiB weights - 1.90 GiB activations = 3.38 GiB; at 131,072 B
    per token (32 layers x 8 KV heads x 128 x 2 x 2 B) and blocks of 16 tokens: 1,732 blocks, 27,712 tokens,
    3 requests of 8,192 tokens (512 blocks each). With the printed 24 GiB it would have been 38,816 tokens
    (2,426 blocks) and 4 requests: a third more than the card holds."""
    capacity = plan(MODELS["llama-3.1-8b"], GPUS["l4"], max_model_len=8192)
    assert capacity.weights_bytes / GiB == pytest.approx(14.957, abs=1e-3)
    assert capacity.activation_bytes / GiB == pytest.approx(1.904, abs=1e-3)
    budget = int(23_034 * 1024**2 * 0.9) - capacity.weights_bytes - capacity.activation_bytes
    assert capacity.kv_budget_bytes == budget and budget // (16 * 131_072) == 1_732
    assert (capacity.num_blocks, capacity.kv_tokens, capacity.max_concurrency) == (1_732, 27_712, 3)
    printed = plan(MODELS["llama-3.1-8b"], GPUSpec.custom("24 GiB", 24, 300, 121), max_model_len=8192)
    assert (printed.kv_tokens, printed.max_concurrency) == (38_816, 4)


def test_plan_data_parallel_replicas():
    model, gpu = MODELS["llama-3.1-8b"], GPUS["h100-80gb"]
    one = plan(model, gpu, max_model_len=8192)
    four = plan(model, gpu, num_gpus=4, max_model_len=8192)
    assert four.replicas == 4 and four.num_blocks == one.num_blocks
    assert four.max_concurrency_total == 4 * one.max_concurrency
    assert "--data-parallel-size 4" in four.vllm_command
    with pytest.raises(InvalidArgumentError, match="multiple"):
        plan(model, gpu, num_gpus=3, tensor_parallel=2)


def test_pipeline_parallel_weights_use_largest_stage():
    model = MODELS["llama-3.1-405b"]
    whole = weight_bytes_per_gpu(model, "bf16")
    stage = weight_bytes_per_gpu(model, "bf16", pipeline_parallel=2)
    layer_bytes = model.layer_params * 2
    # 63 layers per stage plus the larger of embedding / LM head (untied: both 128256 x 16384).
    assert stage == pytest.approx(63 * layer_bytes + 128256 * 16384 * 2, rel=1e-9)
    assert stage == whole / 2  # even split: 126 layers, embedding and LM head the same size
    deepseek = MODELS["deepseek-v3"]  # 61 layers: the largest of 2 stages has 31
    assert weight_bytes_per_gpu(deepseek, pipeline_parallel=2) == pytest.approx(
        31 * deepseek.layer_params + 129280 * 7168, abs=1
    )


def test_does_not_fit_at_all_suggests_tensor_parallel():
    capacity = plan(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], max_model_len=4096)
    assert not capacity.fits and capacity.num_blocks == 0 and capacity.kv_budget_bytes < 0
    assert capacity.min_tensor_parallel == 2
    assert "Does not fit" in capacity.verdict and "tensor_parallel >= 2" in capacity.verdict
    assert capacity.decode_tokens_per_s is None


def test_does_not_fit_at_max_model_len_gives_largest_that_would():
    capacity = plan(MODELS["llama-3.1-8b"], GPUS["l4"])  # default max_model_len 131072
    assert not capacity.fits and capacity.num_blocks > 0
    assert capacity.max_fitting_model_len == capacity.kv_tokens
    assert f"{capacity.kv_tokens:,}" in capacity.verdict
    fitting = plan(MODELS["llama-3.1-8b"], GPUS["l4"], max_model_len=capacity.max_fitting_model_len)
    assert fitting.fits and fitting.max_concurrency == 1
    assert f"--max-model-len {capacity.kv_tokens}" in capacity.vllm_command


def test_fp8_kv_doubles_tokens():
    model, gpu = MODELS["llama-3.1-70b"], GPUS["h100-80gb"]
    bf16 = plan(model, gpu, tensor_parallel=4, kv_dtype="bf16", max_model_len=4096)
    fp8 = plan(model, gpu, tensor_parallel=4, kv_dtype="fp8", max_model_len=4096)
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)


def test_deepseek_v3_weights_are_fp8_and_kv_bf16():
    capacity = plan(MODELS["deepseek-v3"], GPUS["h200-141gb"], tensor_parallel=8, max_model_len=32768)
    assert (capacity.weight_dtype, capacity.kv_dtype) == ("fp8", "bf16")
    assert capacity.weights_bytes == pytest.approx(671e9 / 8, abs=1)
    assert capacity.kv_bytes_per_token == 70_272 and capacity.fits


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "between"),
        ({"block_size": 12}, "block_size"),
        ({"max_model_len": 200_000}, "max_model_len"),
        ({"max_model_len": -1}, "max_model_len"),
        ({"context_len": 9000, "max_model_len": 8192}, "context_len"),
        ({"num_gpus": 0}, "num_gpus"),
        ({"weight_dtype": "fp2"}, "weight_dtype"),
        ({"activation_reserve": -5}, "activation_reserve"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
    ],
)
def test_plan_rejects_bad_arguments(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Decode roofline
# ---------------------------------------------------------------------------------------------------------


def test_decode_step_memory_roofline_by_hand():
    model, gpu = MODELS["llama-3.1-8b"], GPUS["h100-80gb"]
    step, bound = decode_step_estimate(model, gpu, batch=32, context_len=1024)
    expected = (8.03e9 * 2 + 32 * 1024 * 131_072) / 3.35e12
    assert bound == "memory" and step == pytest.approx(expected, rel=1e-9)


def test_decode_step_compute_bound_at_huge_batch():
    model, gpu = MODELS["llama-3.1-8b"], GPUS["h100-80gb"]
    step, bound = decode_step_estimate(model, gpu, batch=20_000, context_len=1, kv_dtype="fp4")
    assert bound == "compute" and step == pytest.approx(2 * 8.03e9 * 20_000 / 989e12)


def test_moe_reads_only_touched_experts():
    model = MODELS["mixtral-8x7b"]
    full = weight_bytes_per_gpu(model)
    one = weight_bytes_read_per_step(model, 1)
    # batch 1: shared part + 2 of 8 experts ~ the 12.9B active parameters.
    assert one == pytest.approx(12.9e9 * 2, rel=0.01)
    assert weight_bytes_read_per_step(model, 64) == pytest.approx(full, rel=1e-3)


def test_plan_decode_estimate_is_consistent():
    capacity = plan(
        MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
    )
    assert capacity.decode_batch == min(capacity.max_concurrency, 256)
    assert capacity.decode_tokens_per_s == pytest.approx(capacity.decode_batch / capacity.decode_step_s)
    assert any("estimate" in note for note in capacity.notes)


# ---------------------------------------------------------------------------------------------------------
# Workload what-if against a brute-force step-by-step count
# ---------------------------------------------------------------------------------------------------------


def _brute_force(requests, block_size):
    tokens = blocks = steps = 0
    for prompt, output in requests:
        for t in range(1, output + 1):
            tokens += prompt + t
            blocks += -(-(prompt + t) // block_size)
            steps += 1
    return tokens / steps, blocks / steps


@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=12),
    st.sampled_from([1, 2, 8, 16, 32, 128]),
)
@settings(max_examples=60, deadline=None)
def test_fragmentation_matches_brute_force(requests, block_size):
    tokens, blocks = _brute_force(requests, block_size)
    (row,) = fragmentation_by_block_size(requests, [block_size])
    assert row["mean_blocks_held"] == pytest.approx(blocks, rel=1e-12)
    assert row["internal_fragmentation"] == pytest.approx(1 - tokens / (blocks * block_size), abs=1e-12)


def test_fragmentation_hand_example_and_growth():
    # One request, prompt 17, output 1: holds 18 tokens in 2 blocks of 16 -> 14 empty slots of 32.
    (row,) = fragmentation_by_block_size([(17, 1)], [16])
    assert row["wasted_slots"] == 14 and row["internal_fragmentation"] == pytest.approx(14 / 32)
    rows = fragmentation_by_block_size([(p, o) for p in range(1, 200, 7) for o in (50, 333)])
    waste = [r["internal_fragmentation"] for r in rows]
    assert waste[0] == 0 and all(a <= b for a, b in itertools.pairwise(waste))
    # For many varied lengths the last block is on average half empty: (bs - 1) / 2 slots.
    assert rows[4]["wasted_slots"] == pytest.approx(7.5, abs=0.5)


def test_paged_vs_contiguous_on_the_paper_setup():
    capacity = _table1_plan()  # 15,728 slots, max_model_len 2048
    requests = [(161, 338)] * 10 + [(20, 58)] * 10
    what_if = workload_what_if(capacity, requests)
    _, blocks = _brute_force(requests, 16)
    assert what_if.contiguous_concurrency == 7  # Orca (Max)
    assert what_if.paged_concurrency == pytest.approx(15_728 / (blocks * 16))
    assert what_if.paged_concurrency > what_if.oracle_concurrency > what_if.contiguous_concurrency
    assert what_if.limited_by == "kv cache"
    assert what_if.kv_used_bytes == pytest.approx(983 * capacity.block_bytes, rel=1e-6)


def test_what_if_accepts_request_objects_and_caps_at_max_num_seqs():
    @dataclass
    class Req:
        prompt_len: int
        output_len: int

    capacity = plan(MODELS["llama-3.1-8b"], GPUS["h200-141gb"], max_model_len=2048, max_num_seqs=64)
    what_if = workload_what_if(capacity, [Req(10, 10)] * 3)
    assert what_if.paged_concurrency == 64 and what_if.limited_by == "max_num_seqs"
    assert what_if.kv_used_bytes == pytest.approx(64 * 1.4 * capacity.block_bytes, rel=1e-6)
    # tokens 11..16 hold 1 block (6 steps), 17..20 hold 2 blocks (4 steps): 1.4 blocks on average.


@pytest.mark.parametrize(
    "requests, message",
    [
        ([], "no requests"),
        ([(0, 5)], "prompt_len"),
        ([(5, -1)], "output_len"),
        ([(3000, 5)], "longer than"),
        (["xy1"], "prompt_len"),
    ],
)
def test_what_if_rejects_bad_workloads(requests, message):
    capacity = plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], max_model_len=2048)
    with pytest.raises(InvalidArgumentError, match=message):
        workload_what_if(capacity, requests)


def test_concurrency_vs_context():
    capacity = plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], num_gpus=2, max_model_len=8192)
    assert concurrency_vs_context(capacity, [16, 17, 8192]) == [
        2 * capacity.num_blocks,
        2 * (capacity.num_blocks // 2),
        2 * (capacity.num_blocks // 512),
    ]


# ---------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------


def test_cli_table_and_vllm_flags(capsys):
    assert (
        main(
            [
                "--model",
                "llama-3.1-70b",
                "--gpu",
                "h100-80gb",
                "--tp",
                "4",
                "--kv-dtype",
                "fp8",
                "--max-model-len",
                "4096",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for text in (
        "KV bytes per token per GPU",
        "40,960 B",
        "--tensor-parallel-size 4",
        "--kv-cache-dtype fp8",
        "--gpu-memory-utilization 0.9",
        "--max-model-len 4096",
        "--block-size 16",
        "--max-num-seqs 256",
    ):
        assert text in out


def test_cli_json_round_trips(capsys):
    assert main(["--model", "opt-13b", "--gpu", "a100-40gb", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 819_200 and data["model"] == "OPT-13B"
    expected = plan(MODELS["opt-13b"], GPUS["a100-40gb"]).to_dict()
    assert data == json.loads(json.dumps(expected))


def test_cli_custom_config_and_errors(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(preset_configs()["llama-3.1-8b"]["config"]))
    assert main(["--config", str(config), "--gpu", "a100-80gb", "--max-model-len", "8192", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 131_072
    assert main(["--model", "nope"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["--model", "llama-3.1-70b", "--tp", "3"]) == 2
    assert main(["--gpu-memory-gib", "-4", "--gpu-bandwidth-gbps", "100"]) == 2
    assert "positive" in capsys.readouterr().err


def test_cli_runs_as_module():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "core.planning",
            "--model",
            "qwen2.5-7b",
            "--gpu",
            "l4",
            "--max-model-len",
            "8192",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "57,344 B" in result.stdout and "vllm serve Qwen/Qwen2.5-7B" in result.stdout
