"""CachedBlockTree against a brute-force replay of the event log, and hand-worked cases."""

from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, decode_event_batch
from core.kv.events import encode_event_batch as encode
from core.live.tree import CachedBlockTree

BS = 2  # tokens per block in these tests

hashes = st.integers(0, 9)
groups = st.sampled_from([None, 0, 1])
media = st.sampled_from([None, "GPU", "CPU"])


@st.composite
def stored(draw):
    chain = draw(st.lists(hashes, min_size=1, max_size=3))
    parent = draw(st.none() | hashes)
    tokens = [draw(st.integers(0, 50)) for _ in range(BS * len(chain))]
    return BlockStored(chain, parent, tokens, BS, None, draw(media), None, group_idx=draw(groups))


removed = st.builds(
    lambda h, m, g: BlockRemoved(h, m, group_idx=g), st.lists(hashes, max_size=3), media, groups
)
events = st.lists(st.one_of(stored(), stored(), removed, st.just(AllBlocksCleared())), max_size=40)


def brute_force(log):
    """pool -> hash -> (parent, tokens), from the whole log: a block is cached when the last event naming it in
    its pool (or a clear) is a store; parent and tokens come from that store."""
    last: dict[tuple, tuple] = {}
    for i, event in enumerate(log):
        if isinstance(event, AllBlocksCleared):
            last = dict.fromkeys(last, ("cleared", i))
            continue
        pool = (event.group_idx or 0, event.medium or "GPU")
        for j, h in enumerate(event.block_hashes):
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash if j == 0 else event.block_hashes[j - 1]
                last[(pool, h)] = ("stored", parent, tuple(event.token_ids[j * BS : (j + 1) * BS]))
            else:
                last[(pool, h)] = ("removed",)
    cached: dict = {}
    for (pool, h), state in last.items():
        if state[0] == "stored":
            cached.setdefault(pool, {})[h] = (state[1], state[2])
    return cached


def brute_walk(blocks):
    """hash -> (depth, blocks below, leaves) for blocks whose parent chain reaches a root (no cycle)."""

    def chain(h):
        seen = [h]
        while blocks[seen[-1]][0] in blocks:
            if blocks[seen[-1]][0] in seen:
                return None  # a cycle: never reaches a root
            seen.append(blocks[seen[-1]][0])
        return seen

    chains = {h: c for h in blocks if (c := chain(h)) is not None}
    out = {}
    for h, c in chains.items():
        below = [d for d, dc in chains.items() if d != h and h in dc]
        leaves = [d for d in [*below, h] if not any(blocks[x][0] == d for x in chains)]
        out[h] = (len(c), len(below), len(leaves))
    return out


@settings(max_examples=300, deadline=None)
@given(events)
def test_tree_equals_brute_force_replay(log):
    tree = CachedBlockTree()
    for event in log:
        tree.apply(event)
    expected = brute_force(log)
    assert tree.counts() == {pool: len(b) for pool, b in sorted(expected.items()) if b}
    for pool, blocks in expected.items():
        got = tree.blocks(pool)
        assert {h: (b.parent_hash, b.token_ids) for h, b in got.items()} == blocks
        walked = {p.block.block_hash: (p.depth, p.blocks_below, p.leaves) for p in tree.walk(pool)}
        assert walked == brute_walk(blocks)
        for parent in {b[0] for b in blocks.values()}:
            assert sorted(tree.children(pool, parent)) == sorted(
                h for h, b in blocks.items() if b[0] == parent
            )


@settings(max_examples=100, deadline=None)
@given(events)
def test_batches_through_the_wire_format_build_the_same_tree(log):
    direct, wired = CachedBlockTree(), CachedBlockTree()
    for event in log:
        direct.apply(event)
    wired.apply_batch(decode_event_batch(encode(log, ts=1.0)))
    assert wired.counts() == direct.counts()
    for pool in direct.pools():
        assert wired.blocks(pool) == direct.blocks(pool)


def test_two_prompts_sharing_a_system_prompt():
    tree = CachedBlockTree()
    # system prompt: blocks 1 -> 2; user A continues with 3 -> 4, user B with 5
    tree.apply_batch(
        KVEventBatch(
            ts=0.0,
            events=[
                BlockStored([1, 2, 3, 4], None, list(range(8)), BS, None, "GPU", None),
                BlockStored([5], 2, [9, 9], BS, None, "GPU", None),
            ],
        )
    )
    pool = (0, "GPU")
    assert tree.num_blocks() == 5 and tree.max_depth(pool) == 4
    top = tree.most_shared(pool, 2)
    assert [(p.block.block_hash, p.leaves, p.blocks_below) for p in top] == [(1, 2, 4), (2, 2, 3)]
    assert tree.blocks(pool)[3].token_ids == (4, 5)
    tree.apply(BlockRemoved([2], "GPU"))  # eviction of the middle block: 3 and 5 become orphan roots
    assert tree.orphans(pool) == 2 and sorted(tree.roots(pool)) == [1, 3, 5]
    tree.apply(BlockRemoved([42], "GPU"))
    assert tree.unknown_removals == 1
    tree.apply(BlockStored([7], None, [0, 0], BS, None, "CPU", None, group_idx=1))
    assert tree.counts() == {(0, "GPU"): 4, (1, "CPU"): 1}
    assert tree.num_blocks(medium="CPU") == 1 and tree.num_blocks(group=0) == 4
    tree.apply(AllBlocksCleared())
    assert tree.counts() == {} and tree.clears == 1


def test_parent_cycle_from_a_broken_stream_does_not_hang():
    tree = CachedBlockTree()
    tree.apply(BlockStored([1], 2, [0, 0], BS, None, "GPU", None))
    tree.apply(BlockStored([2], 1, [0, 0], BS, None, "GPU", None))
    assert tree.num_blocks() == 2 and tree.walk((0, "GPU")) == []
