"""The torch device the lab computes on, and the operator's memory budget for tensors.

torch is imported inside the functions that need it: `core.common` imports this module for format_bytes and
the budget, and the planners' command lines (`python -m core.planning`, `... slo`) never touch a tensor, so
they start without torch's ~2 s import."""

from typing import TYPE_CHECKING

from core.limits import read_limit

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_BYTES = 4 * 1024**3
MAX_BYTES_ENV = "PAGED_LAB_MAX_BYTES"


def default_device() -> "torch.device":
    """CUDA when `torch.cuda.is_available()`, else CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_label(device: "torch.device | None" = None) -> str:
    """A human label such as 'cuda:0 (NVIDIA H200)' or 'cpu (2 threads)'."""
    import torch

    device = device or default_device()
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    threads = torch.get_num_threads()
    return f"cpu ({threads} thread{'s' if threads != 1 else ''})"


def memory_budget_bytes() -> int:
    """Bytes that one tensor allocation of the lab may take (KV caches, benchmark buffers).

    4 GiB unless the operator sets `PAGED_LAB_MAX_BYTES` (an integer number of bytes), e.g. to protect a shared
    demo host; read through `core.limits`, the one place operator limits are parsed. Raises
    `InvalidArgumentError` (`LimitConfigError`) for a value that is not a positive integer.
    """
    return read_limit("max_tensor_bytes")


def format_bytes(num_bytes: float) -> str:
    """Binary units with thousands separators: 838,860,800 -> '800.0 MiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
