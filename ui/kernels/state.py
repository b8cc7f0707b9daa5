"""The Kernels page's inputs as URL fields: one schema gives the widgets their options and bounds and parses a
shared link like any other user input. No streamlit here.

`?heads=32&kv_heads=8&head_dim=128&block=16&batch=4&ctx=1024&dtype=float32&backends=cpu,torch,gather&window=0`
is the default run. `backends` is a comma-separated list; names this machine cannot run are dropped with a
message (a link made on a GPU host opens on a CPU host with the backends both have).
"""

from collections.abc import Mapping, Sequence
from typing import Any

from core.kernels.timing import DTYPES, KernelConfig
from ui.query_state import Field, encode_params, parse_params

BACKENDS_KEY = "backends"
FIELDS = (
    Field("heads", 32, "choice", (8, 16, 32, 40, 64, 128), label="query heads"),
    Field("kv_heads", 8, "choice", (1, 2, 4, 8, 16, 32, 40, 64, 128), label="KV heads"),
    Field("head_dim", 128, "choice", (64, 80, 96, 112, 128, 256), label="head_dim"),
    Field("block", 16, "choice", (8, 16, 32), label="block size, tokens"),
    Field("batch", 4, "int", minimum=1, maximum=4096, step=1, label="batch, sequences"),
    Field("ctx", 1024, "int", minimum=1, maximum=1_048_576, step=256, label="context length, tokens"),
    Field("dtype", "float32", "choice", tuple(DTYPES), label="dtype"),
    Field("window", 0, "int", minimum=0, maximum=1_048_576, step=128, label="sliding window, tokens"),
    Field(BACKENDS_KEY, "", "str", max_length=200, label="paged backends"),
)


def parse_backends(text: str, available: Sequence[str]) -> tuple[list[str], list[str]]:
    """(backends, messages): the names in comma-separated `text` that `available` lists, in the order given and
    once each; every unknown name gives a message. Empty text, or no usable name, means every available one."""
    names = [name.strip() for name in str(text).split(",") if name.strip()]
    unknown = [name for name in names if name not in available]
    chosen = list(dict.fromkeys(name for name in names if name in available))
    messages = []
    if unknown:
        shown = ", ".join(repr(name[:20]) for name in unknown[:5])
        messages.append(
            f"URL parameter `{BACKENDS_KEY}`: {shown} not available on this machine (allowed: "
            f"{', '.join(available)}); {'using the rest' if chosen else 'using all of them'}."
        )
    return (chosen or list(available)), messages


def parse_kernel_params(
    params: Mapping[str, Any], available: Sequence[str]
) -> tuple[dict[str, Any], list[str]]:
    """(values, messages) for a query string: every field parsed (bad values fall back to their default, with a
    message), `backends` as a list of available names."""
    values, errors = parse_params(params, FIELDS)
    values[BACKENDS_KEY], messages = parse_backends(values[BACKENDS_KEY], available)
    return values, errors + messages


def config_of(values: Mapping[str, Any]) -> KernelConfig:
    """The KernelConfig the values describe (not validated: `KernelConfig.validate` says what is wrong)."""
    return KernelConfig(
        batch=int(values["batch"]),
        context_len=int(values["ctx"]),
        num_heads=int(values["heads"]),
        num_kv_heads=int(values["kv_heads"]),
        head_dim=int(values["head_dim"]),
        block_size=int(values["block"]),
        dtype=values["dtype"],
        sliding_window=int(values["window"]) or None,
    )


def url_params(values: Mapping[str, Any]) -> dict[str, str]:
    """Every parameter of `values` (backends as a list or a comma-separated string), so a link does not depend
    on this server's defaults."""
    backends = values[BACKENDS_KEY]
    joined = backends if isinstance(backends, str) else ",".join(backends)
    return encode_params({**values, BACKENDS_KEY: joined}, FIELDS)
