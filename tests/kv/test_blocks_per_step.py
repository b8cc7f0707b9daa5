"""One blocks-per-step question: `KVCacheManager.num_blocks_to_append`, summing each single-type manager's
`num_new_blocks` and `written_tail`. The engine's memory, the simulator's paged policy and the counted policy
answer the scheduler's `decode_blocks` by asking it, so they agree on every step of a shared trace because they
call the same function: a second copy of the arithmetic in any of them makes the perturbation tests fail."""

import random
from types import SimpleNamespace

import pytest

from core.engine.memory import EngineMemory
from core.errors import InvalidArgumentError
from core.kv import BlockCopy, KVCacheBlocks
from core.kv.block_hash import hash_block_tokens
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.single_type_manager import SingleTypeKVCacheManager
from core.kv.specs import FullAttentionSpec, SlidingWindowSpec
from core.serving.counted_memory import CountedPagedMemory
from core.serving.memory_policies import Policy
from core.serving.paged_memory import PagedMemory

BS = 4


def _state(rng: random.Random, window: int | None, caching: bool = False) -> tuple[KVCacheManager, list]:
    """A manager with a few requests (prompts computed, some forked: a shared partly filled last block), and
    the groups of their sequence ids (one group per prompt and its forks)."""
    specs = [FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1)]
    if window is not None:
        specs.append(SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=1, sliding_window=window))
    kv = KVCacheManager(specs, 4_000, enable_prefix_caching=caching)
    groups = []
    for r in range(rng.randint(1, 5)):
        prompt = [rng.randrange(3) for _ in range(rng.randint(1, 14))]
        kv.allocate(r, prompt)
        kv.mark_computed(r, len(prompt))
        ids = [r]
        for c in range(rng.randint(0, 2)):
            kv.fork(r, (r, c))
            ids.append((r, c))
        groups.append(ids)
    return kv, groups


def _seq_groups(groups: list) -> list:
    """The same groups as the engine (`seqs` with `seq_id`) and the simulator (`seq_ids`) read them."""
    return [
        SimpleNamespace(seqs=[SimpleNamespace(seq_id=s) for s in ids], seq_ids=list(ids)) for ids in groups
    ]


class _Counted:
    """A group as the counted policy keys it (by identity) and reads it (its length)."""

    def __init__(self, length: int):
        self.length = length


def _engine_memory(kv: KVCacheManager) -> EngineMemory:
    cache = SimpleNamespace(block_size=BS, num_blocks=kv.num_blocks, num_layers=len(kv.groups))
    return EngineMemory(kv, cache, tuple(range(len(kv.groups))))


def _paged_policy(kv: KVCacheManager) -> PagedMemory:
    paged = PagedMemory(Policy("paged", BS), kv.num_blocks * BS, 0.0)
    paged.kv = kv  # the policy over the shared trace's manager
    return paged


@pytest.mark.parametrize("seed", range(12))
def test_engine_and_simulator_agree_on_every_step_of_a_shared_trace(seed):
    rng = random.Random(seed)
    kv, groups = _state(rng, rng.choice([None, 3, 6, 9]), caching=rng.random() < 0.5)
    engine, simulator = _engine_memory(kv), _paged_policy(kv)
    for _ in range(15):
        views = _seq_groups(groups)
        ids = [s for g in groups for s in g]
        expected = kv.num_blocks_to_append(dict.fromkeys(ids, 1))
        assert engine.decode_blocks(views) == simulator.decode_blocks(views) == expected
        free = kv.num_free_blocks
        kv.decode_steps({s: [rng.randrange(3)] for s in ids})  # the step the answer was about
        assert free - kv.num_free_blocks == expected  # and the answer is what the step takes


def test_every_caller_asks_the_one_question(monkeypatch):
    """Shift the KV core's answers: every caller's answer shifts with them (no caller has its own copy)."""
    kv, groups = _state(random.Random(3), 6)
    views = _seq_groups(groups)
    engine, simulator = _engine_memory(kv), _paged_policy(kv)
    before = (engine.decode_blocks(views), simulator.decode_blocks(views))
    real = KVCacheManager._blocks_to_append  # what num_blocks_to_append / num_blocks_for_decode sum with
    monkeypatch.setattr(KVCacheManager, "_blocks_to_append", lambda self, *args: real(self, *args) + 1000)
    assert (engine.decode_blocks(views), simulator.decode_blocks(views)) == (
        before[0] + 1000,
        before[1] + 1000,
    )

    counted = CountedPagedMemory(BS, 400, 0.0)
    lengths = [_Counted(n) for n in (3, 4, 8, 9)]
    for group in lengths:
        counted.admit(group, group.length)  # holds ceil(L / 4) blocks: 1, 1, 2, 3
    assert counted.decode_blocks(lengths) == 2  # lengths 4 and 8 start a block
    # the counted policy has no tables: it asks the KV core's table length for L + 1 tokens (doubled here:
    # 2 x (1, 2, 3, 3) less the blocks held)
    rule = SingleTypeKVCacheManager.num_required_blocks
    monkeypatch.setattr(SingleTypeKVCacheManager, "num_required_blocks", lambda self, n: 2 * rule(self, n))
    assert counted.decode_blocks(lengths) == (2 - 1) + (4 - 1) + (6 - 2) + (6 - 3)


@pytest.mark.parametrize("seed", range(15))
def test_the_full_attention_fast_path_is_the_general_rule(seed):
    """`num_blocks_to_append`'s all-full path against the general one (windows, tails, releases) on the same
    state: a specialisation, not a second rule."""
    rng = random.Random(seed)
    kv, groups = _state(rng, None, caching=rng.random() < 0.5)
    for _ in range(8):
        ids = [s for g in groups for s in g]
        counts = {s: rng.randint(1, 9) for s in rng.sample(ids, rng.randint(1, len(ids)))}
        fast = kv.num_blocks_to_append(counts)
        kv._one_full_group = False
        general = kv.num_blocks_to_append(counts)
        kv._one_full_group = True
        assert fast == general
        kv.decode_steps({s: [1] * n for s, n in counts.items()})


def test_blocks_needed_worked_example():
    kv = KVCacheManager([FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)], 100)
    assert kv.blocks_needed(10, 2, 6) == 1 + 2 * (3 - 1)  # one shared full block, then each its own
    assert kv.blocks_needed(6, 2, 6) == 2  # nothing written past the prompt: all shared
    assert kv.blocks_needed(10) == 3
    kv.allocate("p", list(range(6)))
    kv.fork("p", "c")
    copies = [kv.append_token(rid, t) for rid in ("p", "c") for t in range(4)]
    assert kv.num_blocks - kv.num_free_blocks == 5  # what blocks_needed(10, 2, 6) said
    # typed block lists: the first write into the shared tail copies it, a BlockCopy(src, dst)
    first = copies[0][0]
    assert isinstance(first, BlockCopy) and first.src == kv.block_ids("c")[0][1] != first.dst
    assert all(c == (None,) for c in copies[1:])
    tables = kv.block_ids("p")
    assert isinstance(tables, KVCacheBlocks) and tables.num_held == kv.num_held_blocks("p") == (3,)


def test_a_request_owns_its_tokens_and_block_hashes():
    """One mode (vLLM's request with its `block_hashes`): `allocate` keeps a checked copy of the prompt, every
    decode token is given to `append_token` (checked), a fork copies the parent's tokens and hashes, and a
    later change to the caller's list changes nothing in the manager."""
    kv = KVCacheManager(
        [FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1)], 20, enable_prefix_caching=True
    )
    own = [1, 2, 3, 4, 5, 6]
    kv.allocate("r", own)
    own[0] = 99  # the caller's list is not the request's
    own.append(7)
    kv.mark_computed("r", 6)
    assert kv.num_tokens("r") == 6 and kv.token_ids("r") == [1, 2, 3, 4, 5, 6]
    assert not hasattr(kv._request("r"), "view")
    with pytest.raises(InvalidArgumentError, match="integers"):
        kv.append_token("r", "7")  # checked, and nothing changed
    assert kv.num_tokens("r") == 6
    kv.append_token("r", 7)
    kv.append_token("r", 8)
    kv.mark_computed("r", 8)  # block 1 (5..8) is full: hashed from the request's own tokens and cached
    request = kv._request("r")
    first = hash_block_tokens(None, (1, 2, 3, 4))
    assert request.block_hashes[4] == [first, hash_block_tokens(first, (5, 6, 7, 8))]
    kv.fork("r", "c")
    kv.append_token("c", 9)
    child = kv._request("c")
    assert child.block_hashes == request.block_hashes and child.block_hashes[4] is not request.block_hashes[4]
    assert kv.token_ids("c") == [1, 2, 3, 4, 5, 6, 7, 8, 9] and kv.token_ids("r") == [1, 2, 3, 4, 5, 6, 7, 8]
    kv.allocate("again", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert kv.num_computed_tokens("again") == 8  # both full blocks hit: the hashes were the request's tokens
