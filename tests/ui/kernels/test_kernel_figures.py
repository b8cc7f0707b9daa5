"""Figure builders of the Kernels page, checked on hand-made result rows and a real block table: medians with
their quartile bars, the machine's state in the subtitle, labels that never sit on a line."""

import math

import pytest

from tests.ui.label_spacing import assert_labels_apart
from ui.kernels.figures import (
    PAPER_LABEL,
    PAPER_OVERHEAD,
    bandwidth_figure,
    block_map_figure,
    latency_figure,
    overhead_figure,
    timing_note,
)
from ui.theme import BACKEND_COLORS, CACHED_BLOCK_COLOR, FREE_BLOCK_COLOR, sequence_color


def _rows(busy=False, noisy=False):
    """Rows like `timing.measure`'s: quartiles at 0.9x and 1.2x of each median time."""
    rows = []
    for context, contiguous in ((256, 1.0), (512, 2.0), (1024, 4.0)):
        for backend, factor in (("torch", 1.25), ("gather", 3.0)):
            paged = contiguous * factor
            kv_bytes = 2 * 4 * context * 8 * 128 * 4

            def gbps(ms, kv_bytes=kv_bytes):
                return kv_bytes / (ms / 1e3) / 1e9

            rows.append(
                {
                    "batch": 4,
                    "context_len": context,
                    "dtype": "float32",
                    "backend": backend,
                    "paged_ms": paged,
                    "paged_ms_p25": 0.9 * paged,
                    "paged_ms_p75": 1.2 * paged,
                    "contiguous_ms": contiguous,
                    "contiguous_ms_p25": 0.9 * contiguous,
                    "contiguous_ms_p75": 1.2 * contiguous,
                    "ratio": factor,
                    "ratio_p25": factor - 0.1,
                    "ratio_p75": factor + 0.2,
                    "achieved_gbps": gbps(paged),
                    "achieved_gbps_p25": gbps(1.2 * paged),
                    "achieved_gbps_p75": gbps(0.9 * paged),
                    "contiguous_gbps": gbps(contiguous),
                    "contiguous_gbps_p25": gbps(1.2 * contiguous),
                    "contiguous_gbps_p75": gbps(0.9 * contiguous),
                    "contiguous_method": "sdpa",
                    "spread_pct": 40.0 if noisy else 30.0 / 1.0,
                    "noisy": noisy,
                    "repeats": 11,
                    "busy": busy and context == 512,
                    "other_cores": 1.4 if busy and context == 512 else 0.05,
                    "cpus": 2,
                }
            )
    return rows[::-1]  # unsorted on purpose


def _trace(fig, name):
    matches = [t for t in fig.data if t.name == name]
    assert len(matches) == 1, [t.name for t in fig.data]
    return matches[0]


def test_latency_figure_has_one_line_per_backend_plus_the_baseline():
    fig = latency_figure(_rows())
    torch_line = _trace(fig, "paged (torch)")
    assert list(torch_line.x) == [256, 512, 1024]  # sorted by context
    assert list(torch_line.y) == pytest.approx([1.25, 2.5, 5.0])
    assert torch_line.line.color == BACKEND_COLORS["torch"]
    # error bars reach from the 25th to the 75th percentile of each point
    assert list(torch_line.error_y.arrayminus) == pytest.approx([0.125, 0.25, 0.5])
    assert list(torch_line.error_y.array) == pytest.approx([0.25, 0.5, 1.0])
    assert not torch_line.error_y.symmetric
    baseline = _trace(fig, "contiguous (best of SDPA, matmul)")
    assert list(baseline.y) == [1.0, 2.0, 4.0]
    assert list(baseline.error_y.array) == pytest.approx([0.2, 0.4, 0.8])
    assert "(ms)" in fig.layout.yaxis.title.text and "(tokens)" in fig.layout.xaxis.title.text
    assert "median of 11 runs" in fig.layout.title.text and "busy" not in fig.layout.title.text
    assert "middle half" in torch_line.hovertemplate


def test_overhead_figure_plots_ratios_and_the_paper_band():
    fig = overhead_figure(_rows())
    gather = _trace(fig, "paged (gather)")
    assert list(gather.y) == pytest.approx([3.0, 3.0, 3.0])
    assert list(gather.error_y.arrayminus) == pytest.approx([0.1] * 3)
    band = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(s.y0, s.y1) for s in band] == [PAPER_OVERHEAD]
    # the band is named in the legend, not by a label drawn inside the plot over the lines
    assert band[0].showlegend and band[0].name == PAPER_LABEL
    assert not fig.layout.annotations
    assert any(s.type == "line" and s.y0 == 1.0 and s.showlegend for s in fig.layout.shapes)
    assert "(x)" in fig.layout.yaxis.title.text


def test_bandwidth_figure_draws_the_measured_copy_line():
    rows = _rows()
    fig = bandwidth_figure(rows, copy_gbps=26.5)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert [s.y0 for s in lines] == [26.5]
    torch_line = _trace(fig, "paged (torch)")
    expected = sorted((r["context_len"], r["achieved_gbps"]) for r in rows if r["backend"] == "torch")
    assert list(torch_line.y) == pytest.approx([g for _, g in expected])
    assert "GB/s" in fig.layout.yaxis.title.text
    assert lines[0].showlegend and "26.5 GB/s" in lines[0].name and not fig.layout.annotations
    # a rate's lower bar comes from the slower quartile of the times
    low = sorted((r["context_len"], r["achieved_gbps_p25"]) for r in rows if r["backend"] == "torch")
    minus = [g - lo for (_, g), (_, lo) in zip(expected, low, strict=True)]
    assert list(torch_line.error_y.arrayminus) == pytest.approx(minus)
    with_band = bandwidth_figure(rows, 26.5, {"median": 26.5, "p25": 25.0, "p75": 27.0})
    assert [(s.y0, s.y1) for s in with_band.layout.shapes if s.type == "rect"] == [(25.0, 27.0)]
    # the copy line is a shape, which plotly's autorange leaves out: the axis reaches above it
    high = max(r[f] for r in rows for f in ("achieved_gbps_p75", "contiguous_gbps_p75"))
    assert high < 26.5 and tuple(fig.layout.yaxis.range) == pytest.approx((0, 1.1 * 26.5))
    assert tuple(bandwidth_figure(rows, high / 2).layout.yaxis.range) == pytest.approx((0, 1.1 * high))
    assert tuple(with_band.layout.yaxis.range) == pytest.approx((0, 1.1 * 27.0))


def test_a_busy_or_noisy_machine_is_said_on_every_timing_chart():
    assert timing_note(_rows()) == ["median of 11 runs; bars: middle half (25th-75th percentile)"]
    busy = _rows(busy=True)
    for fig in (latency_figure(busy), overhead_figure(busy), bandwidth_figure(busy, 20.0)):
        assert "machine busy</b>: other processes used up to 1.4 of 2 cores" in fig.layout.title.text
    noisy = timing_note(_rows(noisy=True))
    assert noisy[1] == "<b>noisy</b>: middle half spans up to 40% of the median"
    # each line fits a half-width chart's title (about 70 characters of subtitle text)
    for line in timing_note(_rows(busy=True, noisy=True)):
        assert len(line.replace("<b>", "").replace("</b>", "")) <= 70, line


@pytest.mark.parametrize("contexts", [[128, 256, 512, 1024], [131_072, 262_144, 524_288, 1_048_576]])
def test_context_tick_labels_do_not_run_together(contexts):
    rows = [dict(r, context_len=c) for r, c in zip(_rows()[:4], contexts, strict=True)]
    for fig in (latency_figure(rows), overhead_figure(rows), bandwidth_figure(rows, 20.0)):
        axis = fig.layout.xaxis
        assert axis.type == "log" and list(axis.tickvals) == contexts
        # half of a 1,150 px main area, less the margins, less plotly's padding at each end
        plot_px = 0.9 * (1150 / 2 - fig.layout.margin.l - fig.layout.margin.r)
        span = math.log10(contexts[-1]) - math.log10(contexts[0])
        positions = [plot_px * (math.log10(c) - math.log10(contexts[0])) / span for c in contexts]
        assert_labels_apart(positions, list(axis.ticktext))


def test_block_map_places_each_logical_block_on_its_physical_block():
    table = [7, 2, 11, 0, -1, -1]  # 4 blocks used; the rest is padding
    fig = block_map_figure(table, context_len=53, block_size=16, num_blocks=12, owned={1, 3, 4}, columns=4)
    mine = _trace(fig, "this sequence (label: logical index)")
    # physical block b is drawn at (b % 4, -(b // 4)); labels are the logical indices
    assert list(zip(mine.x, mine.y, mine.text, strict=True)) == [
        (3, -1, "0"),
        (2, 0, "1"),
        (3, -2, "2"),
        (0, 0, "3"),
    ]
    assert mine.marker.color == sequence_color(0)
    assert "5/16 filled" in mine.hovertext[3]  # 53 = 3 x 16 + 5
    others = _trace(fig, "other sequences")
    assert sorted(zip(others.x, others.y, strict=True)) == sorted([(1, 0), (3, 0), (0, -1)])
    assert others.marker.color == CACHED_BLOCK_COLOR
    free = _trace(fig, "free block")
    assert len(free.x) == 12 - 4 - 3 and free.marker.color == FREE_BLOCK_COLOR
    links = _trace(fig, "block table (first 4 of 4 entries)")
    assert [v for v in links.y if v is not None][1::2] == [
        -1,
        0,
        -2,
        0,
    ]  # each link ends on the physical block
    assert "53 tokens in 4 logical blocks" in fig.layout.title.text
    assert "pool of 12 physical blocks" in fig.layout.title.text


def test_block_map_limits_links_on_long_sequences():
    table = list(range(100))[::-1]
    fig = block_map_figure(table, context_len=1600, block_size=16, num_blocks=100, max_links=10)
    assert _trace(fig, "block table (first 10 of 100 entries)")
    assert len(_trace(fig, "this sequence (label: logical index)").x) == 100


def test_block_map_labels_sit_above_their_strips_and_cells_do_not_touch():
    table = list(range(64))[::-1]
    fig = block_map_figure(table, context_len=1024, block_size=16, num_blocks=256)
    mine = _trace(fig, "this sequence (label: logical index)")
    logical = _trace(fig, "logical blocks (shade: fill)")
    # at half page width the grid spans ~480 px for 33 units (columns -1..32): ~14.5 px a unit
    unit_px = 480 / 33
    assert mine.marker.size < unit_px and logical.marker.size < unit_px
    half = mine.marker.size / 2 / unit_px  # a cell's half height, in grid units
    strips = {
        "logical blocks (block table order)": max(logical.y),
        "physical block pool (ids row by row)": max(mine.y + _trace(fig, "free block").y),
    }
    for annotation in fig.layout.annotations:
        assert annotation.yanchor == "bottom"
        assert annotation.y >= strips[annotation.text] + half  # the text starts above its top row's cells
    # and the pool's label (about 12 px, under one unit tall) ends below the logical strip's lowest cells
    assert strips["physical block pool (ids row by row)"] + 0.55 + 1 <= min(logical.y) - half
