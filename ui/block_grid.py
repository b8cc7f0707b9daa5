"""A pool of KV blocks drawn as a grid of fixed size on screen, whatever the number of blocks.

Small pools (at most `MAX_CELLS` blocks) draw one cell per block, coloured by the request that holds it. Larger
pools (a 7B model on an 80 GiB GPU has ~10^5 blocks) draw aggregate cells: cell c holds the run of
`blocks_per_cell` consecutive blocks [c * k, (c + 1) * k), coloured by occupancy (share of its blocks held by a
request), and its hover says which blocks it covers and how many are used, partly filled, shared and cached.
Both modes keep the grid within `MAX_ROWS` rows, so the chart keeps its height.

Cells are laid out row-major: cell c at (x = c % cols, y = c // cols). Axis ticks name blocks, not cells: the y
ticks give each row's first block, the x ticks the offset within the row in blocks.
"""

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from ui.theme import CACHED_BLOCK_COLOR, FREE_BLOCK_COLOR, sequence_color

MAX_CELLS = 1_536  # cells drawn at most (64 columns x 24 rows)
MAX_COLUMNS = 64
OCCUPANCY_COLOR = "#08519c"  # a cell whose blocks are all held; free cells are FREE_BLOCK_COLOR


@dataclass(frozen=True)
class GridShape:
    """blocks_per_cell: k consecutive blocks per cell (1: one cell per block); cols, rows: the grid's cells."""

    blocks_per_cell: int
    cols: int
    rows: int


def grid_shape(num_blocks: int, columns: int | None = None, max_cells: int = MAX_CELLS) -> GridShape:
    """The grid for `num_blocks`: one cell per block up to `max_cells`, else runs of ceil(blocks / max_cells)
    blocks per cell. Columns: `columns` if given, else MAX_COLUMNS for aggregate cells and about twice as many as
    rows (at most MAX_COLUMNS) for one cell per block."""
    k = max(1, math.ceil(num_blocks / max_cells))
    cells = max(1, math.ceil(num_blocks / k))
    if columns is None:
        columns = MAX_COLUMNS if k > 1 else min(MAX_COLUMNS, max(8, math.ceil(math.sqrt(cells * 2))))
    cols = columns
    return GridShape(k, cols, max(1, math.ceil(cells / cols)))


def step_colorscale(colors: list[str]) -> list:
    """A discrete plotly colour scale: z code k of len(colors) codes is drawn in colors[k] over [k, k + 1)."""
    n = len(colors)
    scale = []
    for i, color in enumerate(colors):
        scale += [[i / n, color], [(i + 1) / n, color]]
    return scale


def _per_block(owner, ref, fill, cached, names, block_size, shape: GridShape):
    """z codes (0 free, 1 cached-free, 2.. the owner's palette colour), hover texts, colorscale, zmax."""
    palette = [sequence_color(i) for i in range(24)]
    code = np.where(owner >= 0, 2 + owner % len(palette), np.where(cached, 1, 0)).astype(float)
    colors = [FREE_BLOCK_COLOR, CACHED_BLOCK_COLOR, *palette]
    text = np.empty(len(owner), dtype=object)
    for b in range(len(owner)):
        who = f"request {owner[b]:,}" if owner[b] >= 0 else ("free (cached)" if cached[b] else "free")
        text[b] = f"{names(b, b + 1)}<br>{who}<br>{fill[b]}/{block_size} tokens<br>ref count {ref[b]}"
    return code, text, step_colorscale(colors), len(colors)


def _aggregated(owner, ref, fill, cached, names, block_size, shape: GridShape):
    """z = share of the cell's blocks that are held (0..1); hover: the blocks and their counts."""
    k = shape.blocks_per_cell
    starts = np.arange(0, len(owner), k)
    used = np.add.reduceat((owner >= 0).astype(np.int64), starts)
    partial = np.add.reduceat(((owner >= 0) & (fill < block_size)).astype(np.int64), starts)
    shared = np.add.reduceat((ref > 1).astype(np.int64), starts)
    held_cached = np.add.reduceat(((owner < 0) & cached).astype(np.int64), starts)
    sizes = np.diff(np.append(starts, len(owner)))
    text = np.array(
        [
            f"{names(s, s + n)} ({n:,} blocks)<br>{u:,} used ({100 * u / n:.0f}%), {n - u:,} free"
            + (f" ({c:,} still cached)" if c else "")
            + (f"<br>{p:,} partly filled" if p else "")
            + (f"<br>{h:,} shared" if h else "")
            for s, n, u, p, h, c in zip(starts, sizes, used, partial, shared, held_cached, strict=True)
        ],
        dtype=object,
    )
    scale = [[0.0, FREE_BLOCK_COLOR], [1.0, OCCUPANCY_COLOR]]
    return used / sizes, text, scale, 1.0


def grid_traces(
    owner, ref, fill, cached, names, block_size: int, shape: GridShape, legend: bool = True
) -> list:
    """The grid's traces: one Heatmap, then marker scatters for shared blocks (◆, ref count > 1) and, one cell per
    block only, partly filled blocks (○). Arrays are indexed by block position in the grid (owner -1 = free);
    names(start, stop) names the blocks [start, stop) for the hover."""
    owner, ref, fill, cached = (np.asarray(a) for a in (owner, ref, fill, cached))
    per_block = shape.blocks_per_cell == 1
    build = _per_block if per_block else _aggregated
    values, text, scale, zmax = build(owner, ref, fill, cached, names, block_size, shape)
    size = shape.rows * shape.cols
    z = np.full(size, np.nan)
    z[: len(values)] = values
    texts = np.full(size, "", dtype=object)
    texts[: len(text)] = text
    heat = go.Heatmap(
        z=z.reshape(shape.rows, shape.cols),
        text=texts.reshape(shape.rows, shape.cols),
        hoverinfo="text",
        colorscale=scale,
        zmin=0,
        zmax=zmax,
        showscale=not per_block and legend,
        xgap=1,
        ygap=1,
    )
    if not per_block:
        heat.colorbar = {"title": {"text": "blocks used<br>in the cell", "side": "top"}, "tickformat": ".0%"}
        heat.colorbar.thickness = 12
    traces = [heat]
    k = shape.blocks_per_cell
    shared = np.unique(np.flatnonzero(ref > 1) // k)
    if shared.size:
        traces.append(
            go.Scatter(
                x=shared % shape.cols,
                y=shared // shape.cols,
                mode="markers",
                marker={
                    "symbol": "diamond",
                    "size": 6,
                    "color": "white",
                    "line": {"color": "black", "width": 1},
                },
                name="shared block (ref count > 1)" if per_block else "cell with a shared block",
                hoverinfo="skip",
                showlegend=legend,
            )
        )
    partial = np.flatnonzero((owner >= 0) & (fill < block_size))
    if per_block and partial.size:
        traces.append(
            go.Scatter(
                x=partial % shape.cols,
                y=partial // shape.cols,
                mode="markers",
                marker={"symbol": "circle-open", "size": 5, "color": "black"},
                name="partly filled block (internal fragmentation)",
                hoverinfo="skip",
                showlegend=legend,
            )
        )
    return traces


def block_axes(shape: GridShape, first_block: str = "first block of the row") -> tuple[dict, dict]:
    """(x axis, y axis) settings naming blocks: x = offset within the row in blocks, y = each row's first block
    (at most ~6 ticks each, so the labels never run together)."""
    k, cols, rows = shape.blocks_per_cell, shape.cols, shape.rows
    x_ticks = list(range(0, cols, max(1, math.ceil(cols / 6))))
    y_ticks = list(range(0, rows, max(1, math.ceil(rows / 6))))
    xaxis = {
        "title": f"offset in the row (blocks; {cols * k:,} a row)",
        "tickmode": "array",
        "tickvals": x_ticks,
        "ticktext": [f"{c * k:,}" for c in x_ticks],
        "range": [-0.5, cols - 0.5],
        "showgrid": False,
        "zeroline": False,
    }
    yaxis = {
        "title": first_block,
        "tickmode": "array",
        "tickvals": y_ticks,
        "ticktext": [f"{r * cols * k:,}" for r in y_ticks],
        "autorange": "reversed",
        "showgrid": False,
        "zeroline": False,
    }
    return xaxis, yaxis
