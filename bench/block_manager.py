"""Time the block manager's hot paths and print one JSON object.

- nano_vllm_time_ratio (the headline): our time / nano-vllm's time on nano-vllm's decode trace
  (`bench/nano_vllm_trace.py` defines it: 512 sequences sharing a system prompt, 256 decode steps of one token
  each, then every sequence freed), like for like: our `append_token` (which also returns the token's slot)
  against nano-vllm's own block manager and sequence doing the token's block work, as its scheduler and
  postprocess call them (`append_token`, `can_append`, `may_append`, `hash_blocks`), at nano-vllm's block size,
  256 (its config requires a multiple of 256); goal <= 0.5. nano-vllm's side is its own source, not a
  re-implementation (`bench/nano_vllm_source.py`: the pinned copy in `bench/third_party/nano_vllm/`, or the
  checkout `--nano-vllm DIR` names); `nano_vllm_source` and `nano_vllm_hash` say what ran. In one process,
  the sides in turn, timed in CPU time; printed with the range of the per-repetition ratios. Beside it: the
  same with the slot nano-vllm's model runner reads added to its side (`..._with_slot_read`: the same work as
  ours, a looser comparison) and both at block size 16 (vLLM's default: 16x the block fills and hashes per
  token); `nano_vllm_decode_trace` has every ratio and each side's ns per token.
- append_tokens_per_s: append_token throughput for 1,000 sequences x 512 decode tokens, with forks (parallel
  sampling) and frees along the way, prefix caching on (and, for comparison, off). Pure Python: one core.
- revival: re-admitting prompts whose blocks are cached but free. The same prompts are re-admitted in a pool of
  40,000 and of 100,000 blocks, every free block cached; time per revived block must not grow with the cached
  free list (no scan). `revival_nano_vllm`: nano-vllm's own block manager on the same setup, with 8 prompts
  instead of 500 (it takes a revived block out of its free deque by value: a scan of the deque per block).
- snapshot_ms: BlockManager.snapshot() of a 100,000-block pool holding ~1,000 sequences.

Usage: python -m bench.block_manager [--quick] [--nano-vllm DIR]
"""

import argparse
import json
import os
import platform
import time

from bench import nano_vllm_source, nano_vllm_trace
from core.kernels.cpu_isa import cpu_description
from core.paging.block_manager import BlockManager

BLOCK_SIZE = 16
NANO_VLLM_BLOCK_SIZE = 256  # nano-vllm's default kvcache_block_size; it asserts a multiple of 256


# ---- throughput with forks, revival, snapshot --------------------------------------------------------------


def decode_run(enable_prefix_caching: bool, num_seqs: int, decode_tokens: int) -> dict:
    manager = BlockManager(100_000, BLOCK_SIZE, enable_prefix_caching=enable_prefix_caching)
    system_prompt = list(range(48))
    for seq in range(num_seqs):
        manager.allocate(seq, [*system_prompt, seq, seq + 1])
    live = list(range(num_seqs))
    next_id = num_seqs
    appended = 0
    append = manager.append_token
    start = time.perf_counter()
    for step in range(decode_tokens):
        for seq in live:
            append(seq, step)
        appended += len(live)
        if (
            step % 64 == 32
        ):  # parallel sampling: fork 50 sequences (copy-on-write follows on their next token)
            for parent in live[:50]:
                manager.fork(parent, next_id)
                live.append(next_id)
                next_id += 1
        if step % 64 == 63:  # ... and drop those samples again
            for seq in live[num_seqs:]:
                manager.free(seq)
            del live[num_seqs:]
    elapsed = time.perf_counter() - start
    return {
        "appended_tokens": appended,
        "wall_s": round(elapsed, 4),
        "tokens_per_s": round(appended / elapsed),
    }


def revival_run(pool_blocks: int, num_prompts: int, prompt_tokens: int) -> dict:
    """Re-admit `num_prompts` prompts whose blocks are cached but free, in a pool whose every other block is
    also cached and free (other prompts, freed first): a scan of the cached free list would grow with the pool."""
    manager = BlockManager(pool_blocks, BLOCK_SIZE, enable_prefix_caching=True)
    prompts = [[p * 1_000_003 + t for t in range(prompt_tokens)] for p in range(num_prompts)]
    filler_blocks = pool_blocks - num_prompts * manager.blocks_needed(prompt_tokens)
    filler = 0
    while filler_blocks >= 64:  # other prompts of 1,024 tokens fill the rest of the pool, then are freed
        manager.allocate(("other", filler), [-(filler * 1_000_003 + t) - 1 for t in range(1024)])
        filler += 1
        filler_blocks -= 64
    for f in range(filler):
        manager.free(("other", f))
    for p, prompt in enumerate(prompts):
        manager.allocate(("first", p), prompt)
    for p in range(num_prompts):
        manager.free(("first", p))
    cached_free = manager.num_cached_free_blocks
    start = time.perf_counter()
    revived = sum(manager.allocate(("again", p), prompt) for p, prompt in enumerate(prompts))
    elapsed = time.perf_counter() - start
    return {
        "pool_blocks": pool_blocks,
        "cached_free_blocks": cached_free,
        "revived_blocks": revived,
        "readmit_s": round(elapsed, 5),
        "ns_per_revived_block": round(elapsed / revived * 1e9),
    }


def nano_revival_run(pool_blocks: int, num_prompts: int, prompt_tokens: int) -> dict:
    """`revival_run`'s setup through nano-vllm's own block manager, each prompt admitted and prefilled as its
    scheduler does it (`nano_vllm_trace.nano_admit`): other prompts fill the pool and are freed, then
    `num_prompts` prompts are admitted and freed, then admitted again (timed). A hit on a free block takes it
    out of the free deque by value, so each revived block costs a scan of the deque."""
    nano = nano_vllm_trace.nano_vllm()
    nano.Sequence.block_size = BLOCK_SIZE
    manager = nano.BlockManager(pool_blocks, BLOCK_SIZE)
    prompts = [[p * 1_000_003 + t for t in range(prompt_tokens)] for p in range(num_prompts)]
    fillers = []
    filler_blocks = pool_blocks - num_prompts * -(-prompt_tokens // BLOCK_SIZE)
    while filler_blocks >= 64:
        prompt = [-(len(fillers) * 1_000_003 + t) - 1 for t in range(1024)]
        fillers.append(nano_vllm_trace.nano_admit(nano, manager, prompt)[0])
        filler_blocks -= 64
    for seq in fillers:
        manager.deallocate(seq)
    firsts = [nano_vllm_trace.nano_admit(nano, manager, prompt)[0] for prompt in prompts]
    for seq in firsts:
        manager.deallocate(seq)
    start = time.perf_counter()
    again = [nano_vllm_trace.nano_admit(nano, manager, prompt) for prompt in prompts]
    elapsed = time.perf_counter() - start
    revived = sum(hits for _, hits in again)
    return {
        "pool_blocks": pool_blocks,
        "revived_blocks": revived,
        "readmit_s": round(elapsed, 5),
        "ns_per_revived_block": round(elapsed / revived * 1e9),
    }


def snapshot_ms(num_seqs: int) -> float:
    manager = BlockManager(100_000, BLOCK_SIZE, enable_prefix_caching=True)
    for seq in range(num_seqs):
        manager.allocate(seq, list(range(seq, seq + 1000)))
    manager.snapshot()
    start = time.perf_counter()
    for _ in range(5):
        manager.snapshot()
    return round((time.perf_counter() - start) / 5 * 1e3, 2)


REPEATS = 3


def _range(spread: dict) -> dict:
    return {"min": spread["min"], "max": spread["max"]}


def _median(run, key: str) -> dict:
    results = sorted((run() for _ in range(REPEATS)), key=lambda r: r[key])
    return results[len(results) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.block_manager", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer sequences and tokens (a smoke run)")
    parser.add_argument(
        "--nano-vllm",
        metavar="DIR",
        help=f"a nano-vllm checkout to time instead of the pinned copy (or set {nano_vllm_source.ENV_VAR})",
    )
    args = parser.parse_args()
    if args.nano_vllm:
        os.environ[nano_vllm_source.ENV_VAR] = args.nano_vllm
    source = nano_vllm_trace.nano_vllm()
    num_seqs, decode_tokens = (100, 64) if args.quick else (1_000, 512)
    trace_seqs, trace_repeats = (64, 5) if args.quick else (512, 9)
    nano = nano_vllm_trace.compare(NANO_VLLM_BLOCK_SIZE, trace_seqs, 256, trace_repeats)
    nano_16 = nano_vllm_trace.compare(BLOCK_SIZE, trace_seqs, 256, trace_repeats)
    # machines here are noisy: each figure is the median of REPEATS runs
    cached = _median(lambda: decode_run(True, num_seqs, decode_tokens), "tokens_per_s")
    uncached = _median(lambda: decode_run(False, num_seqs, decode_tokens), "tokens_per_s")
    # 500 prompts of 1,024 tokens: 32,000 cached blocks, 31,500 revived (each prompt's last block is recomputed)
    small = _median(lambda: revival_run(40_000, 500, 1024), "ns_per_revived_block")
    large = _median(lambda: revival_run(100_000, 500, 1024), "ns_per_revived_block")
    # nano-vllm scans its free deque per revived block: 8 prompts (512 blocks) keep this to about a second
    nano_small = nano_revival_run(40_000, 8, 1024)
    nano_large = nano_revival_run(100_000, 8, 1024)
    like, loose = "ratio_vs_nano_vllm_block_manager_only", "ratio_vs_nano_vllm"
    result = {
        "nano_vllm_time_ratio": nano[like]["median"],
        "nano_vllm_time_ratio_spread": _range(nano[like]),
        "nano_vllm_time_ratio_goal": 0.5,
        "nano_vllm_time_ratio_with_slot_read": nano[loose]["median"],
        "nano_vllm_time_ratio_with_slot_read_spread": _range(nano[loose]),
        "nano_vllm_time_ratio_block_16": nano_16[like]["median"],
        "nano_vllm_time_ratio_block_16_spread": _range(nano_16[like]),
        "nano_vllm_time_ratio_block_16_with_slot_read": nano_16[loose]["median"],
        "nano_vllm_time_ratio_block_16_with_slot_read_spread": _range(nano_16[loose]),
        "nano_vllm_decode_trace": {"block_256": nano, "block_16": nano_16},
        "nano_vllm_source": source.source,
        "nano_vllm_hash": source.hash_name,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu": cpu_description(),
        "python": platform.python_version(),
        "block_size": BLOCK_SIZE,
        "repeats": REPEATS,
        "num_seqs": num_seqs,
        "decode_tokens_per_seq": decode_tokens,
        "append_tokens_per_s": cached["tokens_per_s"],
        "append_tokens_per_s_no_prefix_caching": uncached["tokens_per_s"],
        "append_target_tokens_per_s": 1_000_000,
        "append_wall_s": cached["wall_s"],
        "appended_tokens": cached["appended_tokens"],
        "revival": {"pool_40k": small, "pool_100k": large},
        "revival_nano_vllm": {"pool_40k": nano_small, "pool_100k": nano_large},
        "revival_ns_per_block_ratio_100k_vs_40k": round(
            large["ns_per_revived_block"] / small["ns_per_revived_block"], 3
        ),
        "snapshot_ms_100k_blocks": snapshot_ms(num_seqs),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
