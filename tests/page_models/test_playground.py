"""core.page_models.playground against hand-worked numbers, and the playground page under AppTest."""

import pytest

from core.errors import InvalidArgumentError, OutOfBlocksError, UnknownSequenceError
from core.page_models.playground import Playground, PlaygroundConfig
from tests.conftest import open_app


def test_demo_scene_numbers_are_hand_checked():
    playground = Playground.demo(PlaygroundConfig(num_blocks=48, block_size=16))
    # s0: 70 tokens = 5 blocks; s1: 45 = 3; fork s2 shares s0's 5; s2 +5 copies s0's half-full block 4 (+1);
    # s1 +20 = 65 tokens = 5 blocks (+2); s0 +3 = 73 tokens, still 5 blocks. Used 5 + 1 + 5 = 11.
    assert playground.manager.num_free_blocks == 48 - 11
    waste = playground.waste()
    # stored: s0's 4 shared full blocks (64) + s0 last block (9) + s2 last block (6 + 5 = 11) + s1 (65)
    assert waste.stored_tokens == 64 + 9 + 11 + 65
    assert waste.paged == 11 * 16 - waste.stored_tokens
    assert waste.contiguous == (256 - 73) + (256 - 65) + (256 - 75)
    assert playground.verify() == 0.0
    assert [h.free_blocks for h in playground.history] == [48, 43, 40, 40, 39, 37, 37]


def test_failed_actions_are_recorded_and_change_nothing():
    playground = Playground(PlaygroundConfig(num_blocks=2, block_size=4))
    playground.add_sequence(8)
    before = playground.manager.snapshot().free_order.tolist()
    with pytest.raises(OutOfBlocksError):
        playground.append("s0", 1)
    with pytest.raises(UnknownSequenceError):
        playground.fork("nope")
    with pytest.raises(InvalidArgumentError):
        playground.add_sequence(0)
    assert playground.manager.snapshot().free_order.tolist() == before
    assert [h.ok for h in playground.history] == [True, True, False, False]
    assert playground.verify() == 0.0


def test_prefix_caching_reuses_the_system_prompt():
    playground = Playground(PlaygroundConfig(block_size=16, system_prompt_len=32, enable_prefix_caching=True))
    playground.add_sequence(40)
    message = playground.add_sequence(40)
    assert "2 prefix blocks from cache" in message
    assert playground.manager.block_table("s0")[:2] == playground.manager.block_table("s1")[:2]
    assert playground.verify() == 0.0


def test_sliding_window_pool_releases_blocks_and_reads_back_the_window():
    playground = Playground(
        PlaygroundConfig(num_blocks=8, block_size=4, sliding_window=6, system_prompt_len=0)
    )
    playground.add_sequence(10)  # blocks 0, 1, 2 (10 tokens in blocks of 4)
    playground.fork("s0")
    playground.append("s1", 7)  # 17 tokens: token 16 reads 11..16, so blocks 0 and 1 (positions 0..7) go
    assert playground.manager.block_table("s1")[:2] == [-1, -1]
    assert playground.manager.ref_count(0) == 1  # still held by s0
    assert playground.verify() == 0.0  # s1's held blocks (the copy of block 2 included) read back exactly
    playground.free("s0")
    assert playground.manager.num_free_blocks == 8 - playground.manager.num_held_blocks("s1")


def test_bad_config_is_refused():
    with pytest.raises(InvalidArgumentError, match="num_blocks"):
        Playground(PlaygroundConfig(num_blocks=0))
    with pytest.raises(InvalidArgumentError, match="sliding_window"):
        Playground(PlaygroundConfig(sliding_window=0))


# ---- the page -------------------------------------------------------------------------------------------------


def free_blocks_shown(at) -> int:
    return int(at.metric[0].value.split("/")[0].replace(",", ""))


def test_page_opens_on_the_demo_scene():
    at = open_app("app_pages/playground.py")
    assert free_blocks_shown(at) == 37
    assert len(at.get("plotly_chart")) == 3
    assert "PagedAttention keeps" in at.markdown[0].value


def test_actions_change_the_free_block_count():
    at = open_app("app_pages/playground.py")
    at.number_input(key="prompt_len").set_value(33).run()  # 33 tokens = 3 blocks of 16
    at.button(key="add").click().run()
    assert not at.exception
    assert free_blocks_shown(at) == 37 - 3
    at.selectbox(key="target").set_value("s3").run()
    at.number_input(key="append_count").set_value(16).run()  # 49 tokens = 4 blocks
    at.button(key="append").click().run()
    assert free_blocks_shown(at) == 37 - 4
    at.button(key="fork").click().run()  # sharing takes no block
    assert free_blocks_shown(at) == 37 - 4
    at.button(key="free").click().run()  # frees s3; its fork s4 still holds the blocks
    assert free_blocks_shown(at) == 37 - 4
    assert not at.exception


def test_out_of_blocks_shows_an_error_not_a_traceback():
    at = open_app("app_pages/playground.py")
    at.number_input(key="prompt_len").set_value(10_000).run()
    at.button(key="add").click().run()
    assert not at.exception
    assert "out of KV blocks" in at.error[0].value
    assert free_blocks_shown(at) == 37  # nothing lost
