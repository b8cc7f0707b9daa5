"""Contiguous KV memory as in Orca: each sequence reserves one segment of a linear KV address space.

Reservation rules (the paper's three Orca baselines, section 6.1), for a request with prompt P and output O tokens:
    orca-max     reserve max_len (2048): every request may grow to the model's maximum length;
    orca-pow2    reserve P + next_pow2(O) (the output over-reserved by at most 2x; the paper's example: a true
                 output of 25 reserves 32), capped at max_len;
    orca-oracle  reserve exactly P + O (knows the output length).
Each reservation is placed by a `BuddyAllocator`, which rounds the segment up to a power of two and can only place
it at an aligned, wholly free address range: the gaps it leaves are real external fragmentation.

Accounting of a reserved segment (slots = token positions of KV memory):
    token states            tokens whose K/V are stored now;
    reservation             slots the request will fill later (up to P + O);
    internal fragmentation  requested - (P + O): reserved, never used (over-reservation of the policy);
    allocator slack         segment - requested: the buddy allocator's power-of-two rounding;
    free                    slots in no segment.
The paper's "external fragmentation & others" is slack + free (at its load no request can use them).
This policy stays in `core.serving` beside the paged one (not in `core.kv`, which holds the pool, the
`BuddyAllocator`): what it adds is the Orca baselines' reservation rules and the simulator's accounting.
"""

import numpy as np

from core.common import cdiv
from core.errors import InvalidArgumentError
from core.kv.buddy_allocator import BuddyAllocator
from core.sched.memory import Admission, MemoryMetrics

CONTIGUOUS_POLICIES = ("orca-max", "orca-pow2", "orca-oracle")


def next_pow2(value: int) -> int:
    """Smallest power of two >= value (value >= 1)."""
    return 1 << (int(value) - 1).bit_length()


def reservation(policy: str, prompt_len: int, output_len: int, max_len: int) -> int:
    """Slots the contiguous `policy` requests for one sequence (before buddy rounding)."""
    if policy == "orca-max":
        return max_len
    if policy == "orca-pow2":
        return min(prompt_len + next_pow2(output_len), max_len)
    if policy == "orca-oracle":
        return prompt_len + output_len
    raise InvalidArgumentError(f"unknown contiguous policy {policy!r}; choose one of {CONTIGUOUS_POLICIES}")


class ContiguousMemory:
    """Orca-style KV: each sequence gets one buddy-allocated segment sized by the policy's reservation rule.

    policy: a `core.serving.memory_policies.Policy` naming one of CONTIGUOUS_POLICIES.

    Groups provide `output_len` besides `SequenceGroup`: Orca (Oracle) reserves exactly prompt + output."""

    def __init__(self, policy, capacity: int, max_len: int):
        self.name = policy.name
        self.block_size = policy.block_size
        self.capacity = capacity
        self.max_len = max_len
        self.buddy = BuddyAllocator(capacity)
        self.token_states = 0
        self.sum_need = 0
        self.sum_requested = 0
        self.sum_segment = 0
        self._held: dict = {}  # group -> segment start addresses

    def _sizes(self, group) -> tuple[int, int, int]:
        need = group.prompt_len + group.output_len
        requested = reservation(self.name, group.prompt_len, group.output_len, self.max_len)
        return need, requested, next_pow2(requested)

    def check_fits(self, group, max_output_len: int) -> None:
        _, requested, segment = self._sizes(group)
        if not _buddy_fits(BuddyAllocator(self.capacity), segment, group.num_seqs):
            raise InvalidArgumentError(
                f"request {group.request_id} needs {group.num_seqs} segment(s) of {segment:,} slots ({self.name} "
                f"reserves {requested:,}, the buddy allocator rounds up to a power of two); the "
                f"{self.capacity:,}-slot cache never holds them"
            )

    @property
    def free_blocks(self) -> int:
        return 1 << 62  # decodes never need new memory: the reservation was made at admission

    def swap_blocks(self, group) -> int:
        return group.num_seqs * cdiv(group.length, self.block_size)

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        return _buddy_fits(self.buddy, self._sizes(group)[2], group.num_seqs)

    def admit(self, group, num_tokens: int) -> Admission:
        """One segment per sequence; the prompt is prefilled (Orca never preempts, so nothing is restored)."""
        need, requested, segment = self._sizes(group)
        n = group.num_seqs
        self._held[group] = [self.buddy.allocate(segment) for _ in range(n)]
        self.sum_need += n * need
        self.sum_requested += n * requested
        self.sum_segment += n * segment
        return Admission(group.prompt_len, 0)

    def prefill(self, group, num_tokens: int) -> None:
        self.token_states += group.num_seqs * num_tokens

    def decode_blocks(self, groups: list) -> int:
        return 0

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        token_states = self.token_states + sum(g.num_seqs for g in groups) * np.arange(1, steps + 1)
        now = self.metrics()

        def constant(value: int) -> np.ndarray:
            return np.full(steps, value, dtype=np.int64)

        return MemoryMetrics(
            token_states,
            self.sum_need - token_states,
            constant(now.internal_fragmentation),
            constant(now.allocator_slack),
            constant(now.free_slots),
            constant(now.free_blocks),
        )

    def decoded(self, groups: list, steps: int) -> None:
        """Nothing: a reservation holds its decode tokens from admission."""

    def grow(self, groups: list, steps: int) -> None:
        self.token_states += sum(g.num_seqs for g in groups) * steps

    def release(self, group) -> int:
        need, requested, segment = self._sizes(group)
        n = group.num_seqs
        for address in self._held.pop(group):
            self.buddy.free(address)
        self.token_states -= n * group.length
        self.sum_need -= n * need
        self.sum_requested -= n * requested
        self.sum_segment -= n * segment
        return 0

    def metrics(self) -> MemoryMetrics:
        return MemoryMetrics(
            self.token_states,
            self.sum_need - self.token_states,
            self.sum_requested - self.sum_need,
            self.sum_segment - self.sum_requested,
            self.capacity - self.sum_segment,
            self.buddy.free_list_size,
        )

    def snapshot(self, groups: list) -> None:
        return None


def _buddy_fits(buddy: BuddyAllocator, segment: int, count: int) -> bool:
    """Whether `count` segments of `segment` slots can be placed now. Several are placed on trial and freed
    again: freeing merges the split buddies back, so the allocator ends exactly as it was."""
    if count == 1:
        return buddy.can_allocate(segment)
    placed = []
    for _ in range(count):
        address = buddy.allocate(segment)
        if address is None:
            break
        placed.append(address)
    for address in placed:
        buddy.free(address)
    return len(placed) == count
