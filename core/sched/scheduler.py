"""The iteration-level (continuous batching) scheduler, as vLLM's: which request groups run in the next step.

One step goes through three named phases, called by whoever drives the engine (the simulator, or a real model):

    step = scheduler.schedule()       # preempt, swap in, continue prefills, admit: decisions + admission memory
    scheduler.allocate(step)          # grow every decoding sequence by the step's token (its KV slot)
    ... run the step (a simulated cost, or a real forward pass over step.decoding and step.prefill_chunks) ...
    outcome = scheduler.postprocess(step)   # account computed tokens and outputs, free finished groups

Every change to the memory goes through these phases (and `abort` / `reset`): the caller runs the step and
reads the memory, it never writes it.

The rules of `schedule` (one step):
1. Preemption: every running, decoding group needs its next decode's new blocks (`SchedulerMemory.decode_blocks`).
   While they exceed the free blocks, the newest running group is preempted (all its sequences together):
   `recompute` frees its memory and puts it back at the front of the waiting queue (its prompt and generated
   tokens are prefilled again); `swap` moves a decoding group's blocks to CPU swap space (falling back to
   recompute when that is full, or when the group was still prefilling) and brings it back, before any new
   request, once the blocks are free again.
2. The step's token budget is `max_num_batched_tokens` minus the decode tokens. Swapped groups come back first
   (none in a step that preempted), prompts being prefilled continue (oldest first), then waiting groups are
   admitted first-come first-served while the budget, `max_num_seqs` and memory (`SchedulerMemory.can_admit`,
   which keeps the decodes' blocks and the watermark free) allow. Nothing new is admitted in a step that
   preempted, or while swapped groups wait. A prompt larger than the budget is prefilled in chunks over several
   steps; the step that finishes a prefill emits the group's first output token.
3. Host-tier loads (vLLM's offloading connector): a group whose admission loads part of its prefix from a host
   tier (`Admission.load_tokens`) holds its blocks but runs no prefill until the caller calls `loaded(group)`;
   the other groups' steps go on meanwhile (vLLM parks it in WAITING_FOR_REMOTE_KVS while the DMA runs).

The scheduler never computes time: the step's cost and the clock belong to the caller, who reads the
`ScheduledStep` (a plain record of the decisions) to price it, and who decides when groups arrive (`add`).
The memory is injected (`core.sched.memory.SchedulerMemory`), and groups are read through the `SequenceGroup`
protocol: the serving simulator plugs in its simulated groups and memory policies (`core.serving`), the engine its
real-token groups and its paged KV memory (`core.engine`). This package imports neither.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from core.common import check_int
from core.errors import InvalidArgumentError
from core.sched.memory import SchedulerMemory

PREEMPTION_MODES = ("recompute", "swap")


@runtime_checkable
class SequenceGroup(Protocol):
    """A request in flight: its sequences share a prompt and advance in lockstep (parallel samples, beams).

    Provided by the group (read by the scheduler and the memory policy, never written by them):
      request_id: identifies the request in snapshots.
      num_seqs: live sequences, >= 1. Read afresh at every step, so it may change between steps (beam search
        forks and frees) as long as the memory policy is told (a policy keyed on `seq_ids` must see the change).
      seq_ids: the live sequences' ids, `len(seq_ids) == num_seqs`, unique across every group of a scheduler.
      prompt_len: tokens of the shared prompt (>= 1).
      is_finished(): True once the group needs no more output (the simulator: its output length is reached; a
        real engine: EOS or max tokens). Asked only in `postprocess`, after the step's outputs are counted.

    Kept by the scheduler (initialise to 0; the group never writes them while it is scheduled):
      length: tokens each sequence holds in KV memory. While decoding (num_prefill_tokens == 0) it is
        prompt_len + num_output_tokens - 1 (the newest output token is written by the next step).
      num_prefill_tokens: tokens still to prefill (0: decoding, or not admitted). Set at admission to the
        memory policy's `Admission.num_prefill_tokens` (prompt + recomputed outputs - prefix-cache hits).
      num_prefill_total: num_prefill_tokens at admission; the running chunk starts at total - remaining.
      num_output_tokens: output tokens each sequence has produced.
      num_preemptions: times the group was preempted.
    """

    request_id: int
    num_seqs: int
    seq_ids: list
    prompt_len: int
    length: int
    num_prefill_tokens: int
    num_prefill_total: int
    num_output_tokens: int
    num_preemptions: int

    def is_finished(self) -> bool: ...


@dataclass(eq=False)
class ScheduledStep:
    """The decisions of one `schedule()` call, in the order they were made.

    decoding: running groups whose every sequence decodes one token this step (oldest first).
    prefill_chunks: (group, start, num_tokens): the group's prefill tokens [start, start + num_tokens) run this
      step (start counts from the group's admission; a chunk that reaches num_prefill_total ends the prefill).
    preempted: groups preempted this step (newest first); each is now waiting (recompute) or swapped.
    swapped_out / swapped_in: groups moved to / back from CPU swap space; swap_out_blocks / swap_in_blocks: the
      blocks moved (the caller prices the transfer).
    num_decode_tokens: one per decoding sequence (per step). decode_context_tokens: sum over decoding
      sequences of their length before this step (keys they attend to, besides their new token). prefix_hit_tokens: prompt tokens of the admitted groups found in the prefix cache.
    num_running / num_running_seqs: groups and sequences running in this step (admitted ones included);
      num_waiting / num_swapped: groups left waiting / swapped after the decisions.
    num_steps: decode steps this record stands for, set by `Scheduler.allocate` (0 until then).
    loads: (group, tokens) admitted this step whose prefix the memory loads from a host tier first (no prefill
      chunk until the caller calls `Scheduler.loaded(group)`); num_loading: groups still loading after it.
    load: the step's `core.sched.step_load.StepLoad`, set by the run driver right after `schedule()` (None
      until then): what a step-time model prices and both drivers record.
    """

    decoding: list = field(default_factory=list)
    prefill_chunks: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    swapped_out: list = field(default_factory=list)
    swapped_in: list = field(default_factory=list)
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    num_decode_tokens: int = 0
    decode_context_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_running: int = 0
    num_running_seqs: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_steps: int = 0
    loads: list = field(default_factory=list)
    num_loading: int = 0
    load: object = None

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c for _, _, c in self.prefill_chunks)

    @property
    def is_empty(self) -> bool:
        """Nothing runs: no decode and no prefill (a step that only preempted or swapped in, or a stuck one)."""
        return not self.decoding and not self.prefill_chunks

    @property
    def is_stuck(self) -> bool:
        """Nothing runs and nothing moved (no preemption, no swap-in, no host load begun or in flight): the
        waiting requests fit nowhere, and the next step would be the same. Every driver raises
        `SchedulerStuckError.nothing_fits` on it."""
        return self.is_empty and not (self.preempted or self.swapped_in or self.loads or self.num_loading)

    @property
    def is_decode_only(self) -> bool:
        """Only decodes: no prefill, no preemption, no swap-in, so the same step may repeat unchanged."""
        return bool(self.decoding) and not (self.prefill_chunks or self.preempted or self.swapped_in)


@dataclass(eq=False)
class StepOutcome:
    """What `postprocess` accounted: tokens_generated (output tokens over every sequence and step),
    prefill_tokens (prompt tokens computed), first_token (groups whose prefill ended, emitting their first token)
    and finished (groups done and freed; no longer running)."""

    tokens_generated: int
    prefill_tokens: int
    first_token: list
    finished: list


class Scheduler:
    """Queues of groups (waiting, running, swapped) and the phases that move them; see the module docstring.

    Invariants: every group is in at most one queue; a running group holds its memory in the policy (admitted
    and not released), a waiting or swapped one holds none there; `running` is in admission order (the last one
    is the newest, the first preemption victim); `waiting` and `swapped` are first come, first served.
    """

    def __init__(
        self,
        memory: SchedulerMemory,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        preemption_mode: str = "recompute",
        swap_capacity_blocks: int = 0,
    ):
        self.memory = memory
        self.max_num_seqs = check_int(max_num_seqs, "max_num_seqs", minimum=1)
        self.max_num_batched_tokens = check_int(
            max_num_batched_tokens, "max_num_batched_tokens", minimum=self.max_num_seqs
        )
        if preemption_mode not in PREEMPTION_MODES:
            raise InvalidArgumentError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}"
            )
        self.preemption_mode = preemption_mode
        self.swap_capacity_blocks = check_int(swap_capacity_blocks, "swap_capacity_blocks", minimum=0)
        self.swap_used_blocks = 0
        self.waiting: deque = deque()
        self.running: list = []
        self.swapped: deque = deque()
        self.num_preemptions = 0
        self.loading: dict = {}  # running groups whose host-tier load is in flight (insertion order)

    # ---- queues ----------------------------------------------------------------------------------------------

    def add(self, group: SequenceGroup) -> None:
        """Queue an arrived group at the back of the waiting queue."""
        self.waiting.append(group)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self.swapped)

    def abort(self, group: SequenceGroup) -> None:
        """Take `group` out of whichever queue holds it and give its memory back (a running group holds some)."""
        for queue in (self.waiting, self.swapped):
            if group in queue:
                queue.remove(group)
        if group in self.running:
            self.running.remove(group)
            self.loading.pop(group, None)
            self.memory.release(group)

    def reset(self) -> None:
        """Abort every group (after a failed step): the queues are empty and every running group's memory is
        given back."""
        for group in list(self.running):
            self.abort(group)
        self.waiting.clear()
        self.swapped.clear()

    # ---- phase 1: schedule -----------------------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        """Decide the next step (module docstring, rules 1-2). Admitted and swapped-in groups get their memory
        now; decoding groups are guaranteed room for one token each, taken by `allocate`."""
        step = ScheduledStep()
        decoding, reserved = self._preempt_for_decodes(step)
        step.decoding = decoding
        context = 0
        for group in decoding:
            step.num_decode_tokens += group.num_seqs
            context += group.num_seqs * group.length
        step.decode_context_tokens = context
        budget = self.max_num_batched_tokens - step.num_decode_tokens
        seqs = sum(g.num_seqs for g in self.running)
        if not step.preempted:
            seqs = self._swap_in(step, reserved, seqs)
        budget = self._continue_prefills(step, budget)
        if not step.preempted and not self.swapped:
            seqs = self._admit(step, reserved, budget, seqs)
        step.num_running = len(self.running)
        step.num_running_seqs = seqs
        step.num_waiting = len(self.waiting)
        step.num_swapped = len(self.swapped)
        step.num_loading = len(self.loading)
        return step

    def loaded(self, group: SequenceGroup) -> None:
        """The host-tier load of `group` (listed in a step's `loads`) is done: its prefill may run from the next
        step on. Nothing for a group not loading (preempted or aborted meanwhile)."""
        self.loading.pop(group, None)

    def _preempt_for_decodes(self, step: ScheduledStep) -> tuple[list, int]:
        """Preempt the newest running groups until the decodes' new blocks fit; returns (decoding groups, the
        blocks they will take)."""
        memory = self.memory
        decoding = [g for g in self.running if g.num_prefill_tokens == 0]
        need = memory.decode_blocks(decoding)
        free = memory.free_blocks
        while need > free:
            victim = self.running.pop()
            if victim.num_prefill_tokens == 0:
                decoding.pop()  # the newest decoding group is the last one
                need -= memory.decode_blocks([victim])
            free += self.preempt(victim, step)
        return decoding, need

    def preempt(self, victim: SequenceGroup, step: ScheduledStep) -> int:
        """Take `victim` (no longer in `running`) off the GPU: swap it out when the mode is swap, it is decoding
        and the swap space holds it, else release it for recompute at the front of the waiting queue. Returns
        the blocks that became free."""
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.loading.pop(victim, None)
        step.preempted.append(victim)
        if self.preemption_mode == "swap" and victim.num_prefill_tokens == 0:
            blocks = self.memory.swap_blocks(victim)
            if self.swap_used_blocks + blocks <= self.swap_capacity_blocks:
                self.swap_used_blocks += blocks
                step.swap_out_blocks += blocks
                step.swapped_out.append(victim)
                self.swapped.append(victim)
                return self.memory.release(victim)
        freed = self.memory.release(victim)
        victim.num_prefill_tokens = 0
        self.waiting.appendleft(victim)
        return freed

    def _swap_in(self, step: ScheduledStep, reserved: int, seqs: int) -> int:
        """Bring swapped groups back, oldest first, with every token already computed; returns running seqs."""
        memory = self.memory
        while self.swapped and seqs + self.swapped[0].num_seqs <= self.max_num_seqs:
            group = self.swapped[0]
            if not memory.can_admit(group, group.length, reserved):
                break
            self.swapped.popleft()
            blocks = memory.swap_blocks(group)
            admission = memory.admit(group, group.length)
            memory.prefill(group, admission.num_prefill_tokens)  # swapped in: nothing to recompute
            self.swap_used_blocks -= blocks
            step.swap_in_blocks += blocks
            step.swapped_in.append(group)
            self.running.append(group)
            seqs += group.num_seqs
        return seqs

    def _continue_prefills(self, step: ScheduledStep, budget: int) -> int:
        """Chunks of the prompts already being prefilled, oldest first; returns the budget left."""
        for group in self.running:
            if budget <= 0:
                break
            if group.num_prefill_tokens > 0 and group not in self.loading:
                tokens = min(group.num_prefill_tokens, budget)
                start = group.num_prefill_total - group.num_prefill_tokens
                step.prefill_chunks.append((group, start, tokens))
                budget -= tokens
        return budget

    def _admit(self, step: ScheduledStep, reserved: int, budget: int, seqs: int) -> int:
        """Admit waiting groups first come, first served while budget, max_num_seqs and memory allow; returns
        running seqs."""
        memory = self.memory
        while self.waiting and budget > 0 and seqs + self.waiting[0].num_seqs <= self.max_num_seqs:
            group = self.waiting[0]
            num_tokens = group.prompt_len + group.num_output_tokens  # recompute: every output again
            if not memory.can_admit(group, num_tokens, reserved):
                break
            self.waiting.popleft()
            admission = memory.admit(group, num_tokens)
            group.length = num_tokens
            group.num_prefill_tokens = group.num_prefill_total = admission.num_prefill_tokens
            step.prefix_hit_tokens += admission.hit_tokens
            self.running.append(group)
            seqs += group.num_seqs
            if admission.load_tokens:  # its prefix comes from the host tier first; others go on meanwhile
                self.loading[group] = None
                step.loads.append((group, admission.load_tokens))
                continue
            tokens = min(group.num_prefill_tokens, budget)
            step.prefill_chunks.append((group, 0, tokens))
            budget -= tokens
        return seqs

    # ---- phase 2: allocate -------------------------------------------------------------------------------------

    def allocate(self, step: ScheduledStep, num_steps: int = 1) -> None:
        """Grow every decoding sequence by `num_steps` tokens (their KV slots). `num_steps > 1` replays a
        decode-only step (the caller checked that memory lasts, e.g. the simulator's `decode_metrics`); call
        once per step, before running it."""
        num_steps = check_int(num_steps, "num_steps", minimum=1)
        if step.num_steps:
            raise InvalidArgumentError("this step was already allocated")
        if num_steps > 1 and not step.is_decode_only:
            raise InvalidArgumentError("only a decode-only step can repeat (num_steps > 1)")
        self.memory.grow(step.decoding, num_steps)
        for group in step.decoding:
            group.length += num_steps
        step.num_steps = num_steps

    # ---- phase 3: postprocess ----------------------------------------------------------------------------------

    def postprocess(self, step: ScheduledStep) -> StepOutcome:
        """Account the step once it ran: decoding sequences emitted `num_steps` tokens each, prefill chunks are
        computed (a finished prefill emits one token per sequence), and finished groups are released."""
        if not step.num_steps:
            raise InvalidArgumentError("allocate the step before postprocessing it")
        k = step.num_steps
        generated = step.num_decode_tokens * k
        for group in step.decoding:
            group.num_output_tokens += k
        self.memory.decoded(step.decoding, k)
        prefilled = 0
        first_token = []
        for group, _, tokens in step.prefill_chunks:
            group.num_prefill_tokens -= tokens
            self.memory.prefill(group, tokens)
            prefilled += tokens
            if group.num_prefill_tokens == 0:
                group.num_output_tokens += 1
                generated += group.num_seqs
                first_token.append(group)
        finished = [g for g in self.running if g.num_prefill_tokens == 0 and g.is_finished()]
        if finished:
            for group in finished:
                self.memory.release(group)
            done = {id(g) for g in finished}
            self.running = [g for g in self.running if id(g) not in done]
        return StepOutcome(generated, prefilled, first_token, finished)
