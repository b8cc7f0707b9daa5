"""The seam between the engine and its scheduler: which groups decode, which prompt chunks prefill, who is preempted.

`schedule()` decides one step and returns it as a `ScheduledStep`; the engine then appends the decode tokens,
runs the forward pass and samples, and calls `finish(group)` for each request that ended. Policy (vLLM's, and the
serving simulator's):
1. Every running, decoding group gets one token per sequence. If the free blocks cannot take this step's new
   blocks (a fresh block per full last block, a copy per shared partial last block), the newest running group is
   preempted by recompute, repeatedly: its blocks are freed and it goes back to the front of the waiting queue.
2. The step's token budget is max_num_batched_tokens minus the decode tokens. Prompts being prefilled continue,
   oldest first, then waiting groups are admitted first come first served while the budget, max_num_seqs and
   memory (the group's blocks plus a watermark) allow; a prompt larger than the budget is prefilled in chunks.
   Nothing new is admitted in a step that preempted.
"""

from collections import deque
from dataclasses import dataclass, field

from core.engine.memory import EngineMemory
from core.engine.sequence import Sequence, SequenceGroup
from core.errors import InvalidArgumentError


@dataclass
class ScheduledStep:
    """One step's decisions. decode: groups whose every sequence decodes one token. prefill: (sequence, tokens)
    chunks, each continuing the sequence's prefill at `num_computed`. preempted: groups preempted this step
    (back in the waiting queue). prefix_hit_tokens: prompt tokens served from the prefix cache at admission."""

    decode: list[SequenceGroup] = field(default_factory=list)
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    prefix_hit_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.decode and not self.prefill


class EngineScheduler:
    """FCFS continuous batching with chunked prefill and recompute preemption over an `EngineMemory`."""

    def __init__(self, memory: EngineMemory, max_num_seqs: int, max_num_batched_tokens: int):
        self.memory = memory
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.preemptions_total = 0

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, group: SequenceGroup) -> None:
        """Drop a group whose sequences all ended (their blocks are already freed)."""
        self.running.remove(group)

    def _preempt(self, victim: SequenceGroup) -> None:
        self.memory.release(victim)
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.preemptions_total += 1

    def schedule(self) -> ScheduledStep:
        mem = self.memory
        step = ScheduledStep()
        decoding = [g for g in self.running if not g.is_prefilling]
        need = sum(mem.decode_blocks(g) for g in decoding)
        while need > mem.free_blocks and self.running:
            victim = self.running.pop()
            if victim in decoding:
                decoding.remove(victim)
                need -= mem.decode_blocks(victim)
            self._preempt(victim)
            step.preempted.append(victim)
        step.decode = decoding
        budget = self.max_num_batched_tokens - sum(len(g.seqs) for g in decoding)
        for group in self.running:
            for seq in group.seqs:
                if budget > 0 and seq.prefill_left > 0:
                    chunk = min(seq.prefill_left, budget)
                    step.prefill.append((seq, chunk))
                    budget -= chunk
        num_seqs = sum(g.num_seqs for g in self.running)
        while not step.preempted and self.waiting and budget > 0:
            group = self.waiting[0]
            if num_seqs + group.num_seqs > self.max_num_seqs or not mem.can_admit(group, need):
                break
            self.waiting.popleft()
            hits = mem.allocate(group)
            step.prefix_hit_tokens += hits
            group.num_cached_tokens += hits
            self.running.append(group)
            num_seqs += group.num_seqs
            for seq in group.seqs:
                if budget > 0 and seq.prefill_left > 0:
                    chunk = min(seq.prefill_left, budget)
                    step.prefill.append((seq, chunk))
                    budget -= chunk
        if step.is_empty and not step.preempted:
            raise InvalidArgumentError(
                f"the scheduler is stuck: {len(self.waiting)} waiting request(s) fit in none of the "
                f"{mem.free_blocks:,} free blocks and nothing runs (use more blocks or shorter requests)"
            )
        return step
