"""Time the block manager's hot paths and print one JSON object.

- append_tokens_per_s: append_token throughput for 1,000 sequences x 512 decode tokens, with forks (parallel
  sampling) and frees along the way, prefix caching on (and, for comparison, off). Pure Python: one core.
- revival: re-admitting prompts whose blocks are cached but free. The same prompts are re-admitted in a pool of
  40,000 and of 100,000 blocks, every free block cached; time per revived block must not grow with the cached
  free list (no scan).
- snapshot_ms: BlockManager.snapshot() of a 100,000-block pool holding ~1,000 sequences.

Usage: python -m bench.block_manager [--quick]
"""

import argparse
import json
import platform
import time

from core.paging.block_manager import BlockManager

BLOCK_SIZE = 16


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


def _median(run, key: str) -> dict:
    results = sorted((run() for _ in range(REPEATS)), key=lambda r: r[key])
    return results[len(results) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sequences and tokens (a smoke run)")
    args = parser.parse_args()
    num_seqs, decode_tokens = (100, 64) if args.quick else (1_000, 512)
    # machines here are noisy: each figure is the median of REPEATS runs
    cached = _median(lambda: decode_run(True, num_seqs, decode_tokens), "tokens_per_s")
    uncached = _median(lambda: decode_run(False, num_seqs, decode_tokens), "tokens_per_s")
    # 500 prompts of 1,024 tokens: 32,000 cached blocks, 31,500 revived (each prompt's last block is recomputed)
    small = _median(lambda: revival_run(40_000, 500, 1024), "ns_per_revived_block")
    large = _median(lambda: revival_run(100_000, 500, 1024), "ns_per_revived_block")
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
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
        "revival_ns_per_block_ratio_100k_vs_40k": round(
            large["ns_per_revived_block"] / small["ns_per_revived_block"], 3
        ),
        "snapshot_ms_100k_blocks": snapshot_ms(num_seqs),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
