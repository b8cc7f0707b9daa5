"""Timing paged attention against the contiguous baseline, shared by bench/attention.py and the Kernels page.

Everything is measured in the same run on the same machine: the contiguous baseline is the faster of
`contiguous_attention(method="sdpa")` and `method="matmul"` on the same K/V laid out contiguously, and the
machine's copy bandwidth is `dst.copy_(src)` into a preallocated tensor counting bytes read + written.
Timings go through `core.kernels.timer` (the same process settings, warm-up and interleaved repeats
everywhere) and keep their spread: every time, ratio and bandwidth comes with its quartiles.
"""

from dataclasses import dataclass

import torch

from core import common
from core.common import cdiv, check_int
from core.device import memory_budget_bytes
from core.errors import InvalidArgumentError
from core.kernels.attention import contiguous_attention, gather_contiguous, paged_attention
from core.kernels.timer import NOISY_SPREAD, apply_timing_settings, relative_spread, spread, time_interleaved

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class KernelConfig:
    """One decode-attention problem: `batch` sequences of `context_len` tokens each."""

    batch: int
    context_len: int
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: str = "float32"
    sliding_window: int | None = None  # None: full attention; W: each query sees its last W positions

    def validate(self) -> None:
        for name in ("batch", "context_len", "num_heads", "num_kv_heads", "head_dim", "block_size"):
            check_int(getattr(self, name), name, minimum=1)
        if self.sliding_window is not None:
            check_int(self.sliding_window, "sliding_window", minimum=1)
        if self.num_heads % self.num_kv_heads:
            raise InvalidArgumentError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.dtype not in DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def visible_tokens(self) -> int:
        """Tokens one query attends to: context_len, or min(context_len, sliding_window)."""
        return self.context_len if self.sliding_window is None else min(self.context_len, self.sliding_window)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V one decode step reads: 2 x batch x visible tokens x kv_heads x head_dim x itemsize."""
        return 2 * self.batch * self.visible_tokens * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def cache_bytes(self) -> int:
        """Bytes of the paged K and V cache: 2 x batch x context x kv_heads x head_dim x itemsize."""
        return 2 * self.batch * self.context_len * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def footprint_bytes(self) -> int:
        """Bytes a measurement allocates: the paged cache, its contiguous copy, and the gather backend's copy."""
        return 3 * self.cache_bytes


def check_budget(config: KernelConfig, budget: int | None = None) -> None:
    """Raise MemoryBudgetError (before anything is allocated) when the problem would not fit the budget."""
    config.validate()
    common.check_budget(
        config.footprint_bytes,
        f"batch {config.batch:,} x context {config.context_len:,} tokens x {config.num_kv_heads} KV heads x "
        f"{config.head_dim} dims ({config.dtype}; paged cache + contiguous copy + gathered copy)",
        budget,
    )


def random_block_tables(
    batch: int,
    context_len: int,
    block_size: int,
    ragged: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables for `batch` sequences sharing a pool of exactly the blocks they need, handed out in a random
    order. Returns (block_tables [batch, ceil(context_len / block_size)] int32, -1 past a sequence's last block;
    context_lens [batch] int32: all context_len, or with `ragged` random in [1, context_len], the last = context_len).
    """
    gen = generator or torch.Generator().manual_seed(0)
    blocks_per_seq = cdiv(context_len, block_size)
    context_lens = torch.full((batch,), context_len, dtype=torch.int32)
    if ragged:
        context_lens = torch.randint(1, context_len + 1, (batch,), generator=gen, dtype=torch.int32)
        context_lens[-1] = context_len
    used = cdiv(context_lens.long(), block_size)  # [batch] blocks each sequence owns
    block_tables = torch.full((batch, blocks_per_seq), -1, dtype=torch.int32)
    owned = torch.arange(blocks_per_seq)[None, :] < used[:, None]  # [batch, blocks_per_seq]
    block_tables[owned] = torch.randperm(int(used.sum()), generator=gen).to(torch.int32)
    return block_tables, context_lens


def make_problem(
    config: KernelConfig, device: torch.device | str = "cpu", seed: int = 0, ragged: bool = False
) -> dict[str, torch.Tensor]:
    """Random paged problem, plus the same K/V laid out contiguously.

    Every sequence has `context_len` tokens, or with `ragged` random lengths in [1, context_len] whose last is
    context_len (block table entries past a sequence's last block are then -1). Blocks are handed out in a random
    order, not sequentially. Keys: query, key_cache, value_cache, block_tables, context_lens (paged) and key,
    value ([batch, max context_len, kv_heads, head_dim], contiguous, zero past each length).
    """
    check_budget(config)
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    block_tables, context_lens = random_block_tables(
        config.batch, config.context_len, config.block_size, ragged=ragged, generator=gen
    )
    num_blocks = int(block_tables.max()) + 1
    shape = (num_blocks, config.block_size, config.num_kv_heads, config.head_dim)
    key_cache = torch.randn(shape, generator=gen, dtype=torch.float32).to(config.torch_dtype).to(device)
    value_cache = torch.randn(shape, generator=gen, dtype=torch.float32).to(config.torch_dtype).to(device)
    query = torch.randn(config.batch, config.num_heads, config.head_dim, generator=gen).to(config.torch_dtype)
    problem = {
        "query": query.to(device),
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_tables": block_tables.to(device),
        "context_lens": context_lens.to(device),
    }
    key, value = gather_contiguous(key_cache, value_cache, problem["block_tables"], problem["context_lens"])
    problem["key"], problem["value"] = key.contiguous(), value.contiguous()
    return problem


def copy_bandwidth(
    device: torch.device | str = "cpu",
    nbytes: int = 256 * 1024**2,
    repeats: int = 7,
    malloc_tuning: bool = True,
) -> dict[str, float]:
    """GB/s (1e9 bytes) of `dst.copy_(src)` into a preallocated tensor, counting bytes read + written: the
    `timer.spread` of the rounds (median, p25, p75, min, max; p25 is the slower quarter's edge)."""
    apply_timing_settings(malloc_tuning)
    device = torch.device(device)
    nbytes = min(nbytes, max(memory_budget_bytes() // 2, 1024**2))
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    run = time_interleaved({"copy": lambda: dst.copy_(src)}, device, repeats=repeats)
    return spread([2 * src.numel() * 4 / (ms / 1e3) / 1e9 for ms in run.samples["copy"]])


def copy_bandwidth_gbps(
    device: torch.device | str = "cpu", nbytes: int = 256 * 1024**2, repeats: int = 7
) -> float:
    """The median of `copy_bandwidth`."""
    return copy_bandwidth(device, nbytes, repeats)["median"]


def _sig(value: float, digits: int = 4) -> float:
    """`value` rounded to `digits` significant digits (JSON stays readable, small numbers keep their precision)."""
    return float(f"{value:.{digits}g}")


def _quartiles(
    name: str, stats: dict[str, float], scale: float = 1.0, invert: bool = False
) -> dict[str, float]:
    """{name: median, name_p25, name_p75} of `stats` times `scale`, or of scale / value with `invert` (a rate:
    its lower quartile comes from the slower quartile of the times)."""
    if invert:
        return {
            name: _sig(scale / stats["median"]),
            f"{name}_p25": _sig(scale / stats["p75"]),
            f"{name}_p75": _sig(scale / stats["p25"]),
        }
    return {
        name: _sig(stats["median"] * scale),
        **{f"{name}_{q}": _sig(stats[q] * scale) for q in ("p25", "p75")},
    }


def _timing_fns(p: dict[str, torch.Tensor], backends: list[str], window: int | None) -> dict:
    paged_args = (p["query"], p["key_cache"], p["value_cache"], p["block_tables"], p["context_lens"])
    fns = {
        f"paged:{backend}": (
            lambda backend=backend: paged_attention(*paged_args, backend=backend, sliding_window=window)
        )
        for backend in backends
    }
    for method in ("sdpa", "matmul"):
        fns[f"contiguous:{method}"] = lambda method=method: contiguous_attention(
            p["query"], p["key"], p["value"], p["context_lens"], method=method, sliding_window=window
        )
    return fns


def measure(
    config: KernelConfig,
    backends: list[str],
    device: torch.device | str = "cpu",
    repeats: int = 7,
    seed: int = 0,
    warmup: int = 2,
    malloc_tuning: bool = True,
) -> list[dict]:
    """Time paged attention per backend and the contiguous baseline on one problem, after
    `apply_timing_settings(malloc_tuning)`, `warmup` untimed and `repeats` timed interleaved rounds.

    Returns one dict per backend: batch, context_len, dtype, sliding_window, backend; paged_ms and contiguous_ms
    (the faster of sdpa and matmul by median, named in contiguous_method) with their quartiles (`_p25`, `_p75`);
    ratio = the median over rounds of paged / contiguous in the same round (pairs cancel slow drifts of the
    machine), with its quartiles; achieved_gbps = K/V bytes read / paged time and contiguous_gbps, with
    quartiles; spread_pct = interquartile range / median of paged_ms in percent, noisy = it exceeds
    timer.NOISY_SPREAD; repeats; the machine's load (other_cores, cpus, load_avg, busy: see `timer.MachineLoad`); the settings (malloc_tuning, threads, niceness);
    max_abs_err (paged vs contiguous output).
    """
    settings = apply_timing_settings(malloc_tuning)
    device = torch.device(device)
    p = make_problem(config, device, seed)
    window = config.sliding_window
    run = time_interleaved(_timing_fns(p, backends, window), device, repeats=repeats, warmup=warmup)
    method = min(("sdpa", "matmul"), key=lambda m: run.median(f"contiguous:{m}"))
    contiguous = run.samples[f"contiguous:{method}"]
    reference = contiguous_attention(
        p["query"], p["key"], p["value"], p["context_lens"], method=method, sliding_window=window
    ).float()
    paged_args = (p["query"], p["key_cache"], p["value_cache"], p["block_tables"], p["context_lens"])
    results = []
    for backend in backends:
        paged = run.samples[f"paged:{backend}"]
        ratios = [a / b for a, b in zip(paged, contiguous, strict=True)]
        got = paged_attention(*paged_args, backend=backend, sliding_window=window)
        results.append(
            {
                "batch": config.batch,
                "context_len": config.context_len,
                "dtype": config.dtype,
                "sliding_window": window,
                "backend": backend,
                **_quartiles("paged_ms", spread(paged)),
                **_quartiles("contiguous_ms", spread(contiguous)),
                **_quartiles("ratio", spread(ratios)),
                **_quartiles("achieved_gbps", spread(paged), config.kv_bytes / 1e6, invert=True),
                **_quartiles("contiguous_gbps", spread(contiguous), config.kv_bytes / 1e6, invert=True),
                "contiguous_method": method,
                "spread_pct": _sig(100 * relative_spread(spread(paged)), 3),
                "noisy": relative_spread(spread(paged)) > NOISY_SPREAD,
                "repeats": repeats,
                "other_cores": None if run.load.other_cores is None else _sig(run.load.other_cores, 3),
                "load_avg": _sig(run.load.load_avg, 3),
                "busy": run.load.busy,
                "cpus": run.load.cpus,
                **settings.as_dict(),
                "max_abs_err": (got.float() - reference).abs().max().item(),
            }
        )
    return results


def correctness(config: KernelConfig, backends: list[str], device="cpu", seed: int = 0) -> dict[str, float]:
    """Max abs difference between paged attention (each backend) and `contiguous_attention` on the same ragged
    problem (random lengths, -1 padding in the block tables), with the config's sliding window on both sides.
    Compared in float32."""
    p = make_problem(config, device, seed, ragged=True)
    window = config.sliding_window
    reference = contiguous_attention(
        p["query"], p["key"], p["value"], p["context_lens"], sliding_window=window
    ).float()
    paged_args = (p["query"], p["key_cache"], p["value_cache"], p["block_tables"], p["context_lens"])
    errors = {}
    for backend in backends:
        got = paged_attention(*paged_args, backend=backend, sliding_window=window)
        errors[backend] = (got.float() - reference).abs().max().item()
    return errors


def tolerance(dtype: str) -> float:
    """Max abs difference between two correct float32 kernels (1e-4) or half-precision kernels (2e-2)."""
    return 1e-4 if dtype == "float32" else 2e-2


def sweep_contexts(context_len: int, block_size: int, points: int = 4) -> list[int]:
    """Context lengths for a latency sweep: halving from `context_len`, at least one block, ascending."""
    contexts = []
    value = context_len
    while len(contexts) < points and value >= block_size:
        contexts.append(value)
        value //= 2
    return sorted(set(contexts)) or [context_len]
