"""The KV memory of the serving simulator under one policy: paged (`core.serving.paged_memory`, vLLM's: one
`core.kv` block pool for every KV cache group) or contiguous (`core.serving.contiguous_memory`, Orca's: one
buddy-allocated segment per sequence). `Policy` names one, `make_memory` builds it, `MemoryPolicy` is the one
small interface both implement (the scheduler's `SchedulerMemory` plus what only a simulated run needs).

A policy is named like the charts: "paged", "orca-max", "orca-pow2", "orca-oracle". The scheduler drives a
`MemoryPolicy` with request *groups* (`core.sched.scheduler.SequenceGroup`: a request and its parallel samples,
which advance in lockstep) and the simulator reads `metrics()` after each step, all in token slots of the capacity:

    token_states            slots holding K/V of computed tokens (a shared block counts once);
    reservation             slots reserved for tokens not computed yet (contiguous: the rest of P + O;
                            paged: prompt slots allocated before their prefill chunk ran);
    internal_fragmentation  paged: empty slots of the last, partially filled block of each sequence;
                            contiguous: requested - (P + O), reserved but never used;
    allocator_slack         contiguous: buddy rounding (segment - requested); paged: capacity % block_size;
    free_slots              slots nobody holds (paged: free blocks x block_size, cached-free included).
They sum to the capacity. The paper's Figure 2 "external fragmentation & others" is allocator_slack + free_slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.common import check_int
from core.errors import InvalidArgumentError
from core.kv.snapshot import KVCacheSnapshot
from core.sched.memory import MemoryMetrics, SchedulerMemory
from core.serving.contiguous_memory import CONTIGUOUS_POLICIES, ContiguousMemory
from core.serving.counted_memory import CountedPagedMemory
from core.serving.paged_memory import PagedKVGroup, PagedMemory, check_kv_groups

POLICY_NAMES = ("paged", *CONTIGUOUS_POLICIES)
# What charts, tables and progress lines call each policy: the one table of policy labels.
POLICY_LABELS = {
    "paged": "Paged (vLLM)",
    "orca-max": "Orca (Max)",
    "orca-pow2": "Orca (Pow2)",
    "orca-oracle": "Orca (Oracle)",
}


@dataclass(frozen=True)
class Policy:
    """How KV memory is handed out. block_size (tokens) and enable_prefix_caching apply to "paged" only.

    kv_groups (paged only): None for one full-attention pool, or the model's KV cache groups
    (`PagedKVGroup`s; (kind, num_layers, window) triples are converted once, here), vLLM's hybrid allocator
    (`core.serving.paged_memory`).
    counted (paged only): count blocks without block tables (`core.serving.counted_memory`): the same schedule
    for one full-attention pool, no prefix caching and one sequence per request, no snapshots; for planners."""

    name: str
    block_size: int = 16
    enable_prefix_caching: bool = False
    kv_groups: tuple[PagedKVGroup, ...] | None = None
    counted: bool = False

    def __post_init__(self):
        if self.name not in POLICY_NAMES:
            raise InvalidArgumentError(f"unknown policy {self.name!r}; choose one of {POLICY_NAMES}")
        check_int(self.block_size, "block_size", minimum=1)
        if self.kv_groups is not None:
            if not self.is_paged:
                raise InvalidArgumentError("kv_groups apply to the paged policy only")
            object.__setattr__(self, "kv_groups", check_kv_groups(self.kv_groups))
        if self.counted and (not self.is_paged or self.enable_prefix_caching or self.kv_groups is not None):
            raise InvalidArgumentError(
                "counted applies to the paged policy with one full-attention pool and no prefix caching"
            )

    @property
    def is_paged(self) -> bool:
        return self.name == "paged"

    @property
    def label(self) -> str:
        if self.is_paged:
            cache = ", prefix caching" if self.enable_prefix_caching else ""
            hybrid = f", hybrid {len(self.kv_groups)} groups" if self.kv_groups else ""
            counted = ", counted" if self.counted else ""
            return f"paged (block {self.block_size}{cache}{hybrid}{counted})"
        return POLICY_LABELS[self.name]


def paged(block_size: int = 16, enable_prefix_caching: bool = False, counted: bool = False) -> Policy:
    return Policy("paged", block_size, enable_prefix_caching, counted=counted)


def contiguous(kind: str) -> Policy:
    """An Orca baseline by its short name: "max", "pow2" or "oracle" (see core.serving.contiguous_memory)."""
    if kind not in ("max", "pow2", "oracle"):
        raise InvalidArgumentError(f"contiguous policy must be 'max', 'pow2' or 'oracle', got {kind!r}")
    return Policy(f"orca-{kind}")


def orca_max() -> Policy:
    return Policy("orca-max")


def orca_pow2() -> Policy:
    return Policy("orca-pow2")


def orca_oracle() -> Policy:
    return Policy("orca-oracle")


class MemoryPolicy(SchedulerMemory, Protocol):
    """The scheduler's `SchedulerMemory` plus what only a simulated run needs; `PagedMemory` and
    `ContiguousMemory` implement it. `grow` is only called with the blocks
    `decode_blocks` (one step) or `decode_metrics` (more) promised."""

    capacity: int  # token slots of the whole cache (the metrics sum to it)

    def check_fits(self, group, max_output_len: int) -> None:
        """Raise InvalidArgumentError when the group could never run alone in the whole cache."""
        ...

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """The metrics after each of the next 1..steps decode steps of `groups` (int64 arrays [steps]), predicted
        without changing anything; free_blocks goes negative from the first step that would not fit."""
        ...

    def snapshot(self, groups: list) -> KVCacheSnapshot | None:
        """The pool and every live sequence's block tables (None where there are no blocks: contiguous)."""
        ...


def make_memory(policy: Policy, capacity: int, watermark: float, max_len: int) -> MemoryPolicy:
    """The memory object of `policy` over `capacity` token slots."""
    if policy.counted:
        return CountedPagedMemory(policy.block_size, capacity, watermark)
    if policy.is_paged:
        return PagedMemory(policy, capacity, watermark)
    return ContiguousMemory(policy, capacity, max_len)
