"""The model runner: one scheduled step -> one flattened batch -> the logits to sample from.

`ModelRunner.prepare(scheduled)` lays out the step's tokens on one axis (vLLM's flattened batch): the decoding
sequences first (one token each, the last sampled one), then each prefill chunk's tokens in order, with their
positions, KV slots and block tables. Every block table and slot comes from `EngineMemory` (the engine's only door
to KV memory); tables are built as one padded numpy array per kind, never token by token. `run(prepared)` runs the
forward pass and times it. Sampling is not done here: the engine hands each sequence its row of logits and
`core.engine.postprocess` samples per request (parallel samples and beams fork and free sequences).
"""

import time
from dataclasses import dataclass

import numpy as np
import torch

from core.engine.memory import EngineMemory
from core.engine.model import ForwardBatch, LlamaModel
from core.engine.sequence import Sequence, SequenceGroup
from core.sched.scheduler import ScheduledStep


@dataclass(eq=False)
class PreparedStep:
    """One step ready to run.

    batch: the flattened batch (see `ForwardBatch`).
    decode_seqs: the decoding sequences, in batch order (rows 0 .. num_decode - 1 of the logits).
    pieces: (group, sequence, first position, tokens) of each prefill chunk, in batch order.
    logits_owner: for each row of the logits, the sequences that sample from it (a prompt whose prefill ends feeds
        every one of its n forked samples, which share it).
    logits: the forward pass's [rows, vocab] float32 logits, set by `ModelRunner.execute`.
    """

    batch: ForwardBatch
    decode_seqs: list[Sequence]
    pieces: list[tuple[SequenceGroup, Sequence, int, int]]
    logits_owner: list[list[Sequence]]
    logits: torch.Tensor | None = None  # [rows, vocab] once `execute` ran it


def prefill_pieces(scheduled: ScheduledStep) -> list[tuple[SequenceGroup, Sequence, int, int]]:
    """The scheduler's group chunks (group, start, tokens) as (group, sequence, first position, tokens): a group's
    prefill is the concatenation of its `prefill_plan` (see `EngineKVHook.admitted`)."""
    pieces = []
    for group, start, count in scheduled.prefill_chunks:
        offset = 0
        for seq, first, todo in group.prefill_plan:
            lo, hi = max(start, offset), min(start + count, offset + todo)
            if lo < hi:
                pieces.append((group, seq, first + (lo - offset), hi - lo))
            offset += todo
    return pieces


class ModelRunner:
    """Turns `ScheduledStep`s into forward passes of `model` over the pool of `memory`.

    last_forward_ms: wall milliseconds of the last `run` (the whole model, attention included; on CUDA the device
    is synchronised first, so the time is the device's). last_attention_ms: the part of it in the paged attention
    kernels (`LlamaModel.attention_ms`).
    """

    def __init__(self, model: LlamaModel, memory: EngineMemory):
        self.model = model
        self.memory = memory
        self.last_forward_ms = 0.0
        self.last_attention_ms = 0.0

    def prepare(self, scheduled: ScheduledStep) -> PreparedStep:
        """The flattened batch of a non-empty step (decoding sequences already grown by `Scheduler.allocate`)."""
        mem, device = self.memory, self.model.device
        decode_seqs = [s for g in scheduled.decoding for s in g.seqs]
        pieces = prefill_pieces(scheduled)
        num_decode = len(decode_seqs)
        dec_lens = np.fromiter((s.num_allocated for s in decode_seqs), np.int64, num_decode)
        pre_q = np.fromiter((n for _, _, _, n in pieces), np.int64, len(pieces))
        pre_start = np.fromiter((p for _, _, p, _ in pieces), np.int64, len(pieces))
        pre_ctx = pre_start + pre_q
        decode_tables = mem.block_tables(decode_seqs)  # [groups, num_decode, width]
        # decode rows: the last sampled token at position num_allocated - 1, written to its slot in every group
        dec_pos = dec_lens - 1
        rows = np.arange(num_decode)
        slots = [
            decode_tables[:, rows, dec_pos // mem.block_size] * mem.block_size + dec_pos % mem.block_size
        ]
        tokens = [s.token_ids[-1] for s in decode_seqs]
        logits_owner: list[list[Sequence]] = [[s] for s in decode_seqs]
        last_index = []
        for group, seq, start, chunk in pieces:
            tokens += seq.token_ids[start : start + chunk]
            slots.append(mem.slots(seq, start, start + chunk))  # [groups, chunk]
            if start + chunk == seq.num_allocated:  # the prefill of this sequence ends: its logits are needed
                logits_owner.append([seq] if group.started_sampling else group.seqs)  # forks share the prompt
                last_index.append(len(tokens) - 1)
        # positions: decode rows at len - 1, then each chunk's start .. start + chunk - 1, built without a loop
        chunk_offsets = np.arange(int(pre_q.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(pre_q) - pre_q, pre_q
        )
        positions = np.concatenate([dec_pos, np.repeat(pre_start, pre_q) + chunk_offsets])
        logits_indices = np.concatenate([np.arange(num_decode), np.asarray(last_index, dtype=np.int64)])

        def longs(values) -> torch.Tensor:
            return torch.as_tensor(np.asarray(values, dtype=np.int64)).to(device)

        batch = ForwardBatch(
            token_ids=longs(tokens),
            positions=longs(positions),
            slot_mapping=longs(np.concatenate(slots, axis=1)),
            num_decode=num_decode,
            decode_block_tables=torch.from_numpy(decode_tables).to(device),
            decode_context_lens=longs(dec_lens),
            prefill_block_tables=torch.from_numpy(mem.block_tables([p[1] for p in pieces])).to(device),
            prefill_context_lens=longs(pre_ctx),
            prefill_query_lens=longs(pre_q),
            logits_indices=longs(logits_indices),
        )
        return PreparedStep(batch, decode_seqs, pieces, logits_owner)

    def run(self, prepared: PreparedStep) -> torch.Tensor:
        """Run the forward pass (K/V of every token written to its slot); returns [rows, vocab] float32 logits,
        row i for `prepared.logits_owner[i]`. Changes no block table: the scheduler's postprocess marks the
        computed tokens (`EngineMemory.prefill` / `decoded`)."""
        started = time.perf_counter()
        logits = self.model.forward(prepared.batch, self.memory.cache)
        if logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        self.last_forward_ms = (time.perf_counter() - started) * 1e3
        self.last_attention_ms = self.model.attention_ms
        return logits

    def execute(self, scheduled: ScheduledStep) -> PreparedStep | None:
        """Prepare and run a step; returns its `PreparedStep` with `logits` ([rows, vocab] float32) set, or None
        for an empty step (nothing runs: `last_forward_ms` and `last_attention_ms` are 0)."""
        if scheduled.is_empty:
            self.last_forward_ms = self.last_attention_ms = 0.0
            return None
        prepared = self.prepare(scheduled)
        prepared.logits = self.run(prepared)
        return prepared

    def warm_up(self) -> float:
        """Run the kernels once on a throwaway batch (one decode row and a 2-token prefill chunk writing into
        block 0, which is zeroed after) so one-time costs (building the C attention kernel, first-call dispatch
        and allocations) are not charged to the first real step. Call only while the pool holds nothing.
        Returns the wall milliseconds it took."""
        started = time.perf_counter()
        device = self.model.device
        bs = self.memory.block_size
        longs = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        groups = self.memory.num_groups
        table = torch.zeros(
            groups, 1, 1, dtype=torch.int32, device=device
        )  # [groups, 1 seq, 1 block]: block 0
        size = min(bs, 2)
        batch = ForwardBatch(
            token_ids=longs([0] * (1 + size)),
            positions=longs([0, *range(size)]),
            slot_mapping=longs([[0, *range(size)]] * groups),
            num_decode=1,
            decode_block_tables=table,
            decode_context_lens=longs([1]),
            prefill_block_tables=table,
            prefill_context_lens=longs([size]),
            prefill_query_lens=longs([size]),
            logits_indices=longs([0, size]),
        )
        self.model.forward(batch, self.memory.cache)
        self.memory.clear_block(0)
        return (time.perf_counter() - started) * 1e3
