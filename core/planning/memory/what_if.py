"""The workload what-if: how many requests of a given workload one replica holds, paged vs contiguous, and the
internal fragmentation of paged allocation for each block size.

Closed-form sums over each request's decode steps (no step-by-step loop): a request of prompt p and output o
holds p + t tokens in ceil((p + t) / block_size) blocks during its step t = 1..o.
"""

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from core.common import check_int
from core.errors import InvalidArgumentError
from core.planning.memory.kv_accounting import BLOCK_SIZES, MAX_CONTEXT_TOKENS
from core.planning.memory.plan import CapacityPlan

MEMORY_CATEGORIES = ("weights", "activations", "kv cache", "internal fragmentation", "free", "headroom")


def request_lengths(requests: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_lens, output_lens) as int64 arrays from (prompt_len, output_len) pairs or objects with
    `prompt_len` and `output_len` attributes (e.g. `core.serving.workload.Request`). Every length must be >= 1."""
    items = list(requests)
    try:  # fast path: one array conversion, validated as a whole
        pairs = [(r.prompt_len, r.output_len) for r in items] if hasattr(items[0], "prompt_len") else items
        array = np.asarray(pairs)
        if array.ndim == 2 and array.shape[1] == 2 and array.dtype.kind in "iu" and (array >= 1).all():
            array = array.astype(np.int64)
            return array[:, 0].copy(), array[:, 1].copy()
    except (AttributeError, IndexError, TypeError, ValueError):
        pass
    return _request_lengths_checked(items)


def _request_lengths_checked(items: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The slow path of `request_lengths`: item by item, raising for the first bad one."""
    prompts, outputs = [], []
    for item in items:
        if hasattr(item, "prompt_len"):
            prompt, output = item.prompt_len, item.output_len
        else:
            try:
                prompt, output = item
            except (TypeError, ValueError):
                raise InvalidArgumentError(
                    f"a request must be (prompt_len, output_len) or have those attributes, got {item!r}"
                ) from None
        prompts.append(check_int(prompt, "prompt_len", minimum=1))
        outputs.append(check_int(output, "output_len", minimum=1))
    if not prompts:
        raise InvalidArgumentError("the workload has no requests")
    return np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)


def _sum_ceil(n: np.ndarray, block_size: int) -> np.ndarray:
    """sum over x = 1..n of ceil(x / block_size), elementwise; 0 for n = 0."""
    q, r = np.divmod(n, block_size)
    return block_size * q * (q + 1) // 2 + r * (q + 1)


def _time_averages(prompts: np.ndarray, outputs: np.ndarray, block_size: int) -> tuple[float, float]:
    """(mean tokens held, mean blocks held) by a running request, averaged over its decode steps.

    A request of prompt p and output o runs for o steps; during step t (t = 1..o) it holds p + t tokens in
    ceil((p + t) / block_size) blocks. Requests are weighted by their o steps (time in the batch).
    """
    steps = outputs.sum()
    end = prompts + outputs
    tokens = ((end * (end + 1) - prompts * (prompts + 1)) // 2).sum()
    blocks = (_sum_ceil(end, block_size) - _sum_ceil(prompts, block_size)).sum()
    return float(tokens / steps), float(blocks / steps)


@dataclass(frozen=True)
class WorkloadWhatIf:
    """Average concurrency of a saturated replica for a workload (requests held at once, memory-bound).

    mean_tokens_held / mean_blocks_held: time-averaged over each request's decode steps (see
    `_time_averages`). paged_concurrency = min(max_num_seqs, kv_tokens / (mean_blocks_held x block_size));
    contiguous_concurrency = min(max_num_seqs, kv_tokens // reservation_tokens), each request reserving
    `reservation_tokens` (max_model_len) for its whole life; oracle_concurrency reserves exactly
    prompt + output (Orca-Oracle). The `*_memory_concurrency` fields are the same without the max_num_seqs
    cap: what the KV cache alone would hold. paged_over_contiguous is None when not even one
    contiguous reservation fits. internal_fragmentation = 1 - mean_tokens_held / (mean_blocks_held x
    block_size): the share of allocated paged slots holding no token. kv_used_bytes: KV blocks the paged
    requests hold (per GPU), internal_fragmentation_bytes the part of it that is empty slots.
    """

    num_requests: int
    mean_prompt_len: float
    mean_output_len: float
    mean_tokens_held: float
    mean_blocks_held: float
    reservation_tokens: int
    paged_concurrency: float
    contiguous_concurrency: float
    oracle_concurrency: float
    paged_memory_concurrency: float
    contiguous_memory_concurrency: int
    oracle_memory_concurrency: float
    paged_over_contiguous: float | None
    internal_fragmentation: float
    kv_used_bytes: int
    internal_fragmentation_bytes: int
    limited_by: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def workload_what_if(
    capacity: CapacityPlan, requests: Iterable[Any], reservation_tokens: int | None = None
) -> WorkloadWhatIf:
    """Paged vs contiguous concurrency for `requests` on one replica of `capacity` (see `WorkloadWhatIf`).

    reservation_tokens: what a contiguous allocator reserves per request (default the plan's max_model_len).
    Requests longer than max_model_len are refused with `InvalidArgumentError`.
    """
    prompts, outputs = request_lengths(requests)
    longest = int((prompts + outputs).max())
    if longest > capacity.max_model_len:
        raise InvalidArgumentError(
            f"the workload has a request of {longest:,} tokens, longer than max_model_len "
            f"{capacity.max_model_len:,}"
        )
    reservation = capacity.max_model_len if reservation_tokens is None else reservation_tokens
    reservation = check_int(reservation, "reservation_tokens", minimum=longest, maximum=MAX_CONTEXT_TOKENS)
    bs = capacity.block_size
    tokens_held, blocks_held = _time_averages(prompts, outputs, bs)
    exact_held = float(
        ((prompts + outputs) * outputs).sum() / outputs.sum()
    )  # oracle reserves p + o all along
    cap = capacity.max_num_seqs
    memory_paged = capacity.kv_tokens / (blocks_held * bs)
    paged = min(cap, memory_paged)
    contiguous = min(cap, capacity.kv_tokens // reservation)
    oracle = min(cap, capacity.kv_tokens / exact_held)
    fragmentation = 1 - tokens_held / (blocks_held * bs)
    used_blocks = min(capacity.num_blocks, paged * blocks_held)
    used_bytes = int(used_blocks * capacity.block_bytes)
    return WorkloadWhatIf(
        num_requests=len(prompts),
        mean_prompt_len=float(prompts.mean()),
        mean_output_len=float(outputs.mean()),
        mean_tokens_held=tokens_held,
        mean_blocks_held=blocks_held,
        reservation_tokens=int(reservation),
        paged_concurrency=float(paged),
        contiguous_concurrency=float(contiguous),
        oracle_concurrency=float(oracle),
        paged_memory_concurrency=float(memory_paged),
        contiguous_memory_concurrency=int(capacity.kv_tokens // reservation),
        oracle_memory_concurrency=float(capacity.kv_tokens / exact_held),
        paged_over_contiguous=float(paged / contiguous) if contiguous else None,
        internal_fragmentation=float(fragmentation),
        kv_used_bytes=used_bytes,
        internal_fragmentation_bytes=int(used_bytes * fragmentation),
        limited_by="max_num_seqs" if memory_paged > cap else "kv cache",
    )


def fragmentation_by_block_size(
    requests: Iterable[Any], block_sizes: Sequence[int] = BLOCK_SIZES
) -> list[dict[str, float]]:
    """Internal fragmentation of paged allocation for each block size (time-averaged, as in `WorkloadWhatIf`):
    [{"block_size", "mean_blocks_held", "internal_fragmentation" (0..1), "wasted_slots" (per request)}]."""
    prompts, outputs = request_lengths(requests)
    rows = []
    for bs in block_sizes:
        bs = check_int(bs, "block_size", minimum=1, maximum=65_536)
        tokens_held, blocks_held = _time_averages(prompts, outputs, bs)
        rows.append(
            {
                "block_size": int(bs),
                "mean_blocks_held": blocks_held,
                "internal_fragmentation": 1 - tokens_held / (blocks_held * bs),
                "wasted_slots": blocks_held * bs - tokens_held,
            }
        )
    return rows


def memory_breakdown(capacity: CapacityPlan, what_if: WorkloadWhatIf | None) -> dict[str, int]:
    """Bytes per GPU by category: weights, activations, kv cache, internal fragmentation, free, headroom (in
    that order, see MEMORY_CATEGORIES); they sum to the GPU's memory when the plan has a KV budget.

    kv cache: slots holding tokens of the workload's requests (at its paged concurrency); internal
    fragmentation: empty slots inside their blocks; free: the rest of the KV budget; headroom: memory outside
    gpu_memory_utilization. Without a workload all of the KV budget counts as free. When weights and
    activations exceed the usable memory, KV and free are 0 and the overflow eats the headroom first; past the
    GPU's memory the bars run beyond its marker (the sum then exceeds the GPU memory).
    """
    budget = max(0, capacity.kv_budget_bytes)
    used = what_if.kv_used_bytes if what_if else 0
    fragmentation = what_if.internal_fragmentation_bytes if what_if else 0
    return {
        "weights": capacity.weights_bytes,
        "activations": capacity.activation_bytes,
        "kv cache": used - fragmentation,
        "internal fragmentation": fragmentation,
        "free": budget - used,
        "headroom": max(
            0, capacity.gpu_memory_bytes - capacity.usable_bytes - max(0, -capacity.kv_budget_bytes)
        ),
    }
