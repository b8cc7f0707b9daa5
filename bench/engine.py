"""The engine against transformers on the same random Llama, same prompts, same greedy decoding. Prints one JSON.

    python bench/engine.py            # 32 prompts of 16-512 tokens, 64 new tokens each
    python bench/engine.py --quick    # 8 prompts of 16-128 tokens, 16 new tokens each (under 30 s on 2 cores)

The model: a seeded random `LlamaForCausalLM` (4 layers, hidden 256, 8 query / 4 KV heads, vocab 4,096, fp32),
saved with `save_pretrained` to a temporary directory, which `Engine.from_pretrained` then loads: both sides run
the same weights. Every generation is greedy with exactly `new_tokens` tokens per prompt (no EOS), so each side
produces the same number of tokens and `tokens_match_hf` counts the prompts whose engine tokens equal
transformers' run on that prompt alone.

Throughputs are generated tokens per wall second of the whole generate call (prefill included), best of
--repeats, after one short untimed warm-up call per side (2 prompts, 2 tokens):
- engine_tokens_per_s: `Engine.generate` on all prompts (continuous batching, chunked prefill, paged KV);
- hf_batched_tokens_per_s: transformers `generate` on the left-padded batch of all prompts (attention mask);
- hf_sequential_tokens_per_s: transformers `generate` on one prompt at a time.
Peak KV bytes: transformers' DynamicCache after the padded batch (batch x (longest prompt + new tokens - 1) slots,
it only grows); ours: the most blocks in use at any step x bytes per block (2 x layers x KV heads x head_dim x
block size x 4 bytes). kv_token_bytes is what the tokens themselves need (the sum of every sequence's length).
"""

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.common import cdiv
from core.device import device_label
from core.paging.kv_cache import kv_cache_bytes

MODEL = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
}
WORKLOADS = {
    "full": {"num_prompts": 32, "min_len": 16, "max_len": 512, "new_tokens": 64},
    "quick": {"num_prompts": 8, "min_len": 16, "max_len": 128, "new_tokens": 16},
}
BLOCK_SIZE = 16


def make_prompts(num_prompts: int, min_len: int, max_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompts of uniform random lengths in [min_len, max_len] (the first and last lengths pinned to the bounds, so
    the padded batch always spans the whole range), token ids in [1, vocab)."""
    rng = random.Random(seed)
    lengths = [rng.randint(min_len, max_len) for _ in range(num_prompts)]
    lengths[0], lengths[-1] = min_len, max_len
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]


def build_model(directory: Path, seed: int = 0):
    """A seeded random Llama saved to `directory` (config.json + model.safetensors); returns the HF module."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        **MODEL, pad_token_id=0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    model.generation_config.pad_token_id = 0
    return model


def _best_wall(fn, repeats: int):
    """(best wall seconds, last result) of `repeats` calls of fn (the caller warms up)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def _hf_generate(model, input_ids, attention_mask, new_tokens: int):
    with torch.inference_mode():
        return model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            return_dict_in_generate=True,
        )


def _cache_bytes(cache) -> int:
    """Bytes of every key and value tensor a transformers DynamicCache holds."""
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def hf_side(model, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """transformers on the left-padded batch and one prompt at a time; their tokens and peak cache bytes."""
    longest = max(map(len, prompts))
    input_ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, prompt in enumerate(prompts):
        input_ids[i, longest - len(prompt) :] = torch.tensor(prompt)
        mask[i, longest - len(prompt) :] = 1
    _hf_generate(model, input_ids[:2], mask[:2], 2)  # warm-up: first-call allocations and dispatch
    batched_s, batched = _best_wall(lambda: _hf_generate(model, input_ids, mask, new_tokens), repeats)

    def sequential():
        return [
            _hf_generate(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), new_tokens)
            for p in prompts
        ]

    sequential_s, alone = _best_wall(sequential, repeats)
    generated = len(prompts) * new_tokens
    return {
        "batched_s": batched_s,
        "sequential_s": sequential_s,
        "batched_tokens_per_s": generated / batched_s,
        "sequential_tokens_per_s": generated / sequential_s,
        "peak_kv_bytes": _cache_bytes(batched.past_key_values),
        "tokens": [out.sequences[0, len(p) :].tolist() for p, out in zip(prompts, alone, strict=True)],
    }


def engine_side(directory: Path, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """Our engine on all prompts at once; its tokens, peak blocks in use and bytes per block."""
    from core.engine import Engine, SamplingParams

    # a pool that holds every sequence at its full length at once (no preemption), as transformers' cache does
    num_blocks = sum(cdiv(len(p) + new_tokens, BLOCK_SIZE) for p in prompts) + 8
    engine = Engine.from_pretrained(
        directory, num_blocks=num_blocks, block_size=BLOCK_SIZE, dtype=torch.float32, device="cpu"
    )
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # warm-up
    seconds, outputs = _best_wall(lambda: engine.generate(prompts, params), repeats)
    run = engine.last_run
    config = engine.config
    return {
        "seconds": seconds,
        "tokens_per_s": len(prompts) * new_tokens / seconds,
        "steps": len(run.steps),
        "num_blocks": run.num_blocks,
        "peak_blocks_in_use": int(run.steps["blocks_in_use"].max()),
        "block_bytes": kv_cache_bytes(
            config.num_layers, 1, run.block_size, config.num_kv_heads, config.head_dim, torch.float32
        ),
        "attention_ms": float(run.steps["attention_ms"].sum()),
        "preemptions": int(run.steps["preemptions"].sum()),
        "tokens": [list(request.outputs[0].token_ids) for request in outputs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 prompts of 16-128 tokens, 16 new tokens")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls per side (the best is kept)")
    args = parser.parse_args()
    workload = WORKLOADS["quick" if args.quick else "full"]
    prompts = make_prompts(
        workload["num_prompts"], workload["min_len"], workload["max_len"], MODEL["vocab_size"]
    )
    new_tokens = workload["new_tokens"]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp))
        hf = hf_side(model, prompts, new_tokens, args.repeats)
        ours = engine_side(Path(tmp), prompts, new_tokens, args.repeats)
    head_dim = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    token_bytes = 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * head_dim * 4
    ratio = ours["tokens_per_s"] / hf["batched_tokens_per_s"]
    result = {
        "device": device_label(torch.device("cpu")),
        "mode": "quick" if args.quick else "full",
        "model": MODEL,
        "workload": {**workload, "total_prompt_tokens": sum(map(len, prompts))},
        "engine_tokens_per_s": round(ours["tokens_per_s"], 1),
        "hf_batched_tokens_per_s": round(hf["batched_tokens_per_s"], 1),
        "hf_sequential_tokens_per_s": round(hf["sequential_tokens_per_s"], 1),
        "ratio_vs_hf_batched": round(ratio, 3),
        "ratio_vs_hf_sequential": round(ours["tokens_per_s"] / hf["sequential_tokens_per_s"], 3),
        "engine_peak_kv_bytes": ours["peak_blocks_in_use"] * ours["block_bytes"],
        "hf_batched_peak_kv_bytes": hf["peak_kv_bytes"],
        "kv_token_bytes": sum(len(p) + new_tokens - 1 for p in prompts) * token_bytes,
        "engine_peak_blocks_in_use": ours["peak_blocks_in_use"],
        "engine_num_blocks": ours["num_blocks"],
        "engine_steps": ours["steps"],
        "engine_attention_s": round(ours["attention_ms"] / 1e3, 3),
        "engine_preemptions": ours["preemptions"],
        "wall_s": {
            "engine": round(ours["seconds"], 3),
            "hf_batched": round(hf["batched_s"], 3),
            "hf_sequential": round(hf["sequential_s"], 3),
        },
        "tokens_match_hf": sum(a == b for a, b in zip(ours["tokens"], hf["tokens"], strict=True)),
        "num_prompts": len(prompts),
        "target_ratio": 2.0,
        "meets_target": ratio >= 2.0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
