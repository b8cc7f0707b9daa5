"""The heavy computations the pages submit to the worker pool: module-level functions with hashable arguments,
each called as `fn(*args, progress=callback)` in a worker process.

Each checks the operator limits (read in the worker from the environment the pool gives it) before it generates
a workload or allocates a tensor, then calls the computation in core; nothing here computes on its own.
Return values are plain data the page draws from (never mutated after they are returned).
"""

import dataclasses
from collections.abc import Callable

from core.kernels.timing import (
    KernelConfig,
    check_budget,
    copy_bandwidth_gbps,
    correctness,
    measure,
    sweep_contexts,
)
from core.limits import Limits
from core.serving.experiment import SimulatorParams, run_comparison, steady_summary
from core.serving.step_attention import measure_step_attention
from core.serving.workload import Request

COPY_BYTES = 128 * 1024**2  # the copy-bandwidth reference the Kernels page draws


def _no_progress(fraction: float, message: str = "") -> None:
    """For calls outside a worker."""


_COMPARISONS: dict[tuple, tuple[dict, dict]] = {}  # this worker's last comparisons, for the measurement job
_KEEP = 2


def _comparison(params: SimulatorParams, trace: tuple[Request, ...] | None, progress: Callable) -> tuple:
    key = (params, trace)
    if key not in _COMPARISONS:
        requests = list(trace) if trace is not None else params.requests()
        results = run_comparison(
            params, requests, lambda fraction, name: progress(fraction, f"Simulating {name}")
        )
        summaries = {name: steady_summary(result, requests) for name, result in results.items()}
        while len(_COMPARISONS) >= _KEEP:
            del _COMPARISONS[next(iter(_COMPARISONS))]
        _COMPARISONS[key] = (results, summaries)
    return _COMPARISONS[key]


def compare_policies(
    params: SimulatorParams, trace: tuple[Request, ...] | None = None, *, progress: Callable = _no_progress
) -> tuple[dict, dict]:
    """`run_comparison` of `params` on `trace` (default: the generated workload) and each policy's steady-state
    summary: (results by policy name, summaries by policy name). Raises LimitExceededError naming
    PAGED_LAB_MAX_REQUESTS before generating more requests than the operator allows."""
    Limits.from_env().check_requests(len(trace) if trace is not None else params.num_requests)
    return _comparison(params, trace, progress)


def measure_simulated_attention(
    params: SimulatorParams,
    trace: tuple[Request, ...] | None,
    time_budget_s: float,
    *,
    progress: Callable = _no_progress,
):
    """`measure_step_attention` on the paged run of `compare_policies(params, trace)` (recomputed when this
    worker does not hold it): a DataFrame, one row per measured step. MemoryBudgetError over the budget."""
    Limits.from_env().check_requests(len(trace) if trace is not None else params.num_requests)
    results, _ = _comparison(params, trace, progress)
    progress(0.0, "timing paged vs contiguous attention on the sampled steps")
    return measure_step_attention(results["paged"], time_budget_s=time_budget_s)


def kernel_correctness(
    config: KernelConfig, backends: tuple[str, ...], device: str, *, progress: Callable = _no_progress
) -> dict[str, float]:
    """Max abs error of each paged backend against contiguous attention (`timing.correctness`). Refuses with
    MemoryBudgetError before allocating when the problem exceeds PAGED_LAB_MAX_BYTES."""
    check_budget(config)
    progress(0.0, "checking paged against contiguous attention")
    return correctness(config, list(backends), device)


def kernel_sweep(
    config: KernelConfig,
    backends: tuple[str, ...],
    device: str,
    repeats: int,
    *,
    progress: Callable = _no_progress,
) -> dict:
    """The Kernels page's latency sweep: {"copy_gbps": float, "contexts": [int], "rows": [measure() rows for
    every context of `sweep_contexts`]}. Every point is checked against the memory budget before it allocates."""
    check_budget(config)
    contexts = sweep_contexts(config.context_len, config.block_size)
    progress(0.0, "measuring copy bandwidth")
    copy_gbps = copy_bandwidth_gbps(device, nbytes=COPY_BYTES, repeats=5)
    rows: list[dict] = []
    for index, context in enumerate(contexts):
        progress(index / len(contexts), f"timing context {context:,} tokens ({index + 1} of {len(contexts)})")
        point = dataclasses.replace(config, context_len=context)
        check_budget(point)
        rows.extend(measure(point, list(backends), device, repeats=repeats))
    progress(1.0, "done")
    return {"copy_gbps": copy_gbps, "contexts": contexts, "rows": rows}
