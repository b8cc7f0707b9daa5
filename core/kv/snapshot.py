"""`KVCacheSnapshot`: a frozen picture of one block pool and every group's tables, for plots and tests.

Meant as the one snapshot type of a pool (the block grids of the playground, the simulator and the engine can
all draw from it); arrays are read-only numpy arrays indexed by physical block id.
"""

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from core.kv.block_pool import BlockPool
from core.kv.single_type_manager import MambaManager, SingleTypeKVCacheManager


@dataclass(frozen=True, eq=False)
class KVCacheSnapshot:
    """The pool at one moment.

    num_blocks: blocks in the pool. block_sizes: tokens per block of each group, in group order.
    request_ids: live requests in admission order; `owner[b]` indexes into it.
    group: int64, the group whose tables hold block b, else the group whose cache holds it, else -1.
    owner: int64, the first live request (in `request_ids` order) whose tables hold block b, or -1.
    ref_count: int64, table entries naming block b (over every request of its group).
    fill: int64, token slots of block b in use: its group's block size when full or cached, fewer for a last
        block, 1 for a Mamba state block, 0 for a free uncached block.
    is_free / is_cached: block b can be taken now / holds a full block registered in the prefix cache.
    free_order: int64 free block ids in the order they will be taken (uncached first, then cached LRU).
    block_tables: request id -> one tuple per group (-1 for released entries).
    num_tokens: request id -> tokens it has room for.
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
    block_tables: dict
    num_tokens: dict

    @property
    def num_free_blocks(self) -> int:
        return int(self.free_order.size)

    @property
    def num_held_blocks(self) -> int:
        return int((self.ref_count > 0).sum())


def free_blocks(pool: BlockPool) -> tuple[np.ndarray, np.ndarray]:
    """The pool's free blocks: their ids in the order they would be taken, and a per-block bool mask."""
    free_order = np.fromiter(pool.iter_free_order(), dtype=np.int64, count=pool.num_free_blocks)
    is_free = np.zeros(pool.num_blocks, dtype=bool)
    is_free[free_order] = True
    return free_order, is_free


def read_only(*arrays: np.ndarray) -> None:
    """Freeze the arrays a snapshot hands out, so a reader cannot change what it was shown."""
    for array in arrays:
        array.setflags(write=False)


def build_snapshot(
    pool: BlockPool, managers: Sequence[SingleTypeKVCacheManager], num_tokens: Mapping[Hashable, int]
) -> KVCacheSnapshot:
    """The snapshot of `pool` whose tables are `managers`' (one per group), for requests with `num_tokens`."""
    n = pool.num_blocks
    group = np.full(n, -1, dtype=np.int64)
    owner = np.full(n, -1, dtype=np.int64)
    fill = np.zeros(n, dtype=np.int64)
    is_cached = np.zeros(n, dtype=bool)
    for block in pool.iter_cached_blocks():
        is_cached[block] = True
        group[block] = pool.cached_group(block)
        fill[block] = managers[pool.cached_group(block)].block_size
    request_ids = tuple(num_tokens)
    for index in range(len(request_ids) - 1, -1, -1):  # so the first holder is written last
        rid = request_ids[index]
        for g, manager in enumerate(managers):
            rec = manager.requests[rid]
            bs = manager.block_size
            for i in range(rec.first_held, len(rec.table)):
                block = rec.table[i]
                group[block] = g
                owner[block] = index
                is_mamba = isinstance(manager, MambaManager)
                fill[block] = 1 if is_mamba else min(bs, num_tokens[rid] - i * bs)
    free_order, is_free = free_blocks(pool)
    ref_count = np.asarray(pool.ref_counts, dtype=np.int64)
    read_only(group, owner, ref_count, fill, is_free, is_cached, free_order)
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
        block_tables={rid: tuple(tuple(m.requests[rid].table) for m in managers) for rid in request_ids},
        num_tokens=dict(num_tokens),
    )
