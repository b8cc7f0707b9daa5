"""Paging against padding on a ShareGPT-like workload: our engine against transformers, same weights, greedy.

    python bench/engine.py --model smollm2-135m-instruct           # the real model (fetched once), full run
    python bench/engine.py --model smollm2-135m-instruct --quick   # fewer, shorter requests (~1 minute, 2 cores)
    python bench/engine.py --model tiny --quick                    # a seeded random 4-layer Llama (no download)
    python bench/engine.py --model PATH                            # a Hugging Face directory or a .gguf file

Workload: 64 requests whose prompt and output lengths are drawn like ShareGPT's (`core.serving.workload`'s
log-normal fit of the paper's means, seed 0), then scaled down for a CPU (prompts and outputs divided by
`prompt_scale` / `output_scale`, at least 1 token): the spread of the lengths, which is what padding wastes, is
kept. Prompt tokens are seeded random ids (special tokens avoided); every request is greedy and runs exactly its
output length (EOS ignored on both sides), so both sides produce the same useful tokens.

Three ways to run the same 64 requests (throughput = useful output tokens / wall seconds, prefill included; the
engine and the padded batches take turns --repeats times and the best of each is kept, after an untimed warm-up
call per side):
- engine: `Engine.add_request` for all, then `step()` to the end, at most `batch_size` requests running at once
  (`max_num_seqs`): continuous batching, chunked prefill, paged KV;
- hf_batched: transformers `generate` on left-padded batches of `batch_size` consecutive requests: each batch
  runs to its longest output (every row computes that many tokens), its prompts padded to the longest;
- hf_sequential: transformers `generate` one request at a time, on the first `sequential` requests only (16,
  --quick 4; timed once: its tokens/s is a rate, so it still compares).
Greedy tokens: `tokens_match_hf_sequential` counts the requests whose engine tokens equal transformers' on that
request alone; `tokens_match_hf_batched` those equal to its padded batch's row (cut to the request's length).
Peak KV bytes: ours the most blocks in use at any step x bytes per block; transformers' the largest DynamicCache
of a batch (batch x (longest prompt + longest output - 1) slots). `kv_token_bytes` is what the 64 requests'
tokens themselves need. `engine_time_share` splits the engine's steps into attention, the rest of the model and
host work (scheduling, block tables, sampling, bookkeeping), from its per-step table.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_models import load_models
from core.common import cdiv
from core.device import device_label
from core.paging.kv_cache import kv_cache_bytes
from core.serving.workload import sample_lengths

WORKLOADS = {
    "full": {"num_requests": 64, "prompt_scale": 4, "output_scale": 8, "batch_size": 16, "sequential": 16},
    "quick": {"num_requests": 64, "prompt_scale": 16, "output_scale": 32, "batch_size": 16, "sequential": 4},
}
BLOCK_SIZE = 16


def make_requests(num: int, prompt_scale: int, output_scale: int, vocab: int, low_id: int, seed: int = 0):
    """(prompts, output lengths): ShareGPT-like lengths (seeded) divided by the scales, random token ids in
    [low_id, vocab)."""
    rng = np.random.default_rng(seed)
    prompts_len, outputs_len = sample_lengths("sharegpt", num, rng)
    prompts_len = np.maximum(1, np.rint(prompts_len / prompt_scale)).astype(int)
    outputs_len = np.maximum(1, np.rint(outputs_len / output_scale)).astype(int)
    prompts = [rng.integers(low_id, vocab, size=n).tolist() for n in prompts_len]
    return prompts, outputs_len.tolist()


def _hf_generate(model, input_ids, attention_mask, new_tokens: int):
    with torch.inference_mode():
        return model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            return_dict_in_generate=True,
        )


def _padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded [batch, longest] input ids and their attention mask."""
    longest = max(map(len, prompts))
    input_ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, prompt in enumerate(prompts):
        input_ids[i, longest - len(prompt) :] = torch.tensor(prompt)
        mask[i, longest - len(prompt) :] = 1
    return input_ids, mask


def _cache_bytes(cache) -> int:
    """Bytes of every key and value tensor a transformers DynamicCache holds."""
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def hf_batched(model, prompts, outputs, batch_size: int, pad: int):
    """(run, summary): transformers on padded batches of `batch_size` consecutive requests, each batch running to
    its longest output; summary(results) gives the tokens, the rows computed and the peak cache bytes."""
    batches = [range(i, min(i + batch_size, len(prompts))) for i in range(0, len(prompts), batch_size)]

    def run():
        results = []
        for rows in batches:
            ids, mask = _padded([prompts[i] for i in rows], pad)
            results.append(_hf_generate(model, ids, mask, max(outputs[i] for i in rows)))
        return results

    def summary(results) -> dict:
        tokens, computed = [], 0
        for rows, out in zip(batches, results, strict=True):
            width = out.sequences.shape[1] - max(outputs[i] for i in rows)  # the padded prompt width
            for row, i in enumerate(rows):
                tokens.append(out.sequences[row, width : width + outputs[i]].tolist())
            computed += len(rows) * (out.sequences.shape[1] - width)
        return {
            "tokens": tokens,
            "computed_tokens": computed,
            "peak_kv_bytes": max(_cache_bytes(out.past_key_values) for out in results),
        }

    ids, mask = _padded(prompts[:2], pad)
    _hf_generate(model, ids, mask, 2)  # warm-up: first-call allocations and dispatch
    return run, summary


def hf_sequential(model, prompts, outputs) -> dict:
    """transformers on one request at a time (timed once: a rate, and the tokens of each request alone)."""
    started = time.perf_counter()
    results = [
        _hf_generate(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), n)
        for p, n in zip(prompts, outputs, strict=True)
    ]
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "tokens": [out.sequences[0, len(p) :].tolist() for p, out in zip(prompts, results, strict=True)],
    }


def engine_side(engine_factory, prompts, outputs, batch_size: int):
    """(run, summary): our engine, every request added, then stepped to the end with at most batch_size running
    at once; summary(results) gives its tokens, blocks and where the step time went (the last run's steps)."""
    from core.engine import SamplingParams

    # a pool that holds every request at its full length at once (no preemption), as transformers' cache does
    num_blocks = sum(cdiv(len(p) + n, BLOCK_SIZE) for p, n in zip(prompts, outputs, strict=True)) + 8
    engine = engine_factory(num_blocks=num_blocks, block_size=BLOCK_SIZE, max_num_seqs=batch_size)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outputs]

    def run():
        engine.reset_metrics()
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(prompt, p, request_id=i)
        done = {}
        while engine.has_unfinished_requests():
            done.update((out.request_id, out) for out in engine.step())
        return [done[i] for i in range(len(prompts))]

    def summary(results) -> dict:
        steps = engine.current_run().steps
        config, dtype = engine.config, engine.model.dtype
        parts = {
            "attention": float(steps["attention_ms"].sum()),
            "rest_of_model": float(steps["rest_of_model_ms"].sum()),
            "host": float(steps["host_ms"].sum()),
        }
        decode = steps["prefill_tokens"] == 0
        return {
            "tokens": [list(r.outputs[0].token_ids) for r in results],
            "steps": len(steps),
            "num_blocks": num_blocks,
            "peak_blocks_in_use": int(steps["blocks_in_use"].max()),
            "block_bytes": kv_cache_bytes(
                config.num_layers, 1, BLOCK_SIZE, config.num_kv_heads, config.head_dim, dtype
            ),
            "token_bytes": kv_cache_bytes(
                config.num_layers, 1, 1, config.num_kv_heads, config.head_dim, dtype
            ),
            "step_ms": float(steps["step_time_ms"].sum()),
            "time_ms": parts,
            "median_decode_step_ms": float(steps.loc[decode, "step_time_ms"].median()),
            "median_prefill_step_ms": float(steps.loc[~decode, "step_time_ms"].median()),
            "preemptions": int(steps["preemptions"].sum()),
            "warmup_ms": engine.warmup_ms,
        }

    engine.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # warm-up
    return run, summary


def interleaved(runs: dict, repeats: int) -> dict:
    """{name: (best wall seconds, last result)}: each run called `repeats` times, the runs taking turns, so a
    busy spell of a shared machine hits them alike."""
    best = {name: (float("inf"), None) for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            result = run()
            best[name] = (min(best[name][0], time.perf_counter() - started), result)
    return best


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", default="tiny", help="tiny, smollm2-135m-instruct, or a directory / .gguf path"
    )
    parser.add_argument("--quick", action="store_true", help="shorter requests, 4 sequential ones")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls per side (the best is kept)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="requests per padded batch / running at once"
    )
    parser.add_argument("--skip-sequential", action="store_true", help="no one-at-a-time transformers run")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads for both sides (1: steady on a shared machine)"
    )
    return parser.parse_args()


def run_sides(args: argparse.Namespace, workload: dict, models, prompts, outputs):
    """(ours, hf, seq, n_seq): the engine's and the padded batches' best timed run with their summaries, then
    transformers one request at a time on the first `n_seq` requests (seq None when skipped)."""
    batch = workload["batch_size"]
    hf_run, hf_summary = hf_batched(models.hf, prompts, outputs, batch, models.pad_id)
    engine_run, engine_summary = engine_side(models.engine, prompts, outputs, batch)
    timed = interleaved({"engine": engine_run, "hf_batched": hf_run}, args.repeats)
    ours = {"seconds": timed["engine"][0], **engine_summary(timed["engine"][1])}
    hf = {"seconds": timed["hf_batched"][0], **hf_summary(timed["hf_batched"][1])}
    n_seq = 0 if args.skip_sequential else min(workload["sequential"], len(prompts))
    seq = hf_sequential(models.hf, prompts[:n_seq], outputs[:n_seq]) if n_seq else None
    return ours, hf, seq, n_seq


def report(args, workload, models, prompts, outputs, ours, hf, seq, n_seq, started: float) -> dict:
    """The bench's one JSON object: throughputs and their ratios, KV bytes, the engine's steps and where their
    time goes, wall times, and how many requests' greedy tokens equal transformers'."""
    useful = sum(outputs)
    engine_tps = useful / ours["seconds"]
    hf_tps = useful / hf["seconds"]
    seq_tps = sum(outputs[:n_seq]) / seq["seconds"] if seq else None
    step_ms = ours["step_ms"]
    return {
        "device": device_label(torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "mode": "quick" if args.quick else "full",
        "model": models.description,
        "workload": {
            **workload,
            "prompt_tokens": sum(map(len, prompts)),
            "output_tokens": useful,
            "prompt_len_mean_max": [
                round(float(np.mean([len(p) for p in prompts])), 1),
                max(map(len, prompts)),
            ],
            "output_len_mean_max": [round(float(np.mean(outputs)), 1), max(outputs)],
        },
        "engine_tokens_per_s": round(engine_tps, 1),
        "hf_batched_tokens_per_s": round(hf_tps, 1),
        "hf_sequential_tokens_per_s": None if seq_tps is None else round(seq_tps, 1),
        "ratio_vs_hf_batched": round(engine_tps / hf_tps, 3),
        "ratio_vs_hf_sequential": None if seq_tps is None else round(engine_tps / seq_tps, 3),
        "hf_batched_computed_tokens": hf["computed_tokens"],
        "engine_peak_kv_bytes": ours["peak_blocks_in_use"] * ours["block_bytes"],
        "hf_batched_peak_kv_bytes": hf["peak_kv_bytes"],
        "kv_token_bytes": sum(len(p) + n - 1 for p, n in zip(prompts, outputs, strict=True))
        * ours["token_bytes"],
        "engine_peak_blocks_in_use": ours["peak_blocks_in_use"],
        "engine_num_blocks": ours["num_blocks"],
        "engine_steps": ours["steps"],
        "engine_preemptions": ours["preemptions"],
        "engine_median_decode_step_ms": round(ours["median_decode_step_ms"], 2),
        "engine_median_prefill_step_ms": round(ours["median_prefill_step_ms"], 2),
        "engine_time_share": {k: round(v / step_ms, 3) for k, v in ours["time_ms"].items()},
        "engine_time_s": {k: round(v / 1e3, 3) for k, v in ours["time_ms"].items()},
        "engine_warmup_ms": round(ours["warmup_ms"], 1),
        "wall_s": {
            "engine": round(ours["seconds"], 3),
            "hf_batched": round(hf["seconds"], 3),
            "hf_sequential": None if seq is None else round(seq["seconds"], 3),
            "bench": round(time.perf_counter() - started, 1),
            "bench_cpu": round(time.process_time(), 1),  # CPU seconds of this process (a busy machine's wall
            # time says little about how long the bench takes alone)
        },
        "tokens_match_hf_sequential": None
        if seq is None
        else sum(a == b for a, b in zip(ours["tokens"], seq["tokens"], strict=False)),
        "sequential_requests": n_seq,
        "tokens_match_hf_batched": sum(a == b for a, b in zip(ours["tokens"], hf["tokens"], strict=True)),
        "num_requests": len(prompts),
        "target_ratio": 2.0,
        "meets_target": engine_tps / hf_tps >= 2.0,
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    workload = dict(WORKLOADS["quick" if args.quick else "full"])
    if args.batch_size:
        workload["batch_size"] = args.batch_size
    torch.manual_seed(0)
    started = time.perf_counter()
    models = load_models(args.model)
    prompts, outputs = make_requests(
        workload["num_requests"],
        workload["prompt_scale"],
        workload["output_scale"],
        models.vocab,
        models.low_id,
    )
    ours, hf, seq, n_seq = run_sides(args, workload, models, prompts, outputs)
    print(json.dumps(report(args, workload, models, prompts, outputs, ours, hf, seq, n_seq, started)))


if __name__ == "__main__":
    main()
