"""The cached blocks a vLLM server announced on its KV cache events, chained into prefix trees.

`CachedBlockTree` replays `BlockStored` / `BlockRemoved` / `AllBlocksCleared` events (core.kv.events) and keeps,
per pool (KV cache group, medium), every block hash that is cached now, with its parent hash and its tokens.

What it can show: which prefixes are cached (content), how they branch, how deep they go, how many cached
blocks sit below a block (how much cached content builds on that prefix). What it cannot: which request holds
which slot, ref counts, physical block ids, free or in-use blocks, or prefix-cache hits; events carry none of
these (a hit is not announced again), so usage comes from the metrics, never from here.

Conventions:
- An event without `group_idx` (a single-group model, an older vLLM) belongs to group 0; without `medium`
  (a sender from before the field) to "GPU".
- A block whose parent is not cached here (the parent was evicted, or announced before we subscribed) is a
  root, like a prompt's first block; `orphans()` counts those whose parent hash is known not to be None.
- BlockStored for a hash already cached replaces its parent and tokens (the latest announcement wins).
- BlockRemoved of a hash not cached here is counted in `unknown_removals` and changes nothing.
- AllBlocksCleared empties every pool (the event names no medium).
Invariant: for every pool, `children[p]` holds exactly the cached blocks whose parent is `p`.
"""

from collections import defaultdict
from dataclasses import dataclass

from core.kv.events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KVEvent, KVEventBatch

DEFAULT_MEDIUM = "GPU"
Pool = tuple[int, str]  # (KV cache group index, medium)


@dataclass(frozen=True)
class CachedBlock:
    """One cached block as announced: its hash, its parent's hash (None for a prompt's first block), its
    tokens (block_size of them) and LoRA id."""

    block_hash: BlockHash
    parent_hash: BlockHash | None
    token_ids: tuple[int, ...]
    lora_id: int | None = None


@dataclass(frozen=True)
class SharedPrefix:
    """A cached block and what builds on it: `depth` (1 for a root), `blocks_below` (cached descendants),
    `leaves` (cached chains ending below it, itself counted when it is a leaf)."""

    pool: Pool
    block: CachedBlock
    depth: int
    blocks_below: int
    leaves: int


class CachedBlockTree:
    """The cached blocks of one server (one event stream), per pool. Not thread-safe: one owner applies events."""

    def __init__(self) -> None:
        self._blocks: dict[Pool, dict[BlockHash, CachedBlock]] = defaultdict(dict)
        self._children: dict[Pool, dict[BlockHash, set[BlockHash]]] = defaultdict(lambda: defaultdict(set))
        self.events_applied = 0
        self.unknown_removals = 0
        self.clears = 0

    # --- applying events ---------------------------------------------------------------------------------
    def apply_batch(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            self.apply(event)

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            self._store(event)
        elif isinstance(event, BlockRemoved):
            pool = (event.group_idx or 0, event.medium or DEFAULT_MEDIUM)
            for block_hash in event.block_hashes:
                self._remove(pool, block_hash)
        elif isinstance(event, AllBlocksCleared):
            self.clear()
            self.clears += 1
        self.events_applied += 1

    def clear(self) -> None:
        self._blocks.clear()
        self._children.clear()

    def _store(self, event: BlockStored) -> None:
        pool = (event.group_idx or 0, event.medium or DEFAULT_MEDIUM)
        size = event.block_size
        parent = event.parent_block_hash
        for i, block_hash in enumerate(event.block_hashes):
            tokens = tuple(event.token_ids[i * size : (i + 1) * size])
            if block_hash in self._blocks[pool]:
                self._unlink(pool, block_hash)
            self._blocks[pool][block_hash] = CachedBlock(block_hash, parent, tokens, event.lora_id)
            self._children[pool][parent].add(block_hash)
            parent = block_hash

    def _remove(self, pool: Pool, block_hash: BlockHash) -> None:
        if block_hash not in self._blocks.get(pool, {}):
            self.unknown_removals += 1
            return
        self._unlink(pool, block_hash)
        del self._blocks[pool][block_hash]
        if not self._blocks[pool]:
            del self._blocks[pool]
            self._children.pop(pool, None)

    def _unlink(self, pool: Pool, block_hash: BlockHash) -> None:
        parent = self._blocks[pool][block_hash].parent_hash
        siblings = self._children[pool][parent]
        siblings.discard(block_hash)
        if not siblings:
            del self._children[pool][parent]

    # --- queries -------------------------------------------------------------------------------------------
    def pools(self) -> list[Pool]:
        """Pools holding at least one cached block, sorted."""
        return sorted(self._blocks, key=lambda p: (p[0], p[1]))

    def counts(self) -> dict[Pool, int]:
        """Cached blocks per pool."""
        return {pool: len(self._blocks[pool]) for pool in self.pools()}

    def num_blocks(self, group: int | None = None, medium: str | None = None) -> int:
        """Cached blocks in the pools matching `group` and `medium` (None: any)."""
        return sum(
            n
            for (g, m), n in self.counts().items()
            if (group is None or g == group) and (medium is None or m == medium)
        )

    def blocks(self, pool: Pool) -> dict[BlockHash, CachedBlock]:
        """hash -> block of one pool (a copy)."""
        return dict(self._blocks.get(pool, {}))

    def block(self, pool: Pool, block_hash: BlockHash) -> CachedBlock | None:
        """The cached block of `pool` under `block_hash`, None when it is not cached there."""
        return self._blocks.get(pool, {}).get(block_hash)

    def children(self, pool: Pool, parent: BlockHash | None) -> list[BlockHash]:
        """Cached blocks whose parent is `parent`."""
        return list(self._children.get(pool, {}).get(parent, ()))

    def roots(self, pool: Pool) -> list[BlockHash]:
        """Blocks whose parent is not cached in this pool (first blocks and orphans)."""
        blocks = self._blocks.get(pool, {})
        return [h for h, b in blocks.items() if b.parent_hash is None or b.parent_hash not in blocks]

    def orphans(self, pool: Pool) -> int:
        """Roots whose announced parent is not cached here (evicted, or stored before we subscribed)."""
        blocks = self._blocks.get(pool, {})
        return sum(1 for b in blocks.values() if b.parent_hash is not None and b.parent_hash not in blocks)

    def walk(self, pool: Pool) -> list[SharedPrefix]:
        """Every cached block of `pool` with its depth, cached blocks below it and leaves below it, parents
        before children (a pre-order walk from the roots). O(blocks)."""
        out: list[SharedPrefix] = []
        blocks = self._blocks.get(pool, {})
        children = self._children.get(pool, {})
        for root in self.roots(pool):
            order: list[tuple[BlockHash, int]] = []
            stack = [(root, 1)]
            while stack:
                node, depth = stack.pop()
                order.append((node, depth))
                stack.extend((c, depth + 1) for c in children.get(node, ()))
            below: dict[BlockHash, int] = {}
            leaves: dict[BlockHash, int] = {}
            for node, _ in reversed(order):  # children before parents
                kids = children.get(node, ())
                below[node] = sum(below[c] + 1 for c in kids)
                leaves[node] = sum(leaves[c] for c in kids) or 1
            out.extend(SharedPrefix(pool, blocks[n], d, below[n], leaves[n]) for n, d in order)
        return out

    def max_depth(self, pool: Pool) -> int:
        """Blocks in the longest cached chain of `pool` (0 when empty)."""
        return max((p.depth for p in self.walk(pool)), default=0)

    def most_shared(self, pool: Pool, k: int = 10) -> list[SharedPrefix]:
        """The k blocks with the most cached chains (leaves) below them, ties broken by more blocks below,
        then shallower: the prefixes most shared by the cached content."""
        ranked = sorted(self.walk(pool), key=lambda p: (-p.leaves, -p.blocks_below, p.depth))
        return ranked[:k]
