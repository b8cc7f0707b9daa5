"""One colour per concept across every chart, and number formatting for labels.

A policy, a backend, a memory category or a sequence keeps the same colour on every page.
"""

import math

import plotly.express as px

POLICY_COLORS = {
    "paged": "#2ca02c",
    "orca-max": "#d62728",
    "orca-pow2": "#ff7f0e",
    "orca-oracle": "#9467bd",
    "contiguous": "#7f7f7f",
}

BACKEND_COLORS = {
    "contiguous": "#7f7f7f",
    "torch": "#1f77b4",
    "triton": "#e377c2",
    "gather": "#bcbd22",
    "cpu": "#2ca02c",
    "compiled": "#17becf",
}

MEMORY_COLORS = {
    "token states": "#2ca02c",
    "reservation": "#ffbb78",
    "internal fragmentation": "#ff7f0e",
    "external fragmentation": "#d62728",
    "external fragmentation & others": "#e7969c",  # the paper's Figure 2 category: allocator slack + free
    "free": "#d9d9d9",
    "weights": "#1f77b4",
    "activations": "#aec7e8",
    "kv cache": "#2ca02c",
}

FREE_BLOCK_COLOR = "#f0f0f0"
CACHED_BLOCK_COLOR = "#c7c7c7"
_SEQUENCE_PALETTE = px.colors.qualitative.Dark24


def sequence_color(index: int) -> str:
    """Colour of the sequence or request with this stable index (admission order), cycling a 24-colour palette."""
    return _SEQUENCE_PALETTE[index % len(_SEQUENCE_PALETTE)]


def policy_color(name: str) -> str:
    return POLICY_COLORS.get(name, "#8c564b")


def fmt_int(value: float) -> str:
    """Thousands separators: 15728 -> '15,728'."""
    return f"{round(value):,}"


def integer_dtick(largest: float, target_ticks: int = 6) -> int:
    """A whole-number tick step (1, 2, 5 x 10^k) giving about `target_ticks` ticks up to `largest`: counts of
    requests never get 0.5 ticks."""
    raw = max(1.0, float(largest) / target_ticks)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


_CONFIG_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")


def config_color(index: int) -> str:
    """Colour of the configuration at this rank on a chart of configurations (the SLO planner's), cycling."""
    return _CONFIG_PALETTE[index % len(_CONFIG_PALETTE)]
