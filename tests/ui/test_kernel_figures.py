"""Figure builders of the Kernels page, checked on hand-made result rows and a real block table."""

import pytest

from ui.kernel_figures import (
    PAPER_OVERHEAD,
    bandwidth_figure,
    block_map_figure,
    latency_figure,
    overhead_figure,
)
from ui.theme import BACKEND_COLORS, CACHED_BLOCK_COLOR, FREE_BLOCK_COLOR, sequence_color


def _rows():
    rows = []
    for context, contiguous in ((256, 1.0), (512, 2.0), (1024, 4.0)):
        for backend, factor in (("torch", 1.25), ("gather", 3.0)):
            paged = contiguous * factor
            kv_bytes = 2 * 4 * context * 8 * 128 * 4
            rows.append(
                {
                    "batch": 4,
                    "context_len": context,
                    "dtype": "float32",
                    "backend": backend,
                    "paged_ms": paged,
                    "contiguous_ms": contiguous,
                    "ratio": paged / contiguous,
                    "achieved_gbps": kv_bytes / (paged / 1e3) / 1e9,
                    "contiguous_gbps": kv_bytes / (contiguous / 1e3) / 1e9,
                    "contiguous_method": "sdpa",
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
    baseline = _trace(fig, "contiguous (best of SDPA, matmul)")
    assert list(baseline.y) == [1.0, 2.0, 4.0]
    assert "(ms)" in fig.layout.yaxis.title.text and "(tokens)" in fig.layout.xaxis.title.text


def test_overhead_figure_plots_ratios_and_the_paper_band():
    fig = overhead_figure(_rows())
    assert list(_trace(fig, "paged (gather)").y) == pytest.approx([3.0, 3.0, 3.0])
    band = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(s.y0, s.y1) for s in band] == [PAPER_OVERHEAD]
    assert any(s.type == "line" and s.y0 == 1.0 for s in fig.layout.shapes)
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
    assert any("26.5 GB/s" in a.text for a in fig.layout.annotations)


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
