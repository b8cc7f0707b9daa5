"""Checks that axis labels do not run into each other, from their positions in pixels and their text."""

import itertools

FONT_PX = 12  # plotly's default tick font size
CHAR_EM = 0.62  # a digit's advance in the default sans-serif fonts, in font sizes (commas are narrower)
GAP_PX = 4


def label_width_px(text: str, font_px: float = FONT_PX) -> float:
    """A generous estimate of the width of `text` drawn in plotly's default font at `font_px`."""
    return len(text) * CHAR_EM * font_px


def assert_labels_apart(positions_px: list[float], labels: list[str], font_px: float = FONT_PX) -> None:
    """Adjacent labels centred at `positions_px` (pixels along the axis) leave at least GAP_PX between them."""
    assert len(positions_px) == len(labels)
    pairs = sorted(zip(positions_px, labels, strict=True))
    for (x0, a), (x1, b) in itertools.pairwise(pairs):
        room = x1 - x0 - (label_width_px(a, font_px) + label_width_px(b, font_px)) / 2
        assert room >= GAP_PX, f"labels {a!r} at {x0:.0f} px and {b!r} at {x1:.0f} px overlap"
