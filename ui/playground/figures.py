"""Figures of the block-manager playground. Each builder takes core data and returns a plotly Figure."""

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from core.kv import HostTier, KVCacheSnapshot
from core.page_models.playground import HistoryEntry, HostMoves
from ui.axes import integer_ticks
from ui.block_grid import step_colorscale
from ui.theme import CACHED_BLOCK_COLOR, FREE_BLOCK_COLOR, POLICY_COLORS, sequence_color

DOWN, UP = "↓", "↑"  # a block whose KV went down to the host tier / came up from it in the last action
HOST_HELD_COLOR = "#9ecae1"  # a host block holding KV
HOST_STORED_COLOR = "#3182bd"  # stored (gone down) by the last action
HOST_LOADED_COLOR = "#e6550d"  # loaded (come up) by the last action

ROW_LABEL_PX = 16  # at least this far apart: a 12 px tick label and a gap
MIN_PLOT_PX = 170  # a grid at least as tall as its row axis's title ("block id at row start")


def hbm_marks(moves: HostMoves) -> dict[int, str]:
    """GPU block -> "↓" (its KV was copied down to the host tier by the last action) or "↑" (loaded into it
    from the host tier by the last action)."""
    marks = dict.fromkeys(moves.stored_from, DOWN)
    marks.update(dict.fromkeys((dst for _, dst in moves.loaded), UP))
    return marks


def block_heatmap(
    snapshot: KVCacheSnapshot,
    color_index: Mapping,
    columns: int | None = None,
    title: str | None = None,
    marks: Mapping[int, str] | None = None,
) -> go.Figure:
    """The physical block pool as a grid, block 0 top left, row-major.

    Colour = owning sequence (its stable `color_index`), light grey = free, grey = free but cached.
    Shared blocks (ref count > 1) carry a "×n" label; each cell shows its fill (tokens stored) when the grid is
    small enough to read; hover gives block id, owners, fill and ref count. `marks` (block -> "↓" / "↑", see
    `hbm_marks`) are drawn first in their cells and named in the hover.
    """
    n = snapshot.num_blocks
    columns = columns or max(1, min(32, math.ceil(math.sqrt(n * 2))))
    rows = math.ceil(n / columns)
    codes, keys, seq_code = _owner_codes(snapshot, color_index)
    z = np.full(rows * columns, np.nan)
    z[:n] = codes + 0.5  # the middle of code k's colour band
    hover, text = _cell_texts(snapshot, rows * columns)
    for block, mark in (marks or {}).items():
        moved = "stored to the host tier" if mark == DOWN else "loaded from the host tier"
        text[block] = f"{mark}{text[block]}"
        hover[block] += f"<br>{mark} {moved} by the last action"
    figure = _grid_heatmap(z, text, hover, keys, rows, columns)
    _grid_layout(
        figure,
        rows,
        columns,
        title or f"Physical blocks ({n:,} × {snapshot.block_size} tokens); ×n = shared by n sequences",
    )
    for seq, code in seq_code.items():  # a legend: one invisible trace per sequence
        figure.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=str(seq), marker={"color": keys[code], "size": 12}
            )
        )
    return figure


def _grid_heatmap(z, text, hover, keys: list[str], rows: int, columns: int) -> go.Figure:
    """A block grid: cell values `z` (code k + 0.5 picks colour `keys[k]`), their labels and hover texts, all
    flat arrays of rows x columns reshaped row-major."""
    return go.Figure(
        go.Heatmap(
            z=z.reshape(rows, columns),
            zmin=0,
            zmax=len(keys),
            colorscale=step_colorscale(keys),
            showscale=False,
            xgap=2,
            ygap=2,
            text=text.reshape(rows, columns),
            texttemplate="%{text}",
            customdata=hover.reshape(rows, columns),
            hovertemplate="%{customdata}<extra></extra>",
        )
    )


def host_tier_heatmap(tier: HostTier, moves: HostMoves, columns: int | None = None) -> go.Figure:
    """The host tier's blocks as a grid, host block 0 top left, row-major, beside the HBM grid.

    Colour: free; holding KV; stored by the last action ("↓", its KV gone down from HBM); loaded by the last
    action ("↑", its KV come up into HBM on a hit). Hover: host block id, its state, tokens it spans."""
    n = tier.num_blocks
    columns = columns or max(1, min(32, math.ceil(math.sqrt(n * 2))))
    rows = math.ceil(n / columns)
    held = {tier.host_block(key) for key in tier.stored_keys()}
    stored = set(moves.stored)
    loaded = {src for src, _ in moves.loaded}
    keys = [FREE_BLOCK_COLOR, HOST_HELD_COLOR, HOST_STORED_COLOR, HOST_LOADED_COLOR]
    names = [
        "free",
        f"holding KV ({len(held):,} in all)",
        f"{DOWN} stored by the last action",
        f"{UP} loaded by the last action",
    ]
    z = np.full(rows * columns, np.nan)
    hover = np.full(rows * columns, "", dtype=object)
    text = np.full(rows * columns, "", dtype=object)
    span = tier.tokens_per_host_block
    for block in range(n):
        code = 3 if block in loaded else 2 if block in stored else 1 if block in held else 0
        z[block] = code + 0.5
        text[block] = {3: UP, 2: DOWN}.get(code, "")
        hover[block] = f"host block {block}<br>{names[code]}<br>{span} tokens"
    figure = _grid_heatmap(z, text, hover, keys, rows, columns)
    _grid_layout(
        figure,
        rows,
        columns,
        f"Host tier ({n:,} × {span} tokens, {tier.policy.upper()})",
    )
    for name, color in zip(names, keys, strict=True):  # a legend: one invisible trace per state
        figure.add_trace(
            go.Scatter(x=[None], y=[None], mode="markers", name=name, marker={"color": color, "size": 12})
        )
    figure.update_layout(
        legend={"orientation": "h", "y": -0.02, "yanchor": "top"}
    )  # below: the grid keeps its width
    figure.update_layout(height=figure.layout.height + 60, margin={"b": 70})
    return figure


def _owner_codes(snapshot: KVCacheSnapshot, color_index: Mapping) -> tuple[np.ndarray, list[str], dict]:
    """(colour code per block [num_blocks], the colour of each code, the code of each owning sequence): 0 free,
    1 free but cached, then one code per sequence in the order its first block appears."""
    keys = [FREE_BLOCK_COLOR, CACHED_BLOCK_COLOR]
    codes = np.where(snapshot.is_cached & snapshot.is_free, 1, 0).astype(np.int64)
    owner_ids = [snapshot.seq_ids[i] for i in snapshot.owner[snapshot.owner >= 0].tolist()]
    seq_code: dict = {}
    for seq in dict.fromkeys(owner_ids):
        seq_code[seq] = len(keys)
        keys.append(sequence_color(color_index.get(seq, len(seq_code))))
    codes[snapshot.owner >= 0] = [seq_code[s] for s in owner_ids]
    return codes, keys, seq_code


def _cell_texts(snapshot: KVCacheSnapshot, cells: int) -> tuple[np.ndarray, np.ndarray]:
    """(hover, label) per grid cell [cells], "" past the last block: the hover names the block, its owners (or
    free / free (cached)), fill and ref count; the label, drawn only up to 512 blocks, is "×n" for a shared block
    and its fill."""
    n = snapshot.num_blocks
    owned = snapshot.owner >= 0
    hover = np.full(cells, "", dtype=object)
    text = np.full(cells, "", dtype=object)
    for block in range(n):
        owners = snapshot.owners(block) if owned[block] else []
        ref = int(snapshot.ref_count[block])
        state = "free (cached)" if snapshot.is_cached[block] and snapshot.is_free[block] else "free"
        who = ", ".join(map(str, owners)) if owners else state
        hover[block] = (
            f"block {block}<br>owner: {who}<br>fill: {int(snapshot.fill[block])}/{snapshot.block_size} tokens"
            f"<br>ref count: {ref}"
        )
        if n <= 512:
            fill = int(snapshot.fill[block])
            text[block] = (f"×{ref}<br>" if ref > 1 else "") + (str(fill) if fill else "")
    return hover, text


def _grid_layout(figure: go.Figure, rows: int, columns: int, title: str) -> None:
    """Axes and title of a row-major block grid: rows labelled by their first block id, never overlapping."""
    # the title sits at the top of the figure and the column axis (title and numbers) below it, above the grid
    top, bottom = 110, 10
    height = min(900, max(MIN_PLOT_PX + top + bottom, top + bottom + 28 * rows))
    every = math.ceil(
        ROW_LABEL_PX / ((height - top - bottom) / rows)
    )  # label every k-th row: never overlapping
    labelled = list(range(0, rows, every))
    figure.update_yaxes(
        autorange="reversed",
        title="block id at row start",
        tickvals=labelled,
        ticktext=[f"{r * columns:,}" for r in labelled],
        showgrid=False,
        zeroline=False,
    )
    figure.update_xaxes(title="+ column (blocks)", showgrid=False, zeroline=False, side="top", dtick=1)
    figure.update_layout(
        title={"text": title, "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 12}},
        height=height,
        margin={"l": 10, "r": 10, "t": top, "b": bottom},
    )


def free_blocks_over_actions(history: Sequence[HistoryEntry], num_blocks: int) -> go.Figure:
    """Free-list size after each action (failed actions marked), with the pool size as a dashed line."""
    steps = [h.step for h in history]
    figure = go.Figure(
        go.Scatter(
            x=steps,
            y=[h.free_blocks for h in history],
            mode="lines+markers",
            name="free blocks",
            line={"shape": "hv", "color": POLICY_COLORS["paged"]},
            customdata=[h.action for h in history],
            hovertemplate="action %{x}: %{customdata}<br>%{y:,} free blocks<extra></extra>",
        )
    )
    failed = [h for h in history if not h.ok]
    if failed:
        figure.add_trace(
            go.Scatter(
                x=[h.step for h in failed],
                y=[h.free_blocks for h in failed],
                mode="markers",
                name="failed action",
                marker={"symbol": "x", "size": 12, "color": "#d62728"},
                customdata=[h.message for h in failed],
                hovertemplate="%{customdata}<extra></extra>",
            )
        )
    figure.add_hline(
        y=num_blocks,
        line_dash="dash",
        line_color="#7f7f7f",
        name=f"pool size ({num_blocks:,} blocks)",
        showlegend=True,
    )  # named in the legend: a label drawn at the line would sit on the free-blocks line when all are free
    figure.update_layout(
        title="Free list size after each action",
        xaxis_title="action #",
        xaxis_rangemode="nonnegative",  # one action drawn alone: plotly would centre it on an axis from -1
        yaxis_title="free blocks",
        yaxis_rangemode="tozero",
        height=330,
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    figure.update_xaxes(**integer_ticks(max(steps, default=0)))
    figure.update_yaxes(**integer_ticks(num_blocks))
    return figure


def waste_over_actions(history: Sequence[HistoryEntry], bytes_per_token: int) -> go.Figure:
    """Reserved-but-empty slots after each action: paged (empty slots of owned blocks) vs contiguous."""
    steps = [h.step for h in history]
    figure = go.Figure()
    for name, values, color in (
        (
            "contiguous (reserve max length)",
            [h.contiguous_waste_slots for h in history],
            POLICY_COLORS["contiguous"],
        ),
        ("paged (unfilled last blocks)", [h.paged_waste_slots for h in history], POLICY_COLORS["paged"]),
    ):
        figure.add_trace(
            go.Scatter(
                x=steps,
                y=values,
                mode="lines+markers",
                name=name,
                line={"shape": "hv", "color": color},
                customdata=[v * bytes_per_token / 1024 for v in values],
                hovertemplate="action %{x}: %{y:,} empty slots (%{customdata:,.1f} KiB)<extra></extra>",
            )
        )
    figure.update_layout(
        title="Wasted KV slots after each action",
        xaxis_title="action #",
        xaxis_rangemode="nonnegative",
        yaxis_title="reserved but empty (tokens)",
        yaxis_rangemode="tozero",
        height=330,
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    most = max((max(h.contiguous_waste_slots, h.paged_waste_slots) for h in history), default=0)
    figure.update_xaxes(**integer_ticks(max(steps, default=0)))
    figure.update_yaxes(**integer_ticks(most))
    return figure
