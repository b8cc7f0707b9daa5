"""The SLO planner page's inputs as URL fields (types, bounds, steps, defaults), so a search is shared as a link.

Keys are the page's widget keys; defaults are `SloPlannerParams()`'s (Llama-3.1-8B, 12 req/s of 2,000 in / 300
out tokens, TTFT p95 <= 1 s, TPOT p95 <= 50 ms over H100 / H200 / L40S). The latency targets and the rate
have no lower bound here: a zero or negative value reaches core's `Slo` / `SloWorkload`, whose typed error the
page shows (one place states what is allowed). The TPOT target is entered in milliseconds. No streamlit here.
"""

from typing import Any

from core.page_models.slo_planner import DEFAULT_PARAMS, SloPlannerParams
from core.planning.hardware import GPUS
from core.planning.kv_accounting import KV_DTYPES, MAX_GPUS, WEIGHT_DTYPES
from core.planning.models import MODELS
from ui.query_state import Field, encode_params

D = DEFAULT_PARAMS

FIELDS = [
    Field("model", D.model, "choice", tuple(MODELS), label="model"),
    Field("rate", D.rate, "float", maximum=100_000.0, step=1.0, label="request rate, requests/s"),
    Field("prompt_len", D.prompt_len, "int", minimum=1, maximum=1 << 20, step=100, label="prompt tokens"),
    Field("output_len", D.output_len, "int", minimum=1, maximum=1 << 20, step=50, label="output tokens"),
    Field("spread", D.length_spread, "float", minimum=0.0, maximum=0.99, step=0.05, label="length spread"),
    Field("ttft", D.ttft_p95_s, "float", maximum=3600.0, step=0.1, optional=True, label="TTFT p95 target, s"),
    Field(
        "tpot_ms",
        1e3 * D.tpot_p95_s,
        "float",
        maximum=3.6e6,
        step=5.0,
        optional=True,
        label="TPOT p95 target, ms",
    ),
    Field("gpus", D.gpus, "multi", tuple(GPUS), label="GPU types"),
    Field("max_gpus", D.max_gpus, "int", minimum=1, maximum=MAX_GPUS, step=1, label="most GPUs"),
    Field("kv", D.kv_dtypes, "multi", KV_DTYPES, label="KV cache dtypes"),
    Field("weights", D.weight_dtypes, "multi", WEIGHT_DTYPES, label="weight dtypes"),
]


def url_params(values: dict[str, Any]) -> dict[str, str]:
    """Every field's URL parameter (a link does not depend on defaults)."""
    return encode_params(values, FIELDS)


def params_from(values: dict[str, Any]) -> SloPlannerParams:
    """The page's inputs as `SloPlannerParams` (the TPOT target converted from ms to seconds). Builds nothing
    that can fail: core's checks run in `SloPlannerParams.check`."""
    tpot_ms = values["tpot_ms"]
    return SloPlannerParams(
        model=values["model"], rate=float(values["rate"]), prompt_len=int(values["prompt_len"]),
        output_len=int(values["output_len"]), length_spread=float(values["spread"]),
        ttft_p95_s=None if values["ttft"] is None else float(values["ttft"]),
        tpot_p95_s=None if tpot_ms is None else float(tpot_ms) / 1e3,
        gpus=tuple(values["gpus"]), max_gpus=int(values["max_gpus"]), kv_dtypes=tuple(values["kv"]),
        weight_dtypes=tuple(values["weights"]),
    )  # fmt: skip
