"""Figures of the Kernels page: latency, overhead ratio and bandwidth of paged vs contiguous attention, and how
one sequence's logical blocks map to physical blocks.

Each builder takes plain data (the result rows of `core.kernels.timing.measure`, a block table) and returns a
plotly Figure; nothing here needs streamlit.
"""

import plotly.graph_objects as go

from ui.theme import BACKEND_COLORS, CACHED_BLOCK_COLOR, FREE_BLOCK_COLOR, sequence_color

PAPER_OVERHEAD = (1.20, 1.26)  # PagedAttention paper, section 7.1: 20-26% slower than FasterTransformer
PAPER_LABEL = "paper: 1.20-1.26x vs FasterTransformer"
# Block map: one grid unit is ~14.5 px when the page draws it at half width (33 units across ~480 px); a cell is
# drawn smaller than that so neighbours never touch, and a strip's label starts above its top row's cells.
CELL_PX = 13
LABEL_LIFT = (
    0.55  # grid units between a strip's top row centre and its label's baseline (a cell's half is 0.45)
)
CONTIGUOUS = "contiguous"


def _by_backend(rows: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["context_len"]):
        grouped.setdefault(row["backend"], []).append(row)
    return grouped


def _contiguous_points(rows: list[dict], field: str) -> tuple[list[int], list[float]]:
    """One contiguous point per context length (every backend row of a context carries the same baseline)."""
    points = {row["context_len"]: row[field] for row in rows}
    contexts = sorted(points)
    return contexts, [points[c] for c in contexts]


def _color(backend: str) -> str:
    return BACKEND_COLORS.get(backend, "#8c564b")


def timing_note(rows: list[dict]) -> list[str]:
    """Short lines for a timing chart's subtitle: how to read the bars, and whether the machine was busy while
    measuring (another process took CPU: `busy`; or the runs disagreed: `noisy`, see
    `core.kernels.timer.NOISY_SPREAD`)."""
    repeats = max((row.get("repeats", 0) for row in rows), default=0)
    lines = [f"median of {repeats} runs; bars: middle half (25th-75th percentile)" if repeats else "median"]
    busy = [row for row in rows if row.get("busy")]
    noisy = [row.get("spread_pct", 0.0) for row in rows if row.get("noisy")]
    if busy:
        other = max((row.get("other_cores") or 0.0 for row in busy), default=0.0)
        cpus = max((row.get("cpus") or 0 for row in busy), default=0)
        of = f" of {cpus}" if cpus else ""
        lines.append(f"<b>machine busy</b>: other processes used up to {other:.1f}{of} cores")
    if noisy:
        lines.append(f"<b>noisy</b>: middle half spans up to {max(noisy):.0f}% of the median")
    return lines


def _axes(fig: go.Figure, title: str, y_title: str, rows: list[dict]) -> go.Figure:
    contexts = _contexts(rows)
    note = timing_note(rows)
    fig.update_layout(
        title={"text": f"{title}<br><sup>{'<br>'.join(note)}</sup>"},
        xaxis_title="context length (tokens)",
        yaxis_title=y_title,
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0},
        margin={"l": 60, "r": 20, "t": 50 + 16 * len(note), "b": 40},
        height=410 + 16 * len(note),
    )
    fig.update_xaxes(type="log", tickvals=contexts, ticktext=[f"{c:,}" for c in contexts])
    fig.update_yaxes(tickformat=",")
    return fig


def _contexts(rows: list[dict]) -> list[int]:
    return sorted({row["context_len"] for row in rows})


def _line_trace(
    x, y, name: str, color: str, hover: str, dash: str | None = None, lo=None, hi=None
) -> go.Scatter:
    """One line of a sweep chart; `hover` formats y (e.g. "%{y:,.3f} ms"); `lo` and `hi` (the quartiles of each
    point) draw error bars and join the hover."""
    spread = lo is not None and hi is not None
    error = None
    if spread:
        error = {
            "type": "data",
            "symmetric": False,
            "array": [h - v for h, v in zip(hi, y, strict=True)],
            "arrayminus": [v - low for v, low in zip(y, lo, strict=True)],
            "color": color,
            "thickness": 1.5,
            "width": 5,
        }
    low, high = (hover.replace("%{y", f"%{{customdata[{i}]") for i in (0, 1))
    middle = f" (middle half {low} to {high})" if spread else ""
    return go.Scatter(
        x=x,
        y=y,
        name=name,
        mode="lines+markers",
        line={"color": color, "dash": dash},
        error_y=error,
        customdata=list(zip(lo, hi, strict=True)) if spread else None,
        hovertemplate=f"%{{x:,}} tokens: median {hover}{middle}<extra>{name}</extra>",
    )


def _field(points: list[dict], field: str, suffix: str = "") -> list | None:
    """The values of `field` + suffix, or None when the rows do not carry it (rows from before quartiles)."""
    key = field + suffix
    return [p[key] for p in points] if all(key in p for p in points) else None


def _add_sweep_lines(
    fig: go.Figure, rows: list[dict], field: str, hover: str, contiguous: tuple[str, str] | None
) -> None:
    """The contiguous baseline dashed, when `contiguous` = (its column, its name), then each backend's `field`,
    each point with error bars from its `_p25` / `_p75` columns."""
    if contiguous is not None:
        column, name = contiguous
        by_context = {row["context_len"]: row for row in rows}
        points = [by_context[c] for c in sorted(by_context)]
        x = [p["context_len"] for p in points]
        lo, hi = _field(points, column, "_p25"), _field(points, column, "_p75")
        y = [p[column] for p in points]
        fig.add_trace(_line_trace(x, y, name, _color(CONTIGUOUS), hover, dash="dash", lo=lo, hi=hi))
    for backend, points in _by_backend(rows).items():
        x = [p["context_len"] for p in points]
        y = [p[field] for p in points]
        lo, hi = _field(points, field, "_p25"), _field(points, field, "_p75")
        fig.add_trace(_line_trace(x, y, f"paged ({backend})", _color(backend), hover, lo=lo, hi=hi))


def latency_figure(rows: list[dict]) -> go.Figure:
    """Median decode latency (ms) vs context length with quartile bars: paged per backend, and the contiguous
    baseline."""
    fig = go.Figure()
    _add_sweep_lines(
        fig,
        rows,
        "paged_ms",
        "%{y:,.3f} ms",
        contiguous=("contiguous_ms", "contiguous (best of SDPA, matmul)"),
    )
    return _axes(fig, "Decode latency", "latency (ms)", rows)


def overhead_figure(rows: list[dict]) -> go.Figure:
    """Median per-round paged/contiguous ratio vs context length per backend with quartile bars, with 1.0 and the
    paper's 1.20-1.26 band (a legend entry, so its label never covers a line)."""
    fig = go.Figure()
    fig.add_hrect(
        y0=PAPER_OVERHEAD[0],
        y1=PAPER_OVERHEAD[1],
        fillcolor="#2ca02c",
        opacity=0.2,
        line_width=0,
        layer="below",
        name=PAPER_LABEL,
        showlegend=True,
    )
    fig.add_hline(
        y=1.0,
        line={"color": _color(CONTIGUOUS), "dash": "dash"},
        name="contiguous = 1.00x",
        showlegend=True,
    )
    _add_sweep_lines(fig, rows, "ratio", "%{y:.2f}x", contiguous=None)
    fig = _axes(fig, "Paging overhead: paged / contiguous latency", "paged / contiguous latency (x)", rows)
    fig.update_yaxes(rangemode="tozero", tickformat=".2f")
    return fig


def bandwidth_figure(rows: list[dict], copy_gbps: float, copy: dict | None = None) -> go.Figure:
    """Achieved bandwidth (bytes of K and V read / latency, GB/s) vs context with quartile bars, with the measured
    copy bandwidth as a legend entry (and its quartiles as a faint band when `copy` has them)."""
    fig = go.Figure()
    if copy is not None and {"p25", "p75"} <= set(copy):
        fig.add_hrect(y0=copy["p25"], y1=copy["p75"], fillcolor="#000000", opacity=0.08, line_width=0)
    fig.add_hline(
        y=copy_gbps,
        line={"color": "#000000", "dash": "dot"},
        name=f"copy_ bandwidth {copy_gbps:,.1f} GB/s (read + write)",
        showlegend=True,
    )
    _add_sweep_lines(fig, rows, "achieved_gbps", "%{y:,.1f} GB/s", contiguous=("contiguous_gbps", CONTIGUOUS))
    fig = _axes(fig, "Achieved bandwidth (K and V bytes read / time)", "bandwidth (GB/s, 1e9 bytes/s)", rows)
    # plotly's autorange leaves shapes out: the copy line (often above every kernel) would sit on the top edge,
    # under the title's notes; the range takes it, its band and every upper bar, with room above
    fields = ("achieved_gbps", "achieved_gbps_p75", "contiguous_gbps", "contiguous_gbps_p75")
    tops = [row[f] for row in rows for f in fields if row.get(f) is not None]
    tops += [copy_gbps, (copy or {}).get("p75", 0.0)]
    fig.update_yaxes(range=[0, 1.1 * max(tops)])
    return fig


def _square_trace(
    xy, name: str, color, hover: list[str], labels: list[str] | None = None, **marker
) -> go.Scatter:
    """Square markers at the (x, y) points `xy`, optionally labelled, with one hover line per point."""
    return go.Scatter(
        x=[p[0] for p in xy],
        y=[p[1] for p in xy],
        mode="markers+text" if labels is not None else "markers",
        marker={"symbol": "square", "size": CELL_PX, "color": color, **marker},
        text=labels,
        textfont={"color": "white", "size": 8},
        name=name,
        hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>",
    )


def _pool_traces(num_blocks: int, table: list[int], owned: set[int], physical_xy) -> list[go.Scatter]:
    """The physical pool's cells not held by this sequence: free ones and those of other sequences."""
    mine = set(table)
    groups = {"free block": ([], FREE_BLOCK_COLOR), "other sequences": ([], CACHED_BLOCK_COLOR)}
    for block in range(num_blocks):
        if block not in mine:
            groups["other sequences" if block in owned else "free block"][0].append(block)
    return [
        _square_trace(
            [physical_xy(b) for b in blocks],
            name,
            fill,
            [f"physical block {b:,}" for b in blocks],
            line={"color": "#bbbbbb", "width": 1},
        )
        for name, (blocks, fill) in groups.items()
        if blocks
    ]


def _link_trace(logical: list, phys: list, used: int, max_links: int, color: str) -> go.Scatter:
    """Lines joining the first `max_links` logical blocks to their physical blocks: the block table itself."""
    links_x: list[float | None] = []
    links_y: list[float | None] = []
    for j in range(min(used, max_links)):
        (x0, y0), (x1, y1) = logical[j], phys[j]
        links_x += [x0, x1, None]
        links_y += [y0, y1, None]
    return go.Scatter(
        x=links_x,
        y=links_y,
        mode="lines",
        line={"color": color, "width": 1},
        opacity=0.5,
        name=f"block table (first {min(used, max_links)} of {used:,} entries)",
        hoverinfo="skip",
    )


def _block_map_layout(
    fig: go.Figure, context_len: int, block_size: int, num_blocks: int, used: int, columns: int
) -> go.Figure:
    pool_rows = -(-num_blocks // columns)
    top = 2.5 + (used - 1) // columns
    fig.add_annotation(
        x=-0.5,
        y=top + LABEL_LIFT,
        text="logical blocks (block table order)",
        showarrow=False,
        xanchor="left",
        yanchor="bottom",
    )
    fig.add_annotation(
        x=-0.5,
        y=LABEL_LIFT,
        text="physical block pool (ids row by row)",
        showarrow=False,
        xanchor="left",
        yanchor="bottom",
    )
    fig.update_layout(
        title=(
            f"Sequence 0: {context_len:,} tokens in {used:,} logical blocks<br>"
            f"<sup>blocks of {block_size} tokens, scattered over a pool of {num_blocks:,} physical blocks</sup>"
        ),
        height=max(300, 22 * (pool_rows + (used - 1) // columns + 5) + 130),
        margin={"l": 20, "r": 20, "t": 70, "b": 20},
        legend={"orientation": "h", "y": -0.05},
        plot_bgcolor="white",
    )
    fig.update_xaxes(visible=False, range=[-1, columns])
    fig.update_yaxes(visible=False, scaleanchor="x", scaleratio=1)
    return fig


def block_map_figure(
    block_table: list[int],
    context_len: int,
    block_size: int,
    num_blocks: int,
    owned: set[int] | None = None,
    columns: int = 32,
    max_links: int = 24,
) -> go.Figure:
    """One sequence's logical blocks (top strip) and where they live in the physical pool (grid below).

    block_table: the sequence's physical block ids, logical order (entries past its last block are ignored).
    context_len: tokens of the sequence; the last logical block is filled context_len - (n - 1) * block_size.
    num_blocks: blocks in the pool (grid cells, numbered row-major). owned: blocks held by other sequences
    (grey); the rest are free. The first `max_links` logical blocks are joined to their physical block by a line.
    """
    used = -(-context_len // block_size)
    table = [int(b) for b in block_table[:used]]
    columns = max(1, min(columns, max(num_blocks, used)))
    color = sequence_color(0)
    owned = set(owned or ()) - set(table)

    def physical_xy(block: int) -> tuple[float, float]:
        return block % columns, -(block // columns)

    logical = [(j % columns, 2.5 + (used - 1) // columns - j // columns) for j in range(used)]
    phys = [physical_xy(b) for b in table]
    fills = [block_size] * (used - 1) + [context_len - (used - 1) * block_size]
    hover = [
        f"logical block {j:,} (tokens {j * block_size:,}-{j * block_size + fills[j] - 1:,}, {fills[j]}/{block_size} "
        f"filled) -> physical block {b:,}"
        for j, b in enumerate(table)
    ]
    labels = [str(j) for j in range(used)]
    fig = go.Figure(_pool_traces(num_blocks, table, owned, physical_xy))
    fig.add_trace(_square_trace(phys, "this sequence (label: logical index)", color, hover, labels))
    opacity = [0.35 + 0.65 * f / block_size for f in fills]
    fig.add_trace(
        _square_trace(logical, "logical blocks (shade: fill)", color, hover, labels, opacity=opacity)
    )
    fig.add_trace(_link_trace(logical, phys, used, max_links, color))
    return _block_map_layout(fig, context_len, block_size, num_blocks, used, columns)
