"""nano-vllm's decode trace, run through our `BlockManager` and through nano-vllm's own block manager in one process.

nano-vllm's side is its own code (`bench.nano_vllm_source`: its `BlockManager` and `Sequence`, loaded from its
source), called as its engine calls it; nothing of it is re-implemented here.

The trace (prefix caching on; a pool of TRACE_POOL_BLOCKS blocks, so nothing is evicted or preempted):
  1. untimed: N sequences are admitted, sequence i with the prompt SYSTEM + 20 + i % 16 tokens of its own,
     SYSTEM being 256 tokens every prompt shares (one full block at block size 256, sixteen at 16), so every
     prompt after the first hits the prefix cache for SYSTEM's blocks. nano-vllm: `can_allocate`, `allocate`,
     then its prefill's postprocess (`hash_blocks`, the sequence's cached tokens moved up); ours: `allocate`.
  2. timed, T decode steps: in each step every sequence, in admission order, receives one token (fixed,
     precomputed per sequence and step, values below 50,000 like a vocabulary's) and room for it:
     - ours: `append_token(seq, token)`, which records the token, takes a block when the token starts one,
       hashes and caches the block the token fills, and returns the token's slot (an `AppendResult`);
     - nano-vllm, "nano_vllm_block_manager_only" (the headline's baseline): what its engine does for the token's
       blocks, in its order: `seq.append_token(token)` (the scheduler's postprocess of the step before),
       `can_append(seq)`, `seq.num_scheduled_tokens = 1` and `may_append(seq)` (its scheduler's decode pass),
       then `hash_blocks(seq)` and the sequence's cached / scheduled counts moved on (its postprocess);
     - "nano_vllm": the same plus the slot its model runner reads for the token (`prepare_decode`,
       `block_table[-1] * block_size + last_block_num_tokens - 1`), which our `append_token` returns: the same
       work on both sides. The block-manager-only baseline is stricter (our side still builds the slot);
  3. timed, every sequence is freed in admission order: ours `free(seq)`; nano-vllm's `deallocate(seq)`, then
     its sequence objects are dropped (our `free` drops the sequence's token list with it).
With T = 256 and prompts of 276..291 tokens, at block size 256 each sequence fills one block and takes one new
block during step 2; at block size 16, 16 of each. Both sides end step 2 with the same block tables, the same
blocks keyed, and keys equal exactly where the other side's are (checked once per comparison, before anything is
timed): the same work. The keys themselves differ: nano-vllm's are xxhash64 digests, ours vLLM's chained keys.

Timing: each side's steps 2 and 3 in this thread's CPU time (`time.thread_time`), so that time spent
descheduled on a shared machine counts for neither side; the sides run in turn, the order rotating every
repetition, and each ratio is ours / theirs within one repetition. The garbage collector stays on (both sides
allocate; that is part of their cost).
"""

import functools
import gc
import statistics
import time

from bench import nano_vllm_source
from core.paging.block_manager import BlockManager

TRACE_POOL_BLOCKS = 40_000
SYSTEM_TOKENS = 256
_clock = time.thread_time


@functools.cache
def nano_vllm(root: str | None = None) -> nano_vllm_source.NanoVllm:
    """nano-vllm's classes, loaded once per source (`nano_vllm_source.load`)."""
    return nano_vllm_source.load(root)


def trace_prompts(num_seqs: int) -> list[list[int]]:
    """Sequence i's prompt: the shared system prompt, then 20 + i % 16 tokens of its own."""
    system = list(range(1_000_000, 1_000_000 + SYSTEM_TOKENS))
    return [system + [i * 1_000 + t for t in range(20 + i % 16)] for i in range(num_seqs)]


def trace_tokens(num_seqs: int, steps: int) -> list[list[int]]:
    """tokens[step][i]: the token sequence i receives at decode step `step`."""
    return [[(i * 7_919 + step * 13) % 50_000 for i in range(num_seqs)] for step in range(steps)]


def _state(tables: list[list[int]], keys: list[list]) -> list[tuple[list[int], list]]:
    """Each table with its blocks' keys renamed 0, 1, 2, ... in order of first appearance (None: no key), so
    that two sides with different hash functions compare equal when they key the same blocks alike."""
    names: dict = {}
    return [
        (table, [None if k is None else names.setdefault(k, len(names)) for k in seq_keys])
        for table, seq_keys in zip(tables, keys, strict=True)
    ]


def ours_trace(block_size: int, prompts: list, tokens: list, check: bool = False) -> dict:
    """Steps 1-3 through `BlockManager`: {"decode_s", "free_s", "state"}; `state` (`_state` of the tables after
    step 2) only when `check`."""
    manager = BlockManager(TRACE_POOL_BLOCKS, block_size, enable_prefix_caching=True)
    # the ids, held as nano-vllm's scheduler holds its sequence objects: the very objects admitted (an equal int
    # >= 256 is another object, and a lookup by it compares values)
    seqs = list(range(len(prompts)))
    for seq, prompt in zip(seqs, prompts, strict=True):
        manager.allocate(seq, prompt)
    append = manager.append_token
    gc.collect()
    start = _clock()
    for step_tokens in tokens:
        for seq, token in zip(seqs, step_tokens, strict=True):
            append(seq, token)
    decoded = _clock()
    state = None
    if check:
        tables = [manager.block_table(seq) for seq in seqs]
        state = _state(tables, [[manager.pool.block_hash(b) for b in table] for table in tables])
    freeing = _clock()
    free = manager.free
    for seq in seqs:
        free(seq)
    end = _clock()
    assert manager.num_free_blocks == TRACE_POOL_BLOCKS
    return {"decode_s": decoded - start, "free_s": end - freeing, "state": state}


def nano_admit(nano: nano_vllm_source.NanoVllm, manager, prompt: list[int]):
    """A prompt admitted and prefilled whole as nano-vllm's scheduler does it: `can_allocate` (the cached
    blocks, -1 when it does not fit), `allocate`, then the prefill's postprocess (`hash_blocks` keys the full
    blocks just computed; every token is then cached). Returns nano-vllm's `Sequence` and how many of its
    leading blocks were prefix-cache hits."""
    seq = nano.Sequence(prompt)
    num_cached_blocks = manager.can_allocate(seq)
    if num_cached_blocks == -1:
        raise RuntimeError("the pool is sized so that every prompt fits")
    manager.allocate(seq, num_cached_blocks)
    seq.num_scheduled_tokens = seq.num_tokens - seq.num_cached_tokens
    manager.hash_blocks(seq)
    seq.num_cached_tokens += seq.num_scheduled_tokens
    seq.num_scheduled_tokens = 0
    return seq, num_cached_blocks


def _nano_steps(manager, seqs: list, tokens: list) -> None:
    """Step 2 as nano-vllm's engine runs it, the calls that keep the token's blocks only."""
    can_append, may_append, hash_blocks = manager.can_append, manager.may_append, manager.hash_blocks
    for step_tokens in tokens:
        for seq, token in zip(seqs, step_tokens, strict=True):
            seq.append_token(token)
            if not can_append(seq):
                raise RuntimeError("the trace's pool is sized so that nothing is preempted")
            seq.num_scheduled_tokens = 1
            may_append(seq)
            hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0


def _nano_steps_with_slots(manager, seqs: list, tokens: list) -> None:
    """`_nano_steps`, plus the slot nano-vllm's model runner reads for each token."""
    can_append, may_append, hash_blocks = manager.can_append, manager.may_append, manager.hash_blocks
    bs = manager.block_size
    for step_tokens in tokens:
        for seq, token in zip(seqs, step_tokens, strict=True):
            seq.append_token(token)
            if not can_append(seq):
                raise RuntimeError("the trace's pool is sized so that nothing is preempted")
            seq.num_scheduled_tokens = 1
            may_append(seq)
            _slot = seq.block_table[-1] * bs + seq.last_block_num_tokens - 1
            hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0


def nano_trace(
    block_size: int, prompts: list, tokens: list, check: bool = False, with_slots: bool = True
) -> dict:
    """Steps 1-3 through nano-vllm's own block manager, as `ours_trace` returns them."""
    nano = nano_vllm()
    nano.Sequence.block_size = block_size  # as nano-vllm's engine sets it from its config
    manager = nano.BlockManager(TRACE_POOL_BLOCKS, block_size)
    seqs = [nano_admit(nano, manager, prompt)[0] for prompt in prompts]
    steps = _nano_steps_with_slots if with_slots else _nano_steps
    gc.collect()
    start = _clock()
    steps(manager, seqs, tokens)
    decoded = _clock()
    state = None
    if check:
        blocks = manager.blocks
        keys = [[None if blocks[b].hash == -1 else blocks[b].hash for b in s.block_table] for s in seqs]
        state = _state([list(s.block_table) for s in seqs], keys)
    freeing = _clock()
    deallocate = manager.deallocate
    for seq in seqs:
        deallocate(seq)
    del seq
    seqs.clear()  # the sequences go too, as our `free` drops its sequence's tokens
    end = _clock()
    assert len(manager.free_block_ids) == TRACE_POOL_BLOCKS
    return {"decode_s": decoded - start, "free_s": end - freeing, "state": state}


SIDES = {
    "ours": ours_trace,
    "nano_vllm": nano_trace,
    "nano_vllm_block_manager_only": lambda bs, p, t: nano_trace(bs, p, t, with_slots=False),
}


def spread(values: list[float], digits: int) -> dict:
    """{"median", "min", "max"} of `values`, rounded."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def compare(block_size: int, num_seqs: int, steps: int, repeats: int) -> dict:
    """Every side of SIDES on the same trace, `repeats` times each, in turn (the order rotates).

    Returns the trace's parameters; for each nano-vllm side X, `ratio_vs_X` (ours / X over steps 2 + 3),
    `decode_ratio_vs_X` (step 2) and `free_ratio_vs_X` (step 3), each the median, min and max over the
    repetitions of the per-repetition ratio; and per side its ns per decode token and us per freed sequence.
    Raises RuntimeError when the sides disagree on the trace's final tables or keys."""
    prompts, tokens = trace_prompts(num_seqs), trace_tokens(num_seqs, steps)
    ours = ours_trace(block_size, prompts, tokens, check=True)["state"]
    if ours != nano_trace(block_size, prompts, tokens, check=True)["state"]:
        raise RuntimeError("the two sides disagree on the trace's block tables or keys: not the same work")
    names = list(SIDES)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            runs[name].append(SIDES[name](block_size, prompts, tokens))

    def ratios(other: str, key) -> dict:
        return spread([key(o) / key(n) for o, n in zip(runs["ours"], runs[other], strict=True)], 3)

    result: dict = {
        "trace": {"block_size": block_size, "num_seqs": num_seqs, "decode_steps": steps, "repeats": repeats}
    }
    for other in names[1:]:
        result[f"ratio_vs_{other}"] = ratios(other, lambda r: r["decode_s"] + r["free_s"])
        result[f"decode_ratio_vs_{other}"] = ratios(other, lambda r: r["decode_s"])
        result[f"free_ratio_vs_{other}"] = ratios(other, lambda r: r["free_s"])
    for name in names:
        result[name] = {
            "decode_ns_per_token": spread([r["decode_s"] / (num_seqs * steps) * 1e9 for r in runs[name]], 1),
            "free_us_per_seq": spread([r["free_s"] / num_seqs * 1e6 for r in runs[name]], 2),
        }
    return result
