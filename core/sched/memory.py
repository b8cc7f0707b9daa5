"""The slim memory protocol the scheduler drives (`SchedulerMemory`), and the records it exchanges with it.

The scheduler (`core.sched.scheduler`) asks a memory object five things over a request group's life: may it be
admitted (`can_admit`), take its memory (`admit`), account computed prefill tokens (`prefill`), room for the
decodes (`decode_blocks`, then `grow`, and `decoded` once they ran), and give everything back (`release`);
`swap_blocks` prices a swap, and `metrics` says where the capacity is after a step. The scheduler is the only
caller that changes a memory object: whoever drives it (the simulator, the engine) writes no KV memory itself. The serving simulator's policies (`core.serving`) and the
engine's paged KV memory (`core.engine.memory`) implement it; the simulator's policies add what only a simulated
run needs (`check_fits`, `decode_metrics` for replaying many decode steps at once, `snapshot`).

Metrics are in token slots of the capacity (see `MemoryMetrics`). This module holds no memory, only the
contract between the scheduler and whoever owns it, so it lives with the scheduler rather than in `core.kv`.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np


class MemoryMetrics(NamedTuple):
    """Where the KV capacity is, in token slots, plus free_blocks: the free-list size (paged: free blocks;
    contiguous: free buddy blocks).

    token_states: slots holding K/V of computed tokens (a shared block counts once); reservation: slots held for
    tokens not computed yet; internal_fragmentation: held slots that will never hold a token of this allocation
    (a block's empty tail, a reservation's unused end); allocator_slack: slots no request can use although they
    are not free (rounding); free_slots: slots nobody holds. token_states + reservation + internal_fragmentation +
    allocator_slack + free_slots == capacity. Python ints from `metrics()`; int64 arrays (one entry per step)
    from a simulator policy's `decode_metrics()`."""

    token_states: int
    reservation: int
    internal_fragmentation: int
    allocator_slack: int
    free_slots: int
    free_blocks: int

    @classmethod
    def paged(
        cls, num_blocks: int, block_size: int, capacity: int, free, tail_empty, pending: int
    ) -> MemoryMetrics:
        """A block pool's metrics: `free` blocks of `num_blocks`, `tail_empty` empty slots in the held blocks'
        tails, `pending` slots reserved for tokens not computed yet, the slots past the last whole block
        (capacity - num_blocks x block_size) as allocator slack. Ints give ints; `free` and `tail_empty` as int64
        arrays (one entry per step) give arrays, the constant fields repeated."""
        used = (num_blocks - free) * block_size
        slack = capacity - num_blocks * block_size
        if isinstance(free, np.ndarray):
            pending, slack = (np.full(free.shape, v, dtype=np.int64) for v in (pending, slack))
        return cls(used - tail_empty - pending, pending, tail_empty, slack, free * block_size, free)


class Admission(NamedTuple):
    """An admitted group: num_prefill_tokens to compute over all its sequences (the shared prompt once, each
    sequence's recomputed outputs, less prefix-cache hits); hit_tokens found in the prefix cache (every tier);
    load_tokens: of those, the tokens to load from a host tier before the group can prefill (vLLM's
    WAITING_FOR_REMOTE_KVS: the scheduler holds its prefill until the caller says `Scheduler.loaded`)."""

    num_prefill_tokens: int
    hit_tokens: int
    load_tokens: int = 0


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
