"""Where each prefix lives in a fleet: several servers' `CachedBlockTree`s (one per replica, from their KV cache
events) side by side: which prefixes each holds, how many blocks are cached on several replicas at once (memory
spent twice: what round-robin routing costs, what prefix-aware routing saves), and how much of one prompt each
replica would serve from its cache.

Blocks are matched across replicas by content, not by hash: a block's key is the chain of token tuples from its
prompt's first block down to it (hashed here with `core.kv.block_hash.hash_block_tokens`), so two replicas'
blocks match when they hold the same tokens after the same cached prefix, whatever hash function or seed each
server uses (vLLM's default hash is seeded per process unless PYTHONHASHSEED is set). A block whose parent is not
cached on its replica (an orphan: its parent was evicted, or announced before the page subscribed) has no known
chain and matches nothing on another replica.

Invariants: nothing here changes a tree; every count is over one pool (KV cache group, medium) of every tree;
`duplicated_blocks` <= `distinct_blocks` <= the sum of the replicas' blocks, and the sum of the replicas' blocks
= `distinct_blocks` + `extra_copies`.
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.kv.block_hash import hash_block_tokens
from core.live.tree import DEFAULT_MEDIUM, CachedBlockTree, Pool


@dataclass(frozen=True)
class ReplicaPrefixes:
    """One replica's share: `blocks` cached, `prefixes` (chains that start at a prompt's first block), `shared`
    (its blocks also cached on at least one other replica), `orphans` (blocks whose chain is unknown)."""

    name: str
    blocks: int
    prefixes: int
    shared: int
    orphans: int


@dataclass(frozen=True)
class FleetPrefixes:
    """The fleet's cached blocks in one pool: per replica (`replicas`, in the order given), `distinct_blocks`
    (different contents cached anywhere), `duplicated_blocks` (contents cached on two replicas or more),
    `extra_copies` (copies beyond the first: blocks of memory spent twice) and `first_blocks`: for each prompt's
    first block cached anywhere, its tokens and the replicas holding it (most held first)."""

    pool: Pool
    replicas: tuple[ReplicaPrefixes, ...]
    distinct_blocks: int
    duplicated_blocks: int
    extra_copies: int
    first_blocks: tuple[tuple[tuple[int, ...], tuple[str, ...]], ...]


def content_keys(tree: CachedBlockTree, pool: Pool) -> dict:
    """block hash -> content key (the chained hash of its tokens from its prompt's first block) for every block
    of `pool` whose chain is cached; orphans and what builds on them are left out."""
    blocks = tree.blocks(pool)
    keys: dict = {}
    stack = [(h, None) for h, b in blocks.items() if b.parent_hash is None]
    while stack:
        block_hash, parent_key = stack.pop()
        key = hash_block_tokens(parent_key, blocks[block_hash].token_ids)
        keys[block_hash] = key
        stack.extend((child, key) for child in tree.children(pool, block_hash))
    return keys


def fleet_prefixes(trees: Mapping[str, CachedBlockTree], pool: Pool = (0, DEFAULT_MEDIUM)) -> FleetPrefixes:
    """The fleet's cached blocks in `pool` (module docstring); `trees`: replica name -> its tree."""
    keyed = {name: content_keys(tree, pool) for name, tree in trees.items()}
    holders = Counter(key for keys in keyed.values() for key in set(keys.values()))
    first: dict[tuple, list[str]] = {}
    replicas = []
    for name, tree in trees.items():
        keys = keyed[name]
        blocks = tree.blocks(pool)
        roots = [h for h, b in blocks.items() if b.parent_hash is None]
        for h in roots:
            first.setdefault(blocks[h].token_ids, []).append(name)
        replicas.append(
            ReplicaPrefixes(
                name,
                len(blocks),
                len(roots),
                sum(1 for key in keys.values() if holders[key] > 1),
                len(blocks) - len(keys),
            )
        )
    orphans = sum(r.orphans for r in replicas)
    listed = sorted(first.items(), key=lambda item: (-len(item[1]), item[0]))
    return FleetPrefixes(
        pool,
        tuple(replicas),
        len(holders) + orphans,
        sum(1 for n in holders.values() if n > 1),
        sum(n - 1 for n in holders.values()),
        tuple((tokens, tuple(names)) for tokens, names in listed),
    )


def cached_prompt_tokens(
    trees: Mapping[str, CachedBlockTree],
    token_ids: Sequence[int],
    block_size: int,
    pool: Pool = (0, DEFAULT_MEDIUM),
) -> dict[str, int]:
    """Replica name -> leading tokens of the prompt `token_ids` its cache holds (whole blocks of `block_size`,
    matched by tokens from the prompt's first block down): what each replica would serve from its prefix cache
    (vLLM also never serves the last prompt token from the cache: at most len - 1, rounded down to a block)."""
    full = (len(token_ids) - 1) // block_size
    out = {}
    for name, tree in trees.items():
        blocks = tree.blocks(pool)
        parent, hit = None, 0
        for index in range(full):
            want = tuple(token_ids[index * block_size : (index + 1) * block_size])
            children = tree.children(pool, parent)  # parent None: the prompts' first blocks
            match = next((h for h in children if blocks[h].token_ids == want), None)
            if match is None:
                break
            parent, hit = match, hit + block_size
        out[name] = hit
    return out
