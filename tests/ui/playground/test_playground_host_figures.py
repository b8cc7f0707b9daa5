"""The playground's two-tier figures against the KV core's own state: the host grid's cells are the tier's
blocks, and the ↓ / ↑ marks are the last action's stores and loads."""

import numpy as np

from core.page_models.playground import Playground, PlaygroundConfig
from ui.playground.figures import DOWN, UP, block_heatmap, hbm_marks, host_tier_heatmap


def cells(figure, attribute):
    return np.asarray(getattr(figure.data[0], attribute), dtype=object).reshape(-1)


def test_host_grid_cells_are_the_tiers_blocks_with_the_last_loads_marked():
    playground = Playground.demo(PlaygroundConfig(enable_prefix_caching=True, host_blocks=64))
    tier, moves = playground.host_tier, playground.host_moves
    figure = host_tier_heatmap(tier, moves, columns=8)
    codes = np.floor(cells(figure, "z").astype(float)).astype(int)
    held = {tier.host_block(key) for key in tier.stored_keys()}
    assert len(codes) == 64 and int((codes > 0).sum()) == tier.num_used_blocks == len(held) == 54
    assert {int(b) for b in np.flatnonzero(codes == 3)} == {src for src, _ in moves.loaded} == {0, 1}
    assert {int(b) for b in np.flatnonzero(codes == 0)} == set(range(64)) - held
    text = cells(figure, "text")
    assert [int(b) for b in np.flatnonzero(text == UP)] == [0, 1]
    assert figure.layout.title.text == "Host tier (64 × 16 tokens, LRU)"
    assert figure.data[2].name == "holding KV (54 in all)"
    assert figure.layout.xaxis.title.text == "+ column (blocks)"


def test_stores_are_marked_down_in_both_grids():
    playground = Playground(PlaygroundConfig(enable_prefix_caching=True, host_blocks=4))
    playground.add_sequence(70)
    moves = playground.host_moves
    host = cells(host_tier_heatmap(playground.host_tier, moves), "text")
    assert [int(b) for b in np.flatnonzero(host == DOWN)] == [0, 1, 2, 3]
    marks = hbm_marks(moves)
    assert marks == {0: DOWN, 1: DOWN, 2: DOWN, 3: DOWN}
    hbm = cells(block_heatmap(playground.snapshot(), playground.color_index, marks=marks), "text")
    assert [int(b) for b in range(len(hbm)) if str(hbm[b]).startswith(DOWN)] == [0, 1, 2, 3]
    assert hbm[4] == "6"  # block 4 holds the 6 tokens past 64, unmarked (a partial block is never stored)
