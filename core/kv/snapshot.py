"""`KVCacheSnapshot`: the one frozen picture of a block pool and its tables, and `build_snapshot`, its one builder;
and `slot_usage`, the same pool and tables read as counts of where the held slots are (`KVCacheManager.slot_usage`,
the metrics' token states, reservation and fragmentation).

Every reader of a pool's state reads this type: the block manager facade (`BlockManager.snapshot`), the KV core
(`KVCacheManager.snapshot`), the serving simulator's paged policies (each sampled step), the engine (each sampled
step) and every block heatmap. One group (a `BlockManager`) is the case G = 1.

Arrays are read-only numpy arrays; the per-block ones are indexed by physical block id. Their dtypes are compact
(a simulation keeps up to a hundred snapshots of pools of up to millions of blocks): int32 ids and counts, int8
groups, bool states.
"""

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from core.errors import InvalidArgumentError
from core.kv.block_pool import BlockPool
from core.kv.request import KVRequest
from core.kv.single_type_manager import MambaManager, SingleTypeKVCacheManager


@dataclass(frozen=True, eq=False)
class KVCacheSnapshot:
    """The pool at one moment.

    num_blocks: blocks in the pool. block_sizes: tokens per block of each KV cache group, in group order.
    request_ids: the live holders (requests of a `KVCacheManager`, sequences of a `BlockManager`) in admission
        order; `owner[b]` and the rows of `tables` index into it (`seq_ids` is the same tuple).
    group: int8, the group whose tables hold block b, else the group whose prefix cache holds it, else -1.
    owner: int32, the first holder (in `request_ids` order) whose tables hold block b, or -1.
    ref_count: int32, table entries naming block b (over every holder of its group).
    fill: int32, token slots of block b in use: its group's block size when full or cached, fewer for a last
        block, 1 for a Mamba state block, 0 for a free uncached block.
    is_free / is_cached: block b can be taken now / holds a full block registered in the prefix cache.
    free_order: int32 free block ids in the order they will be taken (uncached first, then cached LRU).
    tables: int32 [groups, holders, width]: row r of group g is holder r's block table in that group (logical
        block i -> physical block id; -1 for an entry a window released), padded with -1 past `table_lens`.
    table_lens: int32 [groups, holders], the length of each table.
    num_tokens: holder id -> tokens it has room for.
    """

    num_blocks: int
    block_sizes: tuple[int, ...]
    request_ids: tuple
    group: np.ndarray
    owner: np.ndarray
    ref_count: np.ndarray
    fill: np.ndarray
    is_free: np.ndarray
    is_cached: np.ndarray
    free_order: np.ndarray
    tables: np.ndarray
    table_lens: np.ndarray
    num_tokens: dict

    # ---- the pool -------------------------------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        return len(self.block_sizes)

    @property
    def block_size(self) -> int:
        """Tokens per block when every group has the same block size (always true of one group)."""
        if len(set(self.block_sizes)) != 1:
            raise InvalidArgumentError(f"the groups' block sizes differ: {list(self.block_sizes)}")
        return self.block_sizes[0]

    @property
    def num_free_blocks(self) -> int:
        return int(self.free_order.size)

    @property
    def num_held_blocks(self) -> int:
        return int((self.ref_count > 0).sum())

    @property
    def is_shared(self) -> np.ndarray:
        """bool per block: named by more than one table entry (forks, prefix-cache hits)."""
        return self.ref_count > 1

    # ---- the tables -----------------------------------------------------------------------------------------

    @property
    def seq_ids(self) -> tuple:
        """`request_ids` in a block manager's words: its holders are sequences."""
        return self.request_ids

    def _row(self, holder: Hashable) -> int:
        try:
            return self.request_ids.index(holder)
        except ValueError:
            raise InvalidArgumentError(f"{holder!r} held no blocks in this snapshot") from None

    def group_table(self, holder: Hashable, group: int = 0) -> tuple[int, ...]:
        """The holder's block table in one group (-1 for released entries)."""
        row = self._row(holder)
        return tuple(self.tables[group, row, : self.table_lens[group, row]].tolist())

    def table(self, holder: Hashable) -> tuple[int, ...]:
        """The holder's tables of every group, concatenated in group order (one group: its one table)."""
        return tuple(b for g in range(self.num_groups) for b in self.group_table(holder, g))

    @property
    def block_tables(self) -> dict:
        """holder id -> one tuple per group: its block table there (-1 for released entries)."""
        return {
            rid: tuple(self.group_table(rid, g) for g in range(self.num_groups)) for rid in self.request_ids
        }

    def rows(self, holders: Sequence[Hashable], group: int = 0) -> np.ndarray:
        """int32 [len(holders), width]: the holders' tables in `group`, padded with -1 (as the kernels take)."""
        index = {rid: row for row, rid in enumerate(self.request_ids)}
        return self.tables[group, [index[h] for h in holders]]

    def owners(self, block_id: int) -> list:
        """Every holder whose tables name `block_id`, in `request_ids` order."""
        hit = (self.tables == block_id).any(axis=(0, 2))
        return [rid for rid, held in zip(self.request_ids, hit.tolist(), strict=True) if held]


def free_blocks(pool: BlockPool) -> tuple[np.ndarray, np.ndarray]:
    """The pool's free blocks: their ids in the order they would be taken, and a per-block bool mask."""
    free_order = np.fromiter(pool.iter_free_order(), dtype=np.int32, count=pool.num_free_blocks)
    is_free = np.zeros(pool.num_blocks, dtype=bool)
    is_free[free_order] = True
    return free_order, is_free


def read_only(*arrays: np.ndarray) -> None:
    """Freeze the arrays a snapshot hands out, so a reader cannot change what it was shown."""
    for array in arrays:
        array.setflags(write=False)


def _group_tables(manager: SingleTypeKVCacheManager, request_ids: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(lengths [holders], every table's entries concatenated in holder order) of one group."""
    recs = [manager.requests[rid] for rid in request_ids]
    lens = np.fromiter((len(r.table) for r in recs), dtype=np.int32, count=len(recs))
    flat = np.fromiter(chain.from_iterable(r.table for r in recs), dtype=np.int32, count=int(lens.sum()))
    return lens, flat


def build_snapshot(
    pool: BlockPool, managers: Sequence[SingleTypeKVCacheManager], num_tokens: Mapping[Hashable, int]
) -> KVCacheSnapshot:
    """The snapshot of `pool` whose tables are `managers`' (one per group, in group order), for the holders of
    `num_tokens` (in its order: the admission order). O(blocks + table entries), no Python loop per block."""
    n = pool.num_blocks
    request_ids = tuple(num_tokens)
    tokens = np.fromiter(num_tokens.values(), dtype=np.int64, count=len(request_ids))
    group = np.full(n, -1, dtype=np.int8)
    owner = np.full(n, len(request_ids), dtype=np.int32)  # min over holders; "nobody" is -1 below
    fill = np.zeros(n, dtype=np.int32)
    is_cached = np.zeros(n, dtype=bool)
    for g, manager in enumerate(managers):
        cached = np.asarray(pool.cached_blocks(g), dtype=np.int64)
        is_cached[cached] = True
        group[cached] = g
        fill[cached] = manager.block_size
    per_group = [_group_tables(manager, request_ids) for manager in managers]
    width = max([0, *(int(lens.max(initial=0)) for lens, _ in per_group)])
    tables = np.full((len(managers), len(request_ids), width), -1, dtype=np.int32)
    table_lens = np.zeros((len(managers), len(request_ids)), dtype=np.int32)
    for g, (manager, (lens, flat)) in enumerate(zip(managers, per_group, strict=True)):
        holder = np.repeat(np.arange(len(request_ids), dtype=np.int32), lens)
        logical = np.arange(flat.size, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        tables[g, holder, logical] = flat
        table_lens[g] = lens
        held = flat >= 0
        blocks, holder, logical = flat[held], holder[held], logical[held]
        group[blocks] = g
        np.minimum.at(owner, blocks, holder)
        if isinstance(manager, MambaManager):
            fill[blocks] = 1
        else:
            bs = manager.block_size
            fill[blocks] = np.clip(tokens[holder] - logical * bs, 0, bs)
    owner[owner == len(request_ids)] = -1
    free_order, is_free = free_blocks(pool)
    ref_count = np.asarray(pool.ref_counts, dtype=np.int32)
    read_only(group, owner, ref_count, fill, is_free, is_cached, free_order, tables, table_lens)
    return KVCacheSnapshot(
        num_blocks=n,
        block_sizes=tuple(m.block_size for m in managers),
        request_ids=request_ids,
        group=group,
        owner=owner,
        ref_count=ref_count,
        fill=fill,
        is_free=is_free,
        is_cached=is_cached,
        free_order=free_order,
        tables=tables,
        table_lens=table_lens,
        num_tokens=dict(num_tokens),
    )


def slot_usage(
    pool: BlockPool, managers: Sequence[SingleTypeKVCacheManager], reqs: Iterable[KVRequest]
) -> dict:
    """Where the live requests' held slots are, over every group (a token kept by two groups fills a slot in
    each; a block shared by several requests counts once): token_states (slots of computed tokens),
    reservation (slots with room made, not computed), internal_fragmentation (held slots past every holder's
    tokens), blocks_in_use (held blocks), blocks_without_sharing (the sum of the blocks each request holds),
    shared_blocks (held blocks with more than one holder). Released (-1) entries hold nothing."""
    bs = managers[0].block_size
    if any(m.block_size != bs for m in managers):
        raise InvalidArgumentError("slot_usage needs one block size for every group")
    ref_counts, num_blocks = pool.ref_counts, pool.num_blocks
    computed = np.zeros(num_blocks, dtype=np.int64)
    allocated = np.zeros(num_blocks, dtype=np.int64)
    shared = set()
    unshared = 0
    for req in reqs:
        for rec in req.blocks:
            table = np.asarray(rec.table, dtype=np.int64)
            offsets = np.arange(len(table)) * bs
            held = table >= 0
            table, offsets = table[held], offsets[held]
            np.maximum.at(computed, table, np.clip(req.num_computed - offsets, 0, bs))
            np.maximum.at(allocated, table, np.clip(req.num_tokens - offsets, 0, bs))
            unshared += len(table)
            shared.update(b for b in table.tolist() if ref_counts[b] > 1)
    used = num_blocks - pool.num_free_blocks
    token_states = int(computed.sum())
    return {
        "token_states": token_states,
        "reservation": int(allocated.sum()) - token_states,
        "internal_fragmentation": used * bs - int(allocated.sum()),
        "blocks_in_use": used,
        "blocks_without_sharing": unshared,
        "shared_blocks": len(shared),
    }
