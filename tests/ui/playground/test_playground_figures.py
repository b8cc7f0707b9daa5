import itertools

import numpy as np

from core.page_models.playground import Playground, PlaygroundConfig
from ui.playground.figures import block_heatmap, free_blocks_over_actions, waste_over_actions
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
    # action numbers start at 0: a history of one action is not drawn on an axis from -1
    assert free.layout.xaxis.rangemode == waste.layout.xaxis.rangemode == "nonnegative"


def test_heatmap_shows_blocks_a_sliding_window_released_as_free():
    from core.page_models.scenarios import get_scenario, replay

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


def test_integer_ticks_are_whole_numbers_of_1_2_5_steps():
    from ui.axes import integer_ticks

    # hand-worked: the smallest of 1, 2, 5, 10, 20, ... with at most 8 intervals up to the maximum
    assert [integer_ticks(m)["dtick"] for m in (0, 5, 8, 9, 16, 17, 48, 555, 4096)] == [
        1,
        1,
        1,
        2,
        2,
        5,
        10,
        100,
        1000,
    ]
    assert integer_ticks(3) == {"tick0": 0, "dtick": 1, "tickformat": ",d"}


def test_history_charts_tick_counts_in_whole_numbers_and_name_the_pool_in_the_legend():
    playground = Playground.demo()
    free = free_blocks_over_actions(playground.history, 48)
    waste = waste_over_actions(playground.history, playground.config.bytes_per_token)
    for figure in (free, waste):
        for axis in (figure.layout.xaxis, figure.layout.yaxis):
            assert axis.dtick >= 1 and axis.dtick == int(axis.dtick) and axis.tickformat == ",d"
    assert free.layout.xaxis.dtick == 1  # a handful of actions: every action numbered, no 0.5
    pool = [s for s in free.layout.shapes if s.type == "line"]
    assert [s.y0 for s in pool] == [48] and pool[0].showlegend and pool[0].name == "pool size (48 blocks)"
    assert not free.layout.annotations  # no label drawn on the lines


def test_heatmap_column_labels_do_not_run_together():
    from tests.ui.label_spacing import assert_labels_apart

    playground = Playground(PlaygroundConfig(num_blocks=4096, block_size=16))
    figure = block_heatmap(playground.snapshot(), playground.color_index)
    axis = figure.layout.xaxis
    columns = 32  # the widest grid the builder draws
    assert axis.dtick == 1 and len(figure.data[0].z[0]) == columns
    # the page draws the heatmap in 5/8 of a 1,150 px main area, less the margins
    plot_px = 1150 * 5 / 8 - figure.layout.margin.l - figure.layout.margin.r
    assert_labels_apart(
        [plot_px * (c + 0.5) / columns for c in range(columns)], [str(c) for c in range(columns)]
    )
    rows = len(figure.data[0].z)
    row_px = (figure.layout.height - figure.layout.margin.t - figure.layout.margin.b) / rows
    labelled = list(figure.layout.yaxis.tickvals)
    assert labelled[0] == 0 and labelled[-1] >= rows - (labelled[1] - labelled[0])  # every part of the pool
    assert min(b - a for a, b in itertools.pairwise(labelled)) * row_px >= 14  # 12 px labels never touch
    assert list(figure.layout.yaxis.ticktext)[:2] == ["0", f"{labelled[1] * columns:,}"]


def test_heatmap_titles_have_room_of_their_own():
    from tests.ui.label_spacing import label_width_px

    playground = Playground(PlaygroundConfig(num_blocks=8, block_size=16))  # two rows: the smallest grid
    figure = block_heatmap(playground.snapshot(), playground.color_index)
    layout = figure.layout
    # the title hangs from the top of the figure; the column axis (title + numbers, ~45 px) sits between it and
    # the grid, inside the top margin
    assert layout.title.yref == "container" and layout.title.yanchor == "top" and layout.title.y == 1
    assert layout.margin.t >= 30 + 45 + 20
    plot_px = layout.height - layout.margin.t - layout.margin.b
    assert label_width_px(layout.yaxis.title.text) <= plot_px  # the row axis's title is not cut
