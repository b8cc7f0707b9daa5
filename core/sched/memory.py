"""The slim memory protocol the scheduler drives (`SchedulerMemory`), and the records it exchanges with it.

The scheduler (`core.sched.scheduler`) asks a memory object five things over a request group's life: may it be
admitted (`can_admit`), take its memory (`admit`), account computed prefill tokens (`prefill`), room for the
decodes (`decode_blocks`, then `grow`, and `decoded` once they ran), and give everything back (`release`);
`swap_blocks` prices a swap, and `metrics` says where the capacity is after a step. The scheduler is the only
caller that changes a memory object: whoever drives it (the simulator, the engine) writes no KV memory itself.
It is implemented once over the KV core, `core.kv.scheduler_memory.KVSchedulerMemory`, which the engine
(`core.engine.memory.EngineMemory`) and the serving simulator's paged policy (`core.serving.paged_memory.PagedMemory`)
configure with their hooks; the counted and contiguous policies (`core.serving`) implement it by arithmetic. They add what a run needs beside it
(`check_fits`, `decode_metrics` for replaying many decode steps at once, `snapshot`).

Metrics are in token slots of the capacity (`MemoryMetrics`); the records exchanged (`MemoryMetrics`,
`Admission`) are the KV core's (`core.kv.scheduler_memory`), re-exported here. This module holds no memory, only
the contract between the scheduler and whoever owns it.
"""

from __future__ import annotations

from typing import Protocol

from core.kv.scheduler_memory import Admission, MemoryMetrics

__all__ = ["Admission", "MemoryMetrics", "SchedulerMemory"]


class SchedulerMemory(Protocol):
    """What `Scheduler` calls. Groups follow `core.sched.scheduler.SequenceGroup`.

    Invariants: a group is *held* between `admit` and `release`; `free_blocks`, `can_admit`, `decode_blocks`,
    `swap_blocks` and `metrics` change nothing; `admit` is only called after `can_admit` said yes and `grow`
    only with the blocks `decode_blocks` promised, so neither fails. `free_blocks` falls only through `admit` and
    `grow`, and rises through `release` (and, with sliding windows, through `grow` and `prefill`).
    """

    block_size: int  # tokens per block (the unit of swap)

    @property
    def free_blocks(self) -> int:
        """Blocks a decode can take now (contiguous: effectively unbounded, its decodes take no memory)."""
        ...

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        """True when the group fits with `num_tokens` per sequence (prompt + outputs to restore) while leaving
        `reserved_blocks` (this step's decodes) and the watermark free."""
        ...

    def admit(self, group, num_tokens: int) -> Admission:
        """Take the group's memory for `num_tokens` tokens per sequence; they count as reserved until prefilled."""
        ...

    def prefill(self, group, num_tokens: int) -> None:
        """`num_tokens` more of the group's reserved tokens are computed; the caller already lowered
        `group.num_prefill_tokens` by them (0 afterwards: the whole admission is computed)."""
        ...

    def decode_blocks(self, groups: list) -> int:
        """New blocks the groups' next decode step takes (one token per sequence)."""
        ...

    def grow(self, groups: list, steps: int) -> None:
        """Append `steps` decode tokens to every sequence of the groups (their lengths before this call)."""
        ...

    def decoded(self, groups: list, steps: int) -> None:
        """The step ran: the `steps` decode tokens `grow` gave the groups' sequences are computed (the engine
        marks them and applies what sampling decided; a simulated policy has nothing to do)."""
        ...

    def swap_blocks(self, group) -> int:
        """Blocks the (decoding) group's KV takes in CPU swap space."""
        ...

    def release(self, group) -> int:
        """Free all of the group's memory; returns the blocks that became free."""
        ...

    def metrics(self) -> MemoryMetrics: ...
