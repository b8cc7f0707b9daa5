"""Engines for the Engine page's jobs: which model a source names, the operator checks before anything loads, the
model's weights kept in the worker between runs, and a pool check that says what pool would run a request.

Sources: "tiny" (`TINY_LLAMA`, seed-0 random weights, no download), "smollm2" (SmolLM2-135M-Instruct from the
model cache, fetched by `fetch_real_model`; its `path` argument is that cache directory, "" for the default, as
the page found it in the server's environment), "directory" (a Hugging Face directory or a `.gguf` file; with
PAGED_LAB_MODEL_ROOT set, only inside it). Every run gets a fresh engine (a fresh pool); the dequantized weights
of the last GGUF file loaded stay in the worker (`_gguf_parts`, one entry), so a second chat turn does not read
and dequantize the file again.
"""

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from core import common
from core.device import default_device, memory_budget_bytes
from core.engine import Engine, ModelConfig, SamplingParams
from core.engine.config import TINY_LLAMA
from core.engine.engine import engine_bytes
from core.engine.fetch import by_hand, cached_model, fetch_model
from core.engine.gguf_file import gguf_config, gguf_tokenizer, gguf_weights
from core.errors import InvalidArgumentError, ModelFetchError
from core.limits import Limits

REAL_MODEL = "smollm2-135m-instruct"
SOURCES = ("smollm2", "tiny", "directory")


def _no_progress(fraction: float, message: str = "") -> None:
    """For calls outside a worker."""


def fetch_real_model(cache_dir: str, *, progress: Callable = _no_progress) -> str:
    """The Engine page's Fetch button: `fetch_model(REAL_MODEL, cache_dir)` in a worker ("" = the default cache);
    returns the file's path. Raises ModelFetchError (offline, bad download) saying how to fetch by hand."""
    return str(fetch_model(REAL_MODEL, cache_dir or None, progress=progress))


def resolve_model(source: str, path: str, limits: Limits) -> tuple[str, ModelConfig]:
    """(the path to load, its config) for `source`, checked before any weight is read: InvalidArgumentError for
    an unknown source, ModelFetchError when SmolLM2 is not fetched yet, LimitExceededError (PAGED_LAB_MODEL_ROOT)
    for a directory or file outside the operator's model root, ModelLoadError for a bad model."""
    if source not in SOURCES:
        raise InvalidArgumentError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "tiny":
        return "", ModelConfig.from_dict(TINY_LLAMA)
    if source == "smollm2":  # `path` is the model cache the page looked in (the server's, never the user's)
        found = cached_model(REAL_MODEL, path or None)
        if found is None:
            raise ModelFetchError(
                f"SmolLM2-135M-Instruct is not fetched on this server yet: press Fetch, or {by_hand(REAL_MODEL)}"
            )
        path = str(found)
    else:  # before any file is opened: a shared host allows only its model root
        path = limits.check_model_directory(path)
    config = gguf_config(path) if path.lower().endswith(".gguf") else ModelConfig.from_directory(path)
    return path, config


@functools.lru_cache(maxsize=1)
def _gguf_parts(path: str, size: int, mtime_ns: int, device: torch.device):
    """(config, weights, tokenizer) of the GGUF file at `path` (this worker's last one; the file's size and mtime
    in the key, so a replaced file is read again). Dequantized to float32, the file's `checkpoint_dtype`."""
    config = gguf_config(path)
    weights = gguf_weights(path, config, config.checkpoint_dtype, device, memory_budget_bytes())
    return config, weights, gguf_tokenizer(path)


def build_engine(
    source: str, path: str, num_blocks: int, block_size: int, prefix_caching: bool, progress: Callable
) -> Engine:
    """A fresh engine of `source` (see `resolve_model`) on `default_device()`; num_blocks 0 sizes the pool from
    the memory budget. MemoryBudgetError (PAGED_LAB_MAX_BYTES) before anything is allocated when the weights plus
    the pool exceed the operator's tensor-bytes limit."""
    limits = Limits.from_env()
    path, config = resolve_model(source, path, limits)
    device = default_device()
    common.check_budget(
        engine_bytes(config, max(num_blocks, 1), block_size, device),
        f"the model's weights plus a pool of {max(num_blocks, 1):,} KV blocks of {block_size} tokens",
        limits.max_tensor_bytes,
    )
    progress(0.0, "building the engine")
    options = {
        "num_blocks": num_blocks or None,
        "block_size": block_size,
        "enable_prefix_caching": prefix_caching,
    }
    if source == "tiny":
        return Engine.from_config(config, seed=0, device=device, **options)
    if not path.lower().endswith(".gguf"):
        return Engine.from_pretrained(path, device=device, **options)
    stat = Path(path).stat()
    config, weights, tokenizer = _gguf_parts(path, stat.st_size, stat.st_mtime_ns, device)
    return Engine(config, weights, tokenizer=tokenizer, **options)


def check_pool(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> None:
    """Refuse a pool too small for the largest request (InvalidArgumentError), saying which pools run it: from the
    largest request's peak blocks (plus the watermark) up, requests wait or are preempted (recompute) when they do
    not all fit at once; from the sum of all requests' peaks up, every sequence is held at once."""
    memory = engine.memory
    peaks = [memory.peak_blocks(len(p), params.max_tokens, params.num_sequences) for p in prompts]
    if max(peaks) <= memory.num_blocks - memory.watermark_blocks:
        return
    smallest, roomy = _pool_for(max(peaks), memory.watermark), _pool_for(sum(peaks), memory.watermark)
    if roomy > smallest:
        runs = (
            f"a pool of {smallest:,} to {roomy - 1:,} blocks runs them with requests waiting or preempted "
            f"(recompute), {roomy:,} or more holds every sequence at once"
        )
    else:
        runs = f"{smallest:,} blocks or more run it"
    raise InvalidArgumentError(
        f"a pool of {memory.num_blocks:,} blocks is too small: the largest request needs {max(peaks):,} blocks of "
        f"{memory.block_size} tokens at its longest (prompt + {params.max_tokens:,} new tokens, "
        f"{params.num_sequences} sequence(s)) plus the watermark; {runs}"
    )


def _pool_for(blocks: int, watermark: float) -> int:
    """The smallest pool whose blocks less its watermark (`int(watermark * pool)`) hold `blocks`."""
    pool = blocks
    while pool - int(watermark * pool) < blocks:
        pool += 1
    return pool
