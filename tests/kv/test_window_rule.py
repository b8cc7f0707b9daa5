"""The one window rule (`num_skipped_tokens`) against the worked example in its docstring, and a new layer kind
added with one spec class and one manager class (nothing else in core/kv edited)."""

from dataclasses import dataclass

from core.kv.block_pool import BlockPool
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.single_type_manager import SingleTypeKVCacheManager, manager_for, rule_of
from core.kv.specs import ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheSpec, SlidingWindowSpec
from core.paging.block_manager import BlockManager


def _manager(spec):
    return manager_for(spec, BlockPool(8, [spec]), 0)


def test_worked_example_of_the_docstring():
    # B = 4, 10 tokens computed: the next token is position 10
    window = _manager(SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=1, sliding_window=4))
    chunked = _manager(
        ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, attention_chunk_size=8)
    )
    full = _manager(FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1))
    assert (window.num_skipped_tokens(10), window.num_skipped_blocks(10)) == (7, 1)
    assert (chunked.num_skipped_tokens(10), chunked.num_skipped_blocks(10)) == (8, 2)
    assert (full.num_skipped_tokens(10), full.num_skipped_blocks(10)) == (0, 0)
    assert window.num_skipped_tokens(2) == 0  # before the window fills nothing is skipped


def test_block_manager_facade_releases_by_the_rule():
    # brute force: after appending the token at position p, blocks [0, max(0, p - W + 1) // B) are released
    bm = BlockManager(num_blocks=64, block_size=4, sliding_window=6)
    bm.allocate(0, [1, 2, 3])
    for p in range(3, 40):
        bm.append_token(0, p)
        released = sum(1 for b in bm.block_table(0) if b == -1)
        assert released == max(0, p - 6 + 1) // 4, p


@dataclass(frozen=True, kw_only=True)
class _RecentSpec(KVCacheSpec):
    """A toy kind: the next token reads only the `keep` newest computed tokens (no +1 for itself)."""

    keep: int
    kind = "toy_recent"


class _RecentManager(SingleTypeKVCacheManager):
    spec_type = _RecentSpec

    def num_skipped_tokens(self, num_computed: int) -> int:
        skipped = num_computed - self.spec.keep
        return skipped * (skipped > 0)  # max(0, skipped), elementwise for arrays too (the rule's contract)


def test_a_new_kind_is_one_spec_and_one_manager():
    spec = _RecentSpec(block_size=4, num_kv_heads=1, head_size=8, keep=5)
    kv = KVCacheManager([spec, FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8)], 40)
    assert isinstance(kv.managers[0], _RecentManager)
    kv.allocate("r", list(range(20)))  # 5 blocks per group
    assert kv.num_free_blocks == 40 - 10
    kv.mark_computed("r", 20)  # skipped 15 tokens: blocks 0..2 of the toy group released
    assert kv.block_ids("r")[0][:3] == [-1, -1, -1]
    assert kv.num_held_blocks("r") == (2, 5)
    assert kv.num_free_blocks == 40 - 7
    assert kv.num_blocks_to_append({"r": 1}) == 2  # the one blocks-per-step question knows the kind too
    kv.append_token("r", 99)  # position 20 starts block 5 in both groups
    assert kv.num_held_blocks("r") == (3, 6)
    # 8 more tokens (29: 8 entries), all but the newest computed first: the toy group skips 28 - 5 = 23
    # tokens (5 blocks), so it releases blocks 3 and 4 and takes blocks 6 and 7; the full group takes 6 and 7
    assert kv.num_blocks_to_append({"r": 8}) == (2 - 2) + 2
    free = kv.num_free_blocks
    kv.decode_steps({"r": [1] * 8})
    assert free - kv.num_free_blocks == 2
    assert kv.num_held_blocks("r") == (3, 8)
    kv.free("r")
    assert kv.num_free_blocks == 40
    # and the table-less questions (planners, counted policies, read counts) know it through rule_of
    rule = rule_of(spec)
    assert isinstance(rule, _RecentManager) and rule.num_skipped_tokens(20) == 15
    assert rule.max_blocks_held(3, 40) == 3  # a query reads 6 tokens (5 + itself): ceil((6 + 3) / 4) blocks


def test_every_user_of_the_rule_matches_its_closed_form():
    """The fit bound, the K/V read count and the facade's releases ask `num_skipped_tokens`; for a sliding
    window they equal the closed forms that used to be written beside them (brute force over small cases)."""
    import numpy as np

    from core.common import cdiv

    for bs in (1, 2, 4, 16):
        for w in (1, 3, 8, 17):
            m = _manager(SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=1, sliding_window=w))
            for prompt in (1, 5, 16, 40):
                for out in (1, 7, 30):
                    full = cdiv(prompt + out, bs)
                    assert m.max_blocks_held(prompt, prompt + out) == min(
                        full, max(cdiv(prompt, bs), cdiv(w + bs - 1, bs))
                    )
            lens = np.arange(1, 60, dtype=np.int64)
            q = (lens % 7) + 1
            ctx = lens + q
            assert m.num_tokens_read(lens, ctx, q) == int(
                np.minimum(lens, w).sum() + np.minimum(ctx, q + w - 1).sum()
            )
    # chunked local attention (C = 8): a decode query at position p reads its chunk so far, p % 8 + 1 tokens
    chunked = _manager(
        ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, attention_chunk_size=8)
    )
    lens = np.arange(1, 30, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    assert chunked.num_tokens_read(lens, empty, empty) == int(((lens - 1) % 8 + 1).sum())
