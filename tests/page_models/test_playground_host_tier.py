"""The playground's host tier (core.kv.HostTier behind the block manager's pool) against hand-worked moves and
the K/V written: what goes down to the tier comes back up byte for byte."""

import pytest
import torch

from core.errors import InvalidArgumentError
from core.page_models.playground import HostMoves, Playground, PlaygroundConfig


def host_playground(**kw) -> Playground:
    return Playground(PlaygroundConfig(enable_prefix_caching=True, **{"host_blocks": 64, **kw}))


def test_a_prefix_evicted_from_hbm_comes_back_from_the_host_tier_with_its_kv():
    playground = host_playground(num_blocks=8, block_size=16, system_prompt_len=32)
    playground.add_sequence(40)  # 2 full blocks (the system prompt) + 8 tokens: both full blocks go down
    assert playground.host_moves.stored == (0, 1) and playground.host_moves.stored_from == (0, 1)
    written = torch.stack(playground._truth["s0"][:32])  # the K/V written for the system prompt
    playground.free("s0")
    # takes all 8 HBM blocks: the cached prompt is evicted
    playground.add_sequence(8 * 16, shared_prefix=False)
    assert playground.manager.prefix_cache_stats.evictions_blocks >= 2
    playground.free("s1")
    hbm_hits_before = playground.manager.prefix_cache_stats.hits_tokens
    assert playground.add_sequence(40) == "s2 (2 blocks loaded from the host tier)"
    assert playground.manager.prefix_cache_stats.hits_tokens == hbm_hits_before  # no HBM hit: it left HBM
    table = playground.manager.block_table("s2")
    assert playground.host_moves.loaded == ((0, table[0]), (1, table[1]))  # up, into s2's first two blocks
    assert playground.host_hit_tokens == 32
    key, value = playground.paged.cache.gather(0, table[:2], 32)
    assert torch.equal(torch.stack([key, value], dim=1), written)  # the very K/V s0 wrote, through the tier
    assert playground.verify() == 0.0


def test_lru_evicts_the_oldest_host_blocks_to_store_new_ones():
    playground = host_playground(host_blocks=4)
    playground.add_sequence(70)  # 4 full blocks: host blocks 0-3
    assert playground.host_moves == HostMoves((0, 1, 2, 3), (0, 1, 2, 3), (), 0)
    playground.add_sequence(33, shared_prefix=False)  # 2 full blocks need 2 host blocks: LRU evicts 0 and 1
    # evicted ids return to the free list in eviction order (0, then 1) and are taken last-in first
    assert playground.host_moves == HostMoves((1, 0), tuple(playground.manager.block_table("s1")[:2]), (), 2)
    assert playground.host_tier.num_used_blocks == 4
    assert playground.history[-1].host_stored_blocks == 2 and playground.history[-1].host_used_blocks == 4


def test_the_demo_scene_moves_blocks_down_and_up_hand_checked():
    playground = Playground.demo(PlaygroundConfig(enable_prefix_caching=True, host_blocks=64))
    # s0 70 tokens: 4 full blocks down; s1 45 hits the 2 prompt blocks in HBM, its 3rd is partial; s1 +20 = 65
    # fills blocks 2 and 3 (down, decode stores); the filler takes all 48 HBM blocks (48 down); s4 loads the
    # 2 system-prompt blocks back up
    assert [h.host_used_blocks for h in playground.history] == [0, 4, 4, 4, 4, 6, 6, 6, 6, 6, 54, 54, 54]
    assert [h.host_loaded_blocks for h in playground.history][-1] == 2
    assert playground.host_hit_tokens == 32 and playground.verify() == 0.0
    arc = Playground.demo(
        PlaygroundConfig(
            enable_prefix_caching=True, host_blocks=64, host_block_tokens=32, offload_policy="arc"
        )
    )
    assert arc.host_tier.policy == "arc" and arc.host_tier.blocks_per_host_block == 2
    assert arc.host_moves.loaded == ((0, 0), (0, 1))  # one 32-token host block fills two 16-token GPU blocks
    assert arc.verify() == 0.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"host_blocks": -1}, "between 0 and 4,096, got -1"),
        ({"host_block_tokens": 24}, "multiple of the GPU block size 16"),
        ({"offload_policy": "fifo"}, "lru, arc"),
        ({"enable_prefix_caching": False}, "needs prefix caching"),
        ({"host_blocks": float("nan")}, "host tier size"),
    ],
)
def test_bad_host_tier_settings_are_one_plain_error(changes, message):
    config = {"enable_prefix_caching": True, "host_blocks": 8, **changes}
    with pytest.raises(InvalidArgumentError, match=message):
        Playground(PlaygroundConfig(**config))
