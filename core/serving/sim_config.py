"""`SimulatorConfig`: the engine limits and hardware of a simulation (a module of its own so that the result type,
`core.serving.sim_result`, sits below the simulator: the simulator imports both, neither imports it)."""

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from core.common import check_float, check_int
from core.errors import InvalidArgumentError
from core.sched import PREEMPTION_MODES
from core.serving.host_offload import HostOffload

PAPER_KV_TOKENS = 15_728  # OPT-13B on one A100-40GB: 12 GiB of KV / 800 KiB per token (paper Table 1: 15.7K)


class StepCost(Protocol):
    """What the simulator asks of a step-time model (`core.planning.cost.step_model.StepTimeModel` is one): the
    simulator owns no hardware knowledge, the caller injects it.

    step_seconds(new_tokens, kv_tokens_read, attention_pairs, swap_bytes, output_tokens=None): one step's seconds
        (output_tokens: the tokens it samples, `core.sched.step_load`).
    step_time(new_tokens, kv_tokens_read, attention_pairs): the same on numpy arrays (one entry per step),
        for the batched replay of decode-only runs.
    kv_bytes_per_token: K and V bytes of one token (prices swapping); swap_bandwidth: CPU<->GPU bytes/s.
    Optionally step_load_seconds(load, swap_bytes): one step's seconds from its `core.sched.step_load.StepLoad`
        (decodes and prefill chunks apart), used instead of step_seconds when present
        (`core.planning.cost.speculative.SpeculativeStepTime`).
    """

    kv_bytes_per_token: float
    swap_bandwidth: float

    def step_seconds(
        self,
        new_tokens: int,
        kv_tokens_read: float,
        attention_pairs: float,
        swap_bytes: float = 0.0,
        output_tokens: float | None = None,
    ) -> float: ...

    def step_time(
        self, new_tokens, kv_tokens_read: np.ndarray, attention_pairs: np.ndarray
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class SimulatorConfig:
    """Engine limits and hardware of a simulation.

    kv_capacity_tokens: KV slots of the whole cache (tokens). Paged: capacity // block_size blocks.
    max_num_seqs: running sequences at most (parallel samples count one each). max_num_batched_tokens: tokens per
    step (decode + prefill); must be >= max_num_seqs. max_seq_len: prompt + output limit (2048 as in the paper).
    preemption_mode: "recompute" or "swap"; swap_space_bytes: CPU swap space (vLLM's default 4 GiB).
    watermark: fraction of blocks kept free when admitting (vLLM's 0.01). step_time: the step-time model
    (a `StepCost`, required: e.g. `core.planning.cost.step_time.opt_13b_a100()`, the paper's OPT-13B on an A100-40GB).
    max_snapshots: block-table snapshots (paged) and batch context lengths kept, at evenly spaced steps.
    offload: a host-memory KV tier (`core.serving.host_offload.HostOffload`, paged policy with prefix caching),
    None for none.
    """

    kv_capacity_tokens: int = PAPER_KV_TOKENS
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_seq_len: int = 2048
    preemption_mode: str = "recompute"
    swap_space_bytes: float = 4 * 1024**3
    watermark: float = 0.01
    step_time: StepCost | None = None
    max_snapshots: int = 100
    offload: HostOffload | None = None

    def __post_init__(self):
        if self.step_time is None:
            raise InvalidArgumentError(
                "SimulatorConfig needs a step_time model (what one step costs): e.g. "
                "core.planning.cost.step_time.opt_13b_a100() for the paper's OPT-13B on an A100-40GB, or from_specs(model, gpu)"
            )
        for name in (
            "kv_capacity_tokens",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_seq_len",
            "max_snapshots",
        ):
            check_int(getattr(self, name), name, minimum=1)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidArgumentError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running sequence decodes one token per step"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise InvalidArgumentError(
                f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}"
            )
        check_float(self.watermark, "watermark", minimum=0.0)
        if not self.watermark < 1:
            raise InvalidArgumentError(f"watermark must be in [0, 1), got {self.watermark!r}")
        check_float(self.swap_space_bytes, "swap_space_bytes", minimum=0.0)
        if self.offload is not None and not isinstance(self.offload, HostOffload):
            raise InvalidArgumentError("offload must be a core.serving.host_offload.HostOffload or None")

    def swap_capacity_blocks(self, block_size: int) -> int:
        """Blocks of `block_size` tokens the CPU swap space holds (unbounded when KV takes no bytes)."""
        kv_bytes = self.step_time.kv_bytes_per_token
        return int(self.swap_space_bytes // (kv_bytes * block_size)) if kv_bytes > 0 else 1 << 62
