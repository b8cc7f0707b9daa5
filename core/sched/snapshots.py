"""`StepSnapshot`, the one record of a run's state after a sampled step, the engine's (`core.engine.EngineRun`)
and the simulator's (`core.serving.SimulationResult`); `SnapshotSampler`, the one rule of which steps are
sampled; and `take_snapshot`, which builds one from the scheduler's running groups and the memory (the run
driver's observers call it, `core.sched.driver`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True, eq=False)
class StepSnapshot:
    """The state after one sampled step (`step`, the row it follows; `time_s`, that row's end).

    context_lens: int64 [num decoding sequences], tokens each decoding sequence attends to at that step.
    With block tables (None for a contiguous policy or the counted one): pool, the paged cache
    (`core.kv.KVCacheSnapshot`: its holders `pool.request_ids` are the live sequences; `pool.group` the KV cache
    group of each block); holder_request [pool holders]: the request each holder belongs to (int32, or object
    when request ids are not all ints; -1 for a holder no running request owns); decode_rows: int32 [num
    decoding sequences], the holder row of the sequence of context_lens[i].
    """

    step: int
    time_s: float
    context_lens: np.ndarray
    pool: object | None = None
    holder_request: np.ndarray | None = None
    decode_rows: np.ndarray | None = None

    @cached_property
    def owner_request(self) -> np.ndarray | None:
        """Per block: the request of the first live sequence holding it, -1 when free (None: no pool)."""
        if self.pool is None:
            return None
        return np.append(self.holder_request, np.int32(-1))[self.pool.owner]  # owner -1 picks the trailing -1

    @property
    def block_tables(self) -> np.ndarray | None:
        """int32 [num decoding sequences, max blocks]: row i the block table of the sequence of context_lens[i],
        padded with -1; None without a pool or with several KV cache groups (a sequence has one table each)."""
        if self.pool is None or self.pool.num_groups != 1:
            return None
        return self.pool.tables[0][self.decode_rows]


def take_snapshot(step: int, time_s: float, running: list, memory) -> StepSnapshot:
    """The `StepSnapshot` after `step` (ended at `time_s`) of the scheduler's `running` groups (the decoding
    ones give `context_lens`) and `memory`'s `snapshot(decoding groups)` (None: no block tables)."""
    decoding = [g for g in running if g.num_prefill_tokens == 0]
    lens = np.array([g.length for g in decoding for _ in range(g.num_seqs)], dtype=np.int64)
    pool = memory.snapshot(decoding)
    if pool is None:
        return StepSnapshot(step, time_s, lens)
    request_of = {sid: g.request_id for g in running for sid in g.seq_ids}
    ids = [request_of.get(sid, -1) for sid in pool.request_ids]
    holder_request = np.array(ids, dtype=np.int32 if all(type(i) is int for i in ids) else object)
    row = {sid: r for r, sid in enumerate(pool.request_ids)}
    decode_rows = np.array([row[sid] for g in decoding for sid in g.seq_ids], dtype=np.int32)
    return StepSnapshot(step, time_s, lens, pool, holder_request, decode_rows)


class SnapshotSampler:
    """Samples steps evenly: every `stride`-th step (stride 1 at first; when more than `max_snapshots` are kept,
    the stride doubles and only its multiples stay), and a forced one (the engine's last step), kept until the
    next thinning. `snapshots`: those kept, in step order."""

    def __init__(self, max_snapshots: int):
        self.max_snapshots = max_snapshots
        self.stride = 1
        self.snapshots: list[StepSnapshot] = []

    def sample(self, step: int, take: Callable[[], StepSnapshot], force: bool = False) -> None:
        """Keep `take()` if `step` is due (a multiple of the stride, or forced); thin when over the limit."""
        if step % self.stride and not force:
            return
        snapshot = take()
        self.snapshots.append(snapshot)
        if len(self.snapshots) > self.max_snapshots:
            self.stride *= 2
            self.snapshots = [
                s for s in self.snapshots if s.step % self.stride == 0 or (force and s is snapshot)
            ]
