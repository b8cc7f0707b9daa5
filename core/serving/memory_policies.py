"""The KV memory of the simulated engine under one policy: paged (the real `BlockManager`) or contiguous (Orca).

A policy is named like the charts: "paged", "orca-max", "orca-pow2", "orca-oracle". The simulator drives a memory
object with request *groups* (a request and its n parallel samples, which always advance in lockstep) and reads
five numbers after each step, all in token slots of the KV capacity:

    token_states            slots holding K/V of computed tokens (a shared block counts once);
    reservation             slots reserved for tokens not computed yet (contiguous: the rest of P + O;
                            paged: prompt slots allocated before their prefill chunk ran);
    internal_fragmentation  paged: empty slots of the last, partially filled block of each sequence;
                            contiguous: requested - (P + O), reserved but never used;
    allocator_slack         contiguous: buddy rounding (segment - requested); paged: capacity % block_size;
    free_slots              slots nobody holds (paged: free blocks x block_size, cached-free included).
They sum to the capacity. The paper's Figure 2 "external fragmentation & others" is allocator_slack + free_slots.
"""

from dataclasses import dataclass

import numpy as np

from core.errors import InvalidArgumentError
from core.paging.allocators import CONTIGUOUS_POLICIES, BuddyAllocator, next_pow2, reservation
from core.paging.block_manager import BlockManager

POLICY_NAMES = ("paged", *CONTIGUOUS_POLICIES)


@dataclass(frozen=True)
class Policy:
    """How KV memory is handed out. block_size (tokens) and enable_prefix_caching apply to "paged" only."""

    name: str
    block_size: int = 16
    enable_prefix_caching: bool = False

    def __post_init__(self):
        if self.name not in POLICY_NAMES:
            raise InvalidArgumentError(f"unknown policy {self.name!r}; choose one of {POLICY_NAMES}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidArgumentError(f"block_size must be an integer >= 1 token, got {self.block_size!r}")

    @property
    def is_paged(self) -> bool:
        return self.name == "paged"

    @property
    def label(self) -> str:
        if self.is_paged:
            cache = ", prefix caching" if self.enable_prefix_caching else ""
            return f"paged (block {self.block_size}{cache})"
        return {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)"}[
            self.name
        ]


def paged(block_size: int = 16, enable_prefix_caching: bool = False) -> Policy:
    return Policy("paged", block_size, enable_prefix_caching)


def contiguous(kind: str) -> Policy:
    """An Orca baseline by its short name: "max", "pow2" or "oracle" (see core.paging.allocators)."""
    if kind not in ("max", "pow2", "oracle"):
        raise InvalidArgumentError(f"contiguous policy must be 'max', 'pow2' or 'oracle', got {kind!r}")
    return Policy(f"orca-{kind}")


def orca_max() -> Policy:
    return Policy("orca-max")


def orca_pow2() -> Policy:
    return Policy("orca-pow2")


def orca_oracle() -> Policy:
    return Policy("orca-oracle")


class Group:
    """A request in flight: its n sequences share a prompt and advance together.

    length: tokens each sequence holds in memory. computed: tokens each sequence has K/V for (== length while
    decoding). emitted: output tokens produced per sequence. todo: prefill tokens still to compute (0: decoding).
    """

    __slots__ = (
        "admit_step",
        "emitted",
        "finish_time",
        "first_token_time",
        "gen_tokens",
        "index",
        "length",
        "n",
        "pending_left",
        "pending_total",
        "preemptions",
        "prefill_done_tokens",
        "prompt_tokens",
        "req",
        "segments",
        "seq_ids",
        "shared_tail",
        "todo",
        "todo_total",
    )

    def __init__(self, req, index: int, prompt_tokens: list[int]):
        self.req = req
        self.index = index
        self.n = req.n
        self.seq_ids = [index * 1024 + k for k in range(req.n)]
        self.gen_tokens = [-(index * 1024 + k) - 1 for k in range(req.n)]  # one constant id per sequence
        self.prompt_tokens = prompt_tokens
        self.length = 0
        self.emitted = 0
        self.todo = 0
        self.todo_total = 0
        self.prefill_done_tokens = 0
        self.pending_total = 0
        self.pending_left = 0
        self.shared_tail = False
        self.segments: list[int] = []
        self.preemptions = 0
        self.first_token_time = np.nan
        self.finish_time = np.nan
        self.admit_step = -1


class PagedMemory:
    """Paged KV: capacity // block_size blocks in a real `BlockManager`; parallel samples are forked so their
    prompt blocks are shared, and the partially filled last block is copied on the first write (copy-on-write).

    `token_states` is tracked exactly from the manager's free-block count: a block is either free, or holds
    computed tokens, pending prompt tokens or the empty tail of a sequence.
    """

    def __init__(self, policy: Policy, capacity: int, watermark: float):
        self.bs = bs = policy.block_size
        self.num_blocks = capacity // bs
        if self.num_blocks < 1:
            raise InvalidArgumentError(f"KV capacity {capacity} tokens holds no block of {bs} tokens")
        self.capacity = capacity
        self.manager = BlockManager(self.num_blocks, bs, policy.enable_prefix_caching)
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.token_states = 0
        self.pending = 0
        self.hit_tokens = 0

    # ---- sizing ---------------------------------------------------------------------------------------------

    def blocks_for(self, prompt: int, generated: int, n: int) -> int:
        """Blocks a group of n sequences with `prompt` shared tokens and `generated` own tokens each holds."""
        bs = self.bs
        if generated == 0:
            return -(-prompt // bs)
        shared = prompt // bs
        return shared + n * (-(-(prompt + generated) // bs) - shared)

    def check_fits(self, req, max_len: int) -> None:
        peak = self.blocks_for(req.prompt_len, req.output_len - 1, req.n)
        if peak > self.num_blocks:
            raise InvalidArgumentError(
                f"request {req.request_id} ({req.prompt_len} + {req.output_len} tokens, n={req.n}) needs "
                f"{peak:,} blocks of {self.bs} at its longest, more than the {self.num_blocks:,} blocks of the cache"
            )
        if self.blocks_for(req.prompt_len, 0, req.n) > self.num_blocks - self.watermark_blocks:
            raise InvalidArgumentError(
                f"request {req.request_id}'s prompt of {req.prompt_len} tokens never fits in "
                f"{self.num_blocks:,} blocks less the {self.watermark_blocks} watermark blocks"
            )

    # ---- group operations ----------------------------------------------------------------------------------

    def admit(self, group: Group, reserved_blocks: int = 0) -> bool:
        """Allocate the group's blocks (prompt + tokens generated before a recompute preemption), or return False
        with nothing changed. `reserved_blocks` stay free for this step's decodes, and so do the watermark blocks.
        Sets group.todo (tokens to prefill) and the pending slots."""
        req, bs, mgr = group.req, self.bs, self.manager
        gen = group.emitted  # recompute: every emitted token is prefilled again
        need = self.blocks_for(req.prompt_len, gen, group.n)
        free0 = mgr.num_free_blocks
        if need > free0 - self.watermark_blocks - reserved_blocks:
            return False
        sid0 = group.seq_ids[0]
        if group.n == 1:
            tokens = group.prompt_tokens + [group.gen_tokens[0]] * gen if gen else group.prompt_tokens
            hits = mgr.allocate(sid0, tokens)
        else:
            hits = mgr.allocate(sid0, group.prompt_tokens)
        revived = 0
        if hits:
            table = mgr.block_table(sid0)
            revived = sum(1 for b in table[:hits] if mgr.ref_count(b) == 1)
        for sid in group.seq_ids[1:]:
            mgr.fork(sid0, sid)
        if group.n > 1 and gen:
            for sid, tok in zip(group.seq_ids, group.gen_tokens, strict=True):
                mgr.extend(sid, [tok] * gen)
        length = req.prompt_len + gen
        group.length = length
        group.shared_tail = group.n > 1 and gen == 0 and length % bs != 0
        pending = (free0 - mgr.num_free_blocks - revived) * bs - self._tail_empty(group)
        self.token_states += revived * bs
        self.pending += pending
        group.pending_total = group.pending_left = pending
        group.todo = group.todo_total = length + (group.n - 1) * gen - hits * bs
        self.hit_tokens = hits * bs
        return True

    def _tail_empty(self, group: Group) -> int:
        empty = -group.length % self.bs
        return empty if group.shared_tail else empty * group.n

    def prefill(self, group: Group, tokens: int) -> None:
        """Account `tokens` more prefill tokens of the group as computed."""
        group.todo -= tokens
        if group.todo == 0:
            done = group.pending_left
        else:
            done = min(group.pending_left, group.pending_total * tokens // group.todo_total)
        group.pending_left -= done
        self.pending -= done
        self.token_states += done

    def decode_need(self, lengths: np.ndarray, ns: np.ndarray, shared: np.ndarray, steps: int) -> np.ndarray:
        """Cumulative new blocks that `steps` decode steps of these groups take: out[j] after j + 1 steps.

        A sequence of length L takes a block when L % block_size == 0; a forked group whose last block is still
        shared copies it on its first write (n - 1 new blocks: the last sequence writes in place)."""
        offsets = lengths[:, None] + np.arange(steps)[None, :]
        per_step = ((offsets % self.bs == 0) * ns[:, None]).sum(axis=0)
        per_step[0] += int(((ns - 1) * shared).sum())
        return np.cumsum(per_step)

    def decode(self, groups: list[Group], steps: int) -> None:
        """Append `steps` tokens to every sequence of the groups (the caller checked the blocks are there)."""
        extend = self.manager.extend
        added = 0
        for group in groups:
            if group.shared_tail:
                self.token_states += (group.n - 1) * (group.length % self.bs)
                group.shared_tail = False
            for sid, tok in zip(group.seq_ids, group.gen_tokens, strict=True):
                extend(sid, (tok,) * steps)
            group.length += steps
            added += group.n
        self.token_states += added * steps

    def release(self, group: Group) -> int:
        """Free every sequence of the group; returns the blocks that became free."""
        mgr = self.manager
        free0 = mgr.num_free_blocks
        for sid in group.seq_ids:
            mgr.free(sid)
        released = mgr.num_free_blocks - free0
        self.token_states -= released * self.bs - self._tail_empty(group) - group.pending_left
        self.pending -= group.pending_left
        group.pending_left = group.pending_total = 0
        group.shared_tail = False
        return released

    # ---- metrics ----------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def metrics(self) -> tuple[int, int, int, int, int, int]:
        """(token_states, reservation, internal_fragmentation, allocator_slack, free_slots, free_list_size)."""
        free = self.manager.num_free_blocks
        used = (self.num_blocks - free) * self.bs
        return (
            self.token_states,
            self.pending,
            used - self.token_states - self.pending,
            self.capacity - self.num_blocks * self.bs,
            free * self.bs,
            free,
        )


class ContiguousMemory:
    """Orca-style KV: each sequence gets one buddy-allocated segment sized by the policy's reservation rule."""

    def __init__(self, policy: Policy, capacity: int, max_len: int):
        self.name = policy.name
        self.capacity = capacity
        self.max_len = max_len
        self.buddy = BuddyAllocator(capacity)
        self.token_states = 0
        self.sum_need = 0
        self.sum_requested = 0
        self.sum_segment = 0
        self.hit_tokens = 0
        self.watermark_blocks = 0

    def _sizes(self, req) -> tuple[int, int, int]:
        need = req.prompt_len + req.output_len
        requested = reservation(self.name, req.prompt_len, req.output_len, self.max_len)
        return need, requested, next_pow2(requested)

    def check_fits(self, req, max_len: int) -> None:
        _, requested, segment = self._sizes(req)
        trial = BuddyAllocator(self.capacity)
        if any(trial.allocate(segment) is None for _ in range(req.n)):
            raise InvalidArgumentError(
                f"request {req.request_id} needs {req.n} segment(s) of {segment:,} slots ({self.name} reserves "
                f"{requested:,}, the buddy allocator rounds up to a power of two); the {self.capacity:,}-slot "
                f"cache never holds them"
            )

    def admit(self, group: Group, reserved_blocks: int = 0) -> bool:
        need, requested, segment = self._sizes(group.req)
        addresses = []
        for _ in range(group.n):
            address = self.buddy.allocate(segment)
            if address is None:
                for taken in addresses:
                    self.buddy.free(taken)
                return False
            addresses.append(address)
        group.segments = addresses
        n = group.n
        self.sum_need += n * need
        self.sum_requested += n * requested
        self.sum_segment += n * segment
        group.length = 0
        group.todo = group.todo_total = group.req.prompt_len
        return True

    def prefill(self, group: Group, tokens: int) -> None:
        group.todo -= tokens
        group.length += tokens
        self.token_states += group.n * tokens

    def decode_need(self, lengths, ns, shared, steps: int) -> np.ndarray:
        return np.zeros(steps, dtype=np.int64)

    def decode(self, groups: list[Group], steps: int) -> None:
        added = 0
        for group in groups:
            group.length += steps
            added += group.n
        self.token_states += added * steps

    def release(self, group: Group) -> int:
        need, requested, segment = self._sizes(group.req)
        n = group.n
        for address in group.segments:
            self.buddy.free(address)
        group.segments = []
        self.token_states -= n * group.length
        self.sum_need -= n * need
        self.sum_requested -= n * requested
        self.sum_segment -= n * segment
        return 0

    @property
    def free_blocks(self) -> int:
        return 1 << 62  # decodes never need new memory: the reservation was made at admission

    def metrics(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.token_states,
            self.sum_need - self.token_states,
            self.sum_requested - self.sum_need,
            self.sum_segment - self.sum_requested,
            self.capacity - self.sum_segment,
            self.buddy.free_list_size,
        )
