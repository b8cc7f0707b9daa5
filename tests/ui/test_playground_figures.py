import numpy as np

from core.paging.playground import Playground, PlaygroundConfig
from ui.playground_figures import block_heatmap, free_blocks_over_actions, waste_over_actions
from ui.theme import FREE_BLOCK_COLOR, sequence_color


def test_heatmap_cells_follow_the_snapshot():
    playground = Playground.demo(PlaygroundConfig(num_blocks=48, block_size=16))
    snapshot = playground.snapshot()
    figure = block_heatmap(snapshot, playground.color_index, columns=8)
    heat = figure.data[0]
    z = np.asarray(heat.z, dtype=float).reshape(-1)
    assert z.shape == (48,)
    scale = heat.colorscale
    colors = {round(stop, 6): color for stop, color in scale}
    n_codes = int(heat.zmax)

    def color_of(block):
        return colors[round(np.floor(z[block]) / n_codes, 6)]

    for block in range(48):
        if snapshot.is_free[block]:
            assert color_of(block) == FREE_BLOCK_COLOR
        else:
            seq = snapshot.seq_ids[snapshot.owner[block]]
            assert color_of(block) == sequence_color(playground.color_index[seq])
    text = np.asarray(heat.text, dtype=object).reshape(-1)
    shared = np.flatnonzero(snapshot.ref_count > 1)
    assert len(shared) == 4 and all(text[b].startswith("×2") for b in shared)
    assert "ref count: 2" in np.asarray(heat.customdata, dtype=object).reshape(-1)[shared[0]]
    assert {t.name for t in figure.data[1:]} == {"s0", "s1", "s2"}


def test_history_figures_plot_every_action():
    playground = Playground.demo()
    free = free_blocks_over_actions(playground.history, 48)
    assert list(free.data[0].y) == [h.free_blocks for h in playground.history]
    assert free.layout.yaxis.title.text == "free blocks"
    waste = waste_over_actions(playground.history, playground.config.bytes_per_token)
    assert list(waste.data[1].y) == [h.paged_waste_slots for h in playground.history]
    assert "tokens" in waste.layout.yaxis.title.text


def test_heatmap_shows_blocks_a_sliding_window_released_as_free():
    from core.paging.scenarios import get_scenario, replay

    playground = replay(get_scenario("running-out-window"), 6)  # s0 reads · → · → · → 3 → 0 → 1
    snapshot = playground.snapshot()
    heat = block_heatmap(snapshot, playground.color_index, columns=6).data[0]
    z = np.asarray(heat.z, dtype=float).reshape(-1)
    colors = {round(stop, 6): color for stop, color in heat.colorscale}
    n_codes = int(heat.zmax)
    shown = [colors[round(np.floor(z[b]) / n_codes, 6)] for b in range(6)]
    assert shown[2] == FREE_BLOCK_COLOR  # released by the window, back in the pool
    assert shown[0] == shown[1] == shown[3] == sequence_color(playground.color_index["s0"])
    assert shown[4] == shown[5] == sequence_color(playground.color_index["s1"])
    text = np.asarray(heat.text, dtype=object).reshape(-1)
    assert [text[b] for b in range(6)] == ["16", "1", "", "16", "16", "16"]  # block 1 holds token 80 only
