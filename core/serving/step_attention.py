"""Measured attention latency of the simulated batches: the real kernels on each sampled step's actual batch.

For every sampled step of a paged simulation, the decoding sequences' real block tables and context lengths are
replayed on a KV pool of the simulation's size with a scaled-down head count (default 8 KV heads x 64 dims, fp32,
so that it fits the app's memory budget on any machine): `paged_attention` reads through the block tables,
`contiguous_attention` reads a padded copy [num_seqs, longest context, heads, dim] of the same K/V (the copy is
made outside the timed region). Both are timed on the same device; nothing here is modelled.
"""

import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from core.common import cdiv, check_budget, time_ms
from core.device import default_device
from core.errors import InvalidArgumentError


def _default_kernels() -> tuple[Callable, Callable]:
    from core.kernels.attention import contiguous_attention, paged_attention

    return paged_attention, contiguous_attention


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, repeats: int, device: torch.device) -> float:
    """Median milliseconds of `repeats` calls after one warm-up call (device work included)."""
    median, _ = time_ms(fn, repeats=repeats, warmup=1, sync=lambda: _sync(device))
    return float(median)


def _spread(count: int) -> list[int]:
    """0..count-1 ordered so that any prefix is spread over the whole range (coarse to fine)."""
    order, seen = [], set()
    stride = 1 << max(0, (count - 1).bit_length())
    while stride >= 1:
        for i in range(0, count, stride):
            if i not in seen:
                seen.add(i)
                order.append(i)
        stride //= 2
    return order


COLUMNS = [
    "step",
    "time_s",
    "num_seqs",
    "total_context_tokens",
    "max_context_tokens",
    "padded_tokens",
    "paged_ms",
    "contiguous_ms",
]


def _random_pool(shape: tuple[int, int, int, int], dtype, device, gen):
    """Random K and V caches of `shape` = [num_blocks, block_size, kv_heads, head_dim] on `device`."""
    key_cache = torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)
    value_cache = torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)
    return key_cache, value_cache


def _check_memory(snaps: list, num_blocks: int, bs: int, num_kv_heads: int, head_dim: int, dtype) -> None:
    """MemoryBudgetError when the pool or the largest padded copy would exceed the memory budget."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    pool_bytes = 2 * num_blocks * bs * num_kv_heads * head_dim * itemsize
    padded_peak = max(len(s.context_lens) * int(s.context_lens.max()) for s in snaps)
    padded_bytes = 2 * padded_peak * num_kv_heads * head_dim * itemsize
    check_budget(
        max(pool_bytes, padded_bytes),
        "measuring attention (one tensor; use fewer heads or a smaller head_dim)",
    )


class _Bench(NamedTuple):
    """What every measured step shares: the random K/V caches, the (paged, contiguous) kernels, the query heads,
    timed repeats, the device and the generator the queries are drawn from."""

    caches: tuple[torch.Tensor, torch.Tensor]
    kernels: tuple[Callable, Callable]
    num_heads: int
    repeats: int
    device: torch.device
    gen: torch.Generator


def _measure_step(snap, bench: _Bench) -> tuple:
    """One row of `measure_step_attention`: the step's decoding batch through both kernels."""
    key_cache, value_cache = bench.caches
    paged_fn, contiguous_fn = bench.kernels
    num_heads, repeats, device, gen = bench.num_heads, bench.repeats, bench.device, bench.gen
    _, bs, num_kv_heads, head_dim = key_cache.shape
    lens_np = snap.context_lens
    num_seqs, max_len = len(lens_np), int(lens_np.max())
    tables = torch.from_numpy(snap.block_tables.astype(np.int64)).clamp_min(0).to(device)
    lens = torch.from_numpy(lens_np.astype(np.int64)).to(device)
    query = torch.randn(num_seqs, num_heads, head_dim, generator=gen).to(device=device, dtype=key_cache.dtype)
    # contiguous copy of the same K/V: [num_seqs, max_len, kv_heads, head_dim], padded past each length
    width = cdiv(max_len, bs)
    flat = tables[:, :width].reshape(-1)
    key = key_cache.index_select(0, flat).view(num_seqs, width * bs, num_kv_heads, head_dim)[:, :max_len]
    value = value_cache.index_select(0, flat).view(num_seqs, width * bs, num_kv_heads, head_dim)[:, :max_len]
    key, value = key.contiguous(), value.contiguous()
    paged_ms = _time(lambda: paged_fn(query, key_cache, value_cache, tables, lens), repeats, device)
    contiguous_ms = _time(lambda: contiguous_fn(query, key, value, lens), repeats, device)
    total = int(lens_np.sum())
    return snap.step, snap.time_s, num_seqs, total, max_len, num_seqs * max_len, paged_ms, contiguous_ms


def measure_step_attention(
    result,
    num_kv_heads: int = 8,
    num_heads: int | None = None,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    time_budget_s: float = 2.0,
    repeats: int = 3,
    paged_fn: Callable | None = None,
    contiguous_fn: Callable | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Time paged vs contiguous decode attention on the sampled steps of a paged `SimulationResult`.

    Steps are visited coarse to fine over the run until `time_budget_s` is spent (every sampled step when the run
    is small). paged_fn / contiguous_fn default to core.kernels.attention's `paged_attention` / `contiguous_attention`
    (same signatures). Returns one row per measured step, sorted by step: step, time_s, num_seqs,
    total_context_tokens, max_context_tokens, padded_tokens (num_seqs x max context), paged_ms, contiguous_ms.
    Raises InvalidArgumentError for a non-paged result and MemoryBudgetError when the pool or the padded copy
    would exceed the memory budget.
    """
    if not result.policy.is_paged or result.policy.counted:
        raise InvalidArgumentError(
            "per-step attention is measured on a paged simulation with block tables (not a counted one)"
        )
    default_paged, default_contiguous = _default_kernels()
    kernels = (paged_fn or default_paged, contiguous_fn or default_contiguous)
    device = torch.device(device) if device is not None else default_device()
    snaps = [s for s in result.snapshots if s.block_tables is not None and len(s.context_lens)]
    if not snaps:
        return pd.DataFrame(columns=COLUMNS)
    bs = result.policy.block_size
    num_blocks = result.config.kv_capacity_tokens // bs
    _check_memory(snaps, num_blocks, bs, num_kv_heads, head_dim, dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    caches = _random_pool((num_blocks, bs, num_kv_heads, head_dim), dtype, device, gen)
    bench = _Bench(caches, kernels, num_heads or num_kv_heads, repeats, device, gen)
    rows = []
    deadline = time.perf_counter() + time_budget_s
    for index in _spread(len(snaps)):
        if rows and time.perf_counter() > deadline:
            break
        rows.append(_measure_step(snaps[index], bench))
    return pd.DataFrame(rows, columns=COLUMNS).sort_values("step").reset_index(drop=True)
