"""Memory saved by sharing KV blocks, measured on real engine runs as in the paper's Figure 15.

saving = mean over the run's steps of 1 - blocks in use / blocks the same live sequences would hold without
sharing (the sum of their block-table lengths); steps that hold no block are left out. Parallel samples share
their prompt's blocks; beams share their common history as well, so beam search saves much more.

The workload is `core.serving.workload.alpaca` (prompt and output lengths of the Alpaca data set, the paper's
Figure 15 workload); every request's prompt is random token ids of its length and it generates exactly its
output length (`ignore_eos`), all submitted at once. The model is a tiny random Llama: sharing depends on
lengths and block arithmetic, not on the weights.
"""

import numpy as np
import pandas as pd

from core.common import cdiv, check_budget, check_int
from core.engine.config import TINY_LLAMA, ModelConfig
from core.engine.engine import Engine, engine_bytes
from core.engine.sampling import SamplingParams
from core.errors import InvalidArgumentError
from core.serving.workload import alpaca

# Figure 15 (Alpaca, OPT-13B): % of KV blocks saved, by (mode, number of outputs or beam width)
PAPER_SAVING_PCT = {
    ("parallel sampling", 2): 6.1,
    ("parallel sampling", 4): 8.5,
    ("parallel sampling", 6): 9.8,
    ("beam search", 2): 37.6,
    ("beam search", 4): 53.1,
    ("beam search", 6): 55.2,
}


def sharing_params(
    mode: str, width: int, max_tokens: int, seed: int, ignore_eos: bool = True
) -> SamplingParams:
    """n = width samples at temperature 1.0, or beam search of that width; EOS ignored unless ignore_eos=False."""
    if mode == "parallel sampling":
        return SamplingParams(max_tokens, n=width, seed=seed, ignore_eos=ignore_eos)
    if mode == "beam search":
        return SamplingParams(max_tokens, beam_width=width, ignore_eos=ignore_eos)
    raise InvalidArgumentError(f"mode must be 'parallel sampling' or 'beam search', got {mode!r}")


def measure_prompt_sharing(
    engine: Engine,
    prompts: list[list[int]],
    widths: tuple[int, ...],
    max_tokens: list[int],
    *,
    seed: int = 0,
    ignore_eos: bool = True,
    progress=None,
    modes: tuple[str, ...] = ("parallel sampling", "beam search"),
) -> pd.DataFrame:
    """The sharing of `engine` on `prompts` (token ids; all submitted at once), request i generating up to
    `max_tokens[i]` tokens, once per (mode, width): each of `modes` (parallel sampling then beam search by
    default), each width in turn.
    ignore_eos=False lets each output end at the model's EOS, as a trained model's answers do.

    One row per run: mode, width, saving_pct (ours), paper_pct (Figure 15, NaN where the paper has none),
    mean_blocks_in_use, mean_blocks_without_sharing (over the steps holding a block), steps, requests,
    output_tokens (all outputs' tokens: samples, or the beam_width returned beams). progress(fraction) after
    every step, over all runs."""
    rows = []
    runs = [(m, w) for m in modes for w in widths]
    for index, (mode, width) in enumerate(runs):
        params = [sharing_params(mode, width, n, seed, ignore_eos) for n in max_tokens]
        outputs = engine.generate(
            prompts,
            params,
            progress=None if progress is None else lambda f, i=index: progress((i + f) / len(runs)),
        )
        steps = engine.last_run.steps
        held = steps[steps["blocks_without_sharing"] > 0]
        rows.append(
            {
                "mode": mode,
                "width": width,
                "saving_pct": 100.0 * engine.last_run.sharing_saving(),
                "paper_pct": PAPER_SAVING_PCT.get((mode, width), float("nan")),
                "mean_blocks_in_use": float(held["blocks_in_use"].mean()),
                "mean_blocks_without_sharing": float(held["blocks_without_sharing"].mean()),
                "steps": len(steps),
                "requests": len(prompts),
                "output_tokens": sum(len(c.token_ids) for o in outputs for c in o.outputs),
            }
        )
    return pd.DataFrame(rows)


def measure_sharing(
    num_requests: int = 16,
    widths: tuple[int, ...] = (2, 4, 6),
    *,
    seed: int = 0,
    block_size: int = 16,
    max_output_len: int = 256,
    engine: Engine | None = None,
    progress=None,
) -> pd.DataFrame:
    """One row per (mode, width), as `measure_prompt_sharing` gives, on the Alpaca-length random workload.

    Output lengths are capped at `max_output_len` tokens to keep CPU runs short. `engine` defaults to a tiny
    random Llama on `default_device()` with a pool roomy enough that nothing is preempted, refused with
    MemoryBudgetError (PAGED_LAB_MAX_BYTES) before anything is allocated when it would not fit the budget.
    progress(fraction) after every engine step, fraction over all the runs (the last call 1.0).
    """
    num_requests = check_int(num_requests, "num_requests", minimum=1)
    requests = alpaca(num_requests, seed=seed, max_len=2048)
    rng = np.random.default_rng(seed)
    if engine is None:
        longest = max(r.prompt_len + min(r.output_len, max_output_len) for r in requests)
        blocks = num_requests * max(widths) * (cdiv(longest, block_size) + 1) + 16
        config = ModelConfig.from_dict(TINY_LLAMA)
        check_budget(
            engine_bytes(config, blocks, block_size),
            f"the sharing measurement's tiny Llama with a pool of {blocks:,} KV blocks of {block_size} tokens",
        )
        engine = Engine.from_config(
            config,
            seed=seed,
            num_blocks=blocks,
            block_size=block_size,
            max_num_seqs=1024,
            max_num_batched_tokens=4096,
        )
    vocab = engine.config.vocab_size
    prompts = [rng.integers(0, vocab, r.prompt_len).tolist() for r in requests]
    lengths = [min(r.output_len, max_output_len) for r in requests]
    return measure_prompt_sharing(engine, prompts, widths, lengths, seed=seed, progress=progress)
