"""`KVSchedulerMemory`: the scheduler's memory (`core.sched.memory.SchedulerMemory`) over the KV core, written
once. The engine and the serving simulator both drive their groups' KV memory through it; what each adds is a
`KVHook` it is given: the engine's copies blocks in its `KVCache` tensors (copy-on-write) and keeps its
sequences' counters, the simulator's records the paper's slot categories as an observer. Neither changes a block
table: every change is this class's call into `KVCacheManager`.

A group (`core.sched.scheduler.SequenceGroup`, plus `token_ids(index, start, stop)`: the tokens of its
`index`-th sequence) lives here as one request of the manager per sequence (request id = the sequence id):
- Admission (`admit`) of a group of n sequences with `num_tokens` tokens each (prompt + outputs to restore):
  the first sequence is allocated with the tokens they all share, the others are forks of it, and each appends
  its own tokens. They share everything when n == 1 or no output is restored (a fresh group: its prompt, the
  partly filled last block copied on the first write, after it is computed); a readmitted group of several
  sequences shares its prompt's full blocks only (each sequence computes its own partly filled block and outputs:
  a copy of a block that is not computed yet would hold nothing). The prefill is the list of `PrefillPiece`s.
- Prefill (`prefill`): the pieces' computed tokens are marked computed as the chunks run (every fork sharing a
  piece's blocks with it), so their full blocks enter the prefix cache and windows release what no later token
  reads.
- Decode: `decode_blocks` is `KVCacheManager.num_blocks_for_decode`, `grow` is `KVCacheManager.decode_steps`
  (the copies it makes go to the hook), `decode_metrics` is the k-step prediction
  `KVCacheManager.num_free_blocks_after_decode`. `decoded` marks the step's tokens computed when the hook's
  driver computes every step before the next grow (`KVHook.computes_decodes`, the engine); a simulated run
  replays many steps at once and leaves the newest token to the next `decode_steps`.
- Sampling's forks and ends (`KVHook.kv_changes`, the engine's beams and finished samples) are applied when a
  prefill ends and after each decode; `release` frees what is left.

One "fits" formula (`check_fits`, `fits_blocks`), one admission formula (`admission_blocks`), one pending-slots
formula (`pending_done`). Block counts use the KV core's one vocabulary (docs/api.md, "Block counts").
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from core.errors import InvalidArgumentError
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.single_type_manager import BlockCopy
from core.kv.snapshot import KVCacheSnapshot

_SEQ_IDS, _LENGTH = attrgetter("seq_ids"), attrgetter("length")


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
    sequence's own tokens, less prefix-cache hits); hit_tokens found in the prefix cache (every tier);
    load_tokens: of those, the tokens to load from a host tier before the group can prefill (vLLM's
    WAITING_FOR_REMOTE_KVS: the scheduler holds its prefill until the caller says `Scheduler.loaded`)."""

    num_prefill_tokens: int
    hit_tokens: int
    load_tokens: int = 0


class PrefillPiece(NamedTuple):
    """Part of an admitted group's prefill, in order: tokens [start, start + count) of sequence `seq_id`; their
    K/V also serve `owners` (the forks sharing those blocks, `seq_id` among them)."""

    seq_id: Hashable
    start: int
    count: int
    owners: tuple


def pending_done(pending_total: int, pending_left: int, group, num_tokens: int) -> int:
    """THE pending-slots formula: of a group's `pending_total` slots reserved at admission (`pending_left` still
    pending), how many `num_tokens` more computed prefill tokens make computed: all that are left once the
    group has no prefill left (e.g. a full prefix-cache hit), else in proportion to its admission's prefill
    (`group.num_prefill_total`)."""
    if group.num_prefill_tokens == 0:
        return pending_left
    done = pending_total * num_tokens // group.num_prefill_total
    return done if done < pending_left else pending_left


def fits_blocks(rules: Sequence, prompt_len: int, max_output_len: int, num_seqs: int) -> tuple[int, int]:
    """THE fits formula: (blocks a group's admission takes, the most blocks it holds at once) for `num_seqs`
    sequences forked from a `prompt_len`-token prompt growing by `max_output_len` tokens, over the groups of the
    KV core whose arithmetic `rules` are (single-type managers, `core.kv.single_type_manager.rule_of`). Per
    group: the admission holds the prompt (shared, `num_required_blocks`); a group that never skips a token
    holds at its longest the shared prompt's full blocks and each sequence's own `num_new_blocks` past them; a
    window group the most one sequence holds at any time (`max_blocks_held`: what a query reads, plus one for a
    window across a block boundary; the blocks held at the longest length can be fewer), each sequence its own
    blocks, never less than the admission."""
    longest = prompt_len + max_output_len - 1
    admit = peak = 0
    for rule in rules:
        prompt_blocks = rule.num_required_blocks(prompt_len)
        admit += prompt_blocks
        if rule.skips_tokens:
            peak += max(prompt_blocks, num_seqs * rule.max_blocks_held(prompt_len, longest))
        elif num_seqs == 1 or prompt_len >= longest:
            peak += rule.num_required_blocks(longest)
        else:
            full = prompt_len // rule.block_size
            peak += full + num_seqs * rule.num_new_blocks(full, longest, 0)
    return admit, peak


class KVHook:
    """What a driver of `KVSchedulerMemory` adds to its changes, told after each (every method a no-op here).

    computes_decodes: the driver computes every decode step before the next `grow` (a real forward pass), so
    `decoded` marks the step's tokens computed at once. has_kv_changes: the driver's sampling forks and ends
    sequences (`kv_changes`)."""

    computes_decodes = False
    has_kv_changes = False

    def admitted(self, group, num_tokens: int, pieces: list[PrefillPiece], admission: Admission) -> None:
        """The group holds its memory: `pieces` is its prefill, in order."""

    def prefilled(self, group, num_tokens: int) -> None:
        """`num_tokens` more of the group's prefill ran (its pieces' tokens are marked computed)."""

    def copied(self, groups: list, copies: list[tuple[Hashable, BlockCopy]]) -> None:
        """Copy-on-write while the groups grew: for each (sequence id, `BlockCopy(src, dst)`), the K/V of src
        belong in dst before the sequence writes its next token."""

    def grown(self, groups: list, steps: int) -> None:
        """Every sequence of the groups has room for `steps` more tokens (their lengths before are `length`)."""

    def decoded(self, groups: list, steps: int) -> None:
        """The step ran (its tokens are marked computed when `computes_decodes`, sampling's changes applied)."""

    def kv_changes(self, group) -> list[tuple[Hashable, Hashable | None]]:
        """The forks (parent id, child id) and ends (sequence id, None) sampling decided for the group since the
        last call, in order; the hook forgets them. Called only when `has_kv_changes`."""
        return []

    def released(self, group) -> None:
        """The group holds nothing any more."""

    def metrics(self, memory: KVSchedulerMemory) -> MemoryMetrics | None:
        """The hook's own metrics (a simulator's slot counters), or None: the KV core's `slot_usage`."""
        return None

    def decode_metrics(self, memory, groups: list, steps: int, free, lengths) -> MemoryMetrics | None:
        """The hook's own k-step metrics given the predicted free blocks (int64 [steps]) and the groups' lengths
        (int64), or None (the metrics now, repeated)."""
        return None


class KVSchedulerMemory:
    """`core.sched.memory.SchedulerMemory` over `kv` (module docstring). watermark: fraction of the blocks kept
    free when admitting (vLLM's 0.01). capacity: token slots the metrics sum to (default num_blocks x
    block_size). hook: the driver's `KVHook`. layers_per_group: the model's layers in each KV cache group (default
    one each: `num_keys_read` weighs the groups by them). Every group of `kv` has one block size."""

    def __init__(
        self,
        kv: KVCacheManager,
        watermark: float,
        hook: KVHook | None = None,
        capacity: int | None = None,
        layers_per_group: Sequence[int] | None = None,
    ):
        sizes = {manager.block_size for manager in kv.managers}
        if len(sizes) != 1:
            raise InvalidArgumentError(
                f"the scheduler's memory needs one block size for every group, got {sizes}"
            )
        self.kv = kv
        self.hook = hook if hook is not None else KVHook()
        self.block_size = sizes.pop()
        self.num_blocks = kv.num_blocks
        self.capacity = self.num_blocks * self.block_size if capacity is None else capacity
        self.watermark = watermark
        self.watermark_blocks = int(watermark * self.num_blocks)
        self._pieces: dict = {}  # held group -> its PrefillPieces
        self._grown: list = []  # with a computing driver: the sequences the last `grow` gave a token
        self.layers_per_group = tuple(layers_per_group or (1,) * len(kv.managers))
        self.windowed = kv.skips_keys  # some layers read a window: `num_keys_read` < the starts' sum

    # ---- sizing ---------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.kv.num_free_blocks

    def _shared_tokens(self, group, num_tokens: int) -> int:
        """Tokens every sequence of the group shares at admission (module docstring)."""
        if group.num_seqs == 1 or num_tokens <= group.prompt_len:
            return num_tokens
        return group.prompt_len - group.prompt_len % self.block_size

    def admission_blocks(self, group, num_tokens: int) -> int:
        """Blocks admitting the group with `num_tokens` per sequence takes at most, prefix-cache hits not
        counted: the KV core's `blocks_needed` of its sequences forked from the tokens they share."""
        return self.kv.blocks_needed(num_tokens, group.num_seqs, self._shared_tokens(group, num_tokens))

    def peak_blocks(self, prompt_len: int, max_output_len: int, num_seqs: int = 1) -> int:
        """The most blocks a group of `num_seqs` sequences forked from a `prompt_len`-token prompt holds while
        each grows by `max_output_len` tokens (`fits_blocks`, the one fits formula)."""
        return fits_blocks(self.kv.managers, prompt_len, max_output_len, num_seqs)[1]

    def check_fits(self, group, max_output_len: int, num_seqs: int | None = None) -> None:
        """Raise InvalidArgumentError when the group (`num_seqs` sequences at most, default its own) could never
        run alone: at its longest (`fits_blocks`) it needs more than the pool, or its prompt more than the pool
        less the watermark. With a sliding window a request longer than the pool may run."""
        n = group.num_seqs if num_seqs is None else num_seqs
        prompt = group.prompt_len
        admit, peak = fits_blocks(self.kv.managers, prompt, max_output_len, n)
        groups = "" if len(self.kv.managers) == 1 else f" over its {len(self.kv.managers)} KV cache groups"
        if peak > self.num_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id} ({prompt} + {max_output_len} tokens, n={n}) needs {peak:,} blocks "
                f"of {self.block_size} at its longest{groups}, more than the {self.num_blocks:,} blocks of the cache"
            )
        if admit > self.num_blocks - self.watermark_blocks:
            raise InvalidArgumentError(
                f"request {group.request_id}'s prompt of {prompt} tokens{groups} never fits in "
                f"{self.num_blocks:,} blocks less the {self.watermark_blocks} watermark blocks"
            )

    def swap_blocks(self, group) -> int:
        """Blocks the group's KV takes in swap space: what swapping it back in allocates (the sequences whole
        again, the prompt shared), the same whether asked while held or swapped out."""
        length = max(group.length, group.prompt_len)
        return self.kv.blocks_needed(length, group.num_seqs, group.prompt_len)

    def can_admit(self, group, num_tokens: int, reserved_blocks: int) -> bool:
        """Whether the free blocks, less the watermark and the step's decodes' `reserved_blocks`, cover what
        admitting the group takes. A group of one sequence is counted as vLLM V1 counts a request before admitting
        it (`KVCacheManager.num_blocks_to_admit`: a cached prefix block another request holds takes nothing);
        several sequences (forks of one prompt) by `admission_blocks`, no hit counted."""
        # the step's decodes may release more than they take (windows), but only after the admission
        free = self.kv.num_free_blocks - self.watermark_blocks - max(0, reserved_blocks)
        need = self.admission_blocks(group, num_tokens)
        if need <= free:
            return True
        if group.num_seqs != 1 or not self.kv.enable_prefix_caching:
            return False
        return self.kv.num_blocks_to_admit(group.token_ids(0, 0, num_tokens)) <= free

    # ---- admission and prefill ------------------------------------------------------------------------------

    def admit(self, group, num_tokens: int) -> Admission:
        kv, ids = self.kv, group.seq_ids
        shared = self._shared_tokens(group, num_tokens)
        host_before = kv.host_cache_hits
        pieces = []
        if shared:
            first = ids[0]
            hits = kv.allocate(first, group.token_ids(0, 0, shared), trusted=True)  # our groups made the ids
            for sid in ids[1:]:
                kv.fork(first, sid)
            pieces.append(PrefillPiece(first, hits, shared - hits, tuple(ids)))
            if shared < num_tokens:
                for index, sid in enumerate(ids):
                    for token in group.token_ids(index, shared, num_tokens):
                        kv.append_token(sid, token, trusted=True)
                    pieces.append(PrefillPiece(sid, shared, num_tokens - shared, (sid,)))
        else:  # nothing shared: each sequence its own (the prefix cache may share its prompt)
            hits = 0
            for index, sid in enumerate(ids):
                own = kv.allocate(sid, group.token_ids(index, 0, num_tokens), trusted=True)
                hits += own
                pieces.append(PrefillPiece(sid, own, num_tokens - own, (sid,)))
        loads = kv.host_cache_hits - host_before
        if loads:
            kv.take_host_loads()  # the simulator prices the copies (host tokens over the link), it copies nothing
        pieces = [piece for piece in pieces if piece.count]
        admission = Admission(sum(piece.count for piece in pieces), hits, loads)
        self._pieces[group] = pieces
        self.hook.admitted(group, num_tokens, pieces, admission)
        return admission

    def prefill(self, group, num_tokens: int) -> None:
        """The chunk ending where the group's prefill now stands (the scheduler already lowered
        `num_prefill_tokens` by `num_tokens`) ran: each piece's computed part is marked computed in every
        sequence sharing it; when the prefill ended, sampling's forks and ends apply."""
        kv = self.kv
        done = group.num_prefill_total - group.num_prefill_tokens
        offset = 0
        for _, start, count, owners in self._pieces[group]:
            if done <= offset:
                break
            stop = start + (count if done - offset > count else done - offset)
            for owner in owners:
                if stop > kv.num_computed_tokens(owner):
                    kv.mark_computed(owner, stop)
            offset += count
        self.hook.prefilled(group, num_tokens)
        if group.num_prefill_tokens == 0 and self.hook.has_kv_changes:
            self._apply_changes(group)

    def _apply_changes(self, group) -> None:
        kv = self.kv
        for parent, child in self.hook.kv_changes(group):
            if child is None:
                if parent in kv:
                    kv.free(parent)
            else:
                kv.fork(parent, child)

    # ---- decode ---------------------------------------------------------------------------------------------

    def decode_blocks(self, groups: list) -> int:
        """Net blocks the groups' next decode step takes (new and copied blocks less the blocks it releases):
        the KV core's `num_blocks_for_decode`."""
        return self.kv.num_blocks_for_decode(sid for group in groups for sid in group.seq_ids)

    def decode_metrics(self, groups: list, steps: int) -> MemoryMetrics:
        """The metrics after each of the next 1..steps decode steps of `groups` (int64 arrays [steps]): the free
        blocks are the KV core's k-step prediction (`num_free_blocks_after_decode`); the slot categories the
        hook's (else the metrics now, repeated). free_blocks goes negative from the first step that would not
        fit."""
        lengths = np.fromiter(map(_LENGTH, groups), np.int64, len(groups))  # the scheduler keeps them
        free = self.kv.num_free_blocks_after_decode(list(map(_SEQ_IDS, groups)), steps, lengths)
        predicted = self.hook.decode_metrics(self, groups, steps, free, lengths)
        if predicted is not None:
            return predicted
        now = self.metrics()
        return MemoryMetrics(
            *(np.full(steps, value, dtype=np.int64) for value in now[:4]), free * self.block_size, free
        )

    def grow(self, groups: list, steps: int) -> None:
        """Room for `steps` decode tokens in every sequence of the groups (`KVCacheManager.decode_steps`: the
        tokens before them are computed first); copy-on-write copies go to the hook."""
        new_tokens = {}
        for group in groups:
            length = group.length
            for index, sid in enumerate(group.seq_ids):
                new_tokens[sid] = group.token_ids(index, length, length + steps)
        copies = None
        if self.hook.computes_decodes:
            copies = []
            self._grown = list(new_tokens)  # marked computed by `decoded`, even if sampling ends them
        self.kv.decode_steps(new_tokens, trusted=True, copies=copies)  # our groups made the ids
        if copies:
            self.hook.copied(groups, copies)
        self.hook.grown(groups, steps)

    def decoded(self, groups: list, steps: int) -> None:
        """The step ran. With a computing driver (`KVHook.computes_decodes`) every sequence the last `grow` gave a
        token has its tokens marked computed now (newly full blocks are cached, windows release what no later token reads), then sampling's
        forks and ends apply."""
        hook, kv = self.hook, self.kv
        if hook.computes_decodes:
            for (
                sid
            ) in self._grown:  # the sequences `grow` gave the step's token (sampling may have forked more)
                if sid in kv:
                    kv.mark_computed(sid, kv.num_tokens(sid))
            self._grown = []
        if hook.has_kv_changes:
            for group in groups:
                self._apply_changes(group)
        hook.decoded(groups, steps)

    # ---- release, metrics ------------------------------------------------------------------------------------

    def release(self, group) -> int:
        """Free all of the group's memory (and sampling's changes no step applied, after an abort); returns the
        blocks that became free."""
        kv = self.kv
        free0 = kv.num_free_blocks
        if self.hook.has_kv_changes:  # sampling may have ended or forked sequences no step applied
            for parent, child in self.hook.kv_changes(group):
                if child is None and parent in kv:
                    kv.free(parent)
            for sid in group.seq_ids:
                if sid in kv:
                    kv.free(sid)
        else:
            for sid in group.seq_ids:
                kv.free(sid)
        self._pieces.pop(group, None)
        self.hook.released(group)
        return kv.num_free_blocks - free0

    def metrics(self, usage: dict | None = None) -> MemoryMetrics:
        """The pool's `MemoryMetrics` (the hook's when it counts them itself); usage: the KV core's `slot_usage()`
        when the caller has it already."""
        counted = self.hook.metrics(self)
        if counted is not None:
            return counted
        usage = self.kv.slot_usage() if usage is None else usage
        free = self.kv.num_free_blocks
        used = self.num_blocks * self.block_size
        return MemoryMetrics(
            usage["token_states"],
            usage["reservation"],
            usage["internal_fragmentation"],
            self.capacity - used,
            free * self.block_size,
            free,
        )

    def num_keys_read(self, starts):
        """Earlier keys read by query spans starting at `starts` (a decode's context, a chunk's first position;
        any int64 array shape, summed over its last axis): each KV cache group's window rule weighed by its
        layers (`KVCacheManager.num_keys_read`). `core.sched.step_load` asks it; equal to the starts' sum unless
        `windowed`."""
        return self.kv.num_keys_read(starts, self.layers_per_group)

    def snapshot(self, groups: list) -> KVCacheSnapshot:
        """The one pool: every group's blocks in one id space, every live sequence's tables."""
        return self.kv.snapshot()
