"""The SLO planner page's inputs as URL fields (types, bounds, steps, defaults), so a search or a prediction is
shared as a link.

Keys are the page's widget keys. `mode` picks the question: "search" (the cheapest configuration, defaults
`SloPlannerParams()`'s: Llama-3.1-8B, 12 req/s of 2,000 in / 300 out tokens, TTFT p95 <= 1 s, TPOT p95 <= 50 ms
over H100 / H200 / L40S) or "predict" (one deployment at one load, defaults `SloPredictParams()`'s). The workload
and the TTFT / TPOT targets are shared by both modes; the URL holds the mode and that mode's fields
(`MODE_KEYS`). The model, the deployment, the load, speculation, the disaggregated pools and the host tier are
their input groups' fields (`core.fields`; `ui.input_fields.url_field`: key, kind, label, step from the
declaration, the seed this page's scenario): their numbers have no bounds here, nor do the latency targets
(`core.planning.predict.target_fields.TARGET_METRICS`: TPOT and ITL entered in milliseconds, TTFT and end-to-end
in seconds, each target's percentile its own field `{metric}_q`), so a bad value reaches core's one check, whose
typed error (naming the flag, in seconds: `TARGET_FIELDS`) the page shows. No streamlit here.
"""

from typing import Any

from core.fields import field_named
from core.page_models.slo_planner import DEFAULT_PARAMS, SloPlannerParams
from core.page_models.slo_predict import DEFAULT_PREDICT_PARAMS, LOAD_KINDS, SloPredictParams
from core.planning.cost.speculative import SPECULATION_FIELDS
from core.planning.predict.deployment_fields import (
    GPU_FIELD,
    MODEL_FIELD,
    OFFLOAD_FIELDS,
    PARALLEL_FIELDS,
    SETTING_FIELDS,
)
from core.planning.predict.disagg import DISAGG_FIELDS
from core.planning.predict.load import LEVER_FIELDS as LOAD_LEVERS
from core.planning.predict.load import RATE_FIELDS, SHAPE_FIELDS
from core.planning.predict.target_fields import TARGET_METRICS, TargetMetric, page_target_values
from core.planning.search.search_fields import SEARCH_FIELDS, SEARCH_URL_FIELDS
from core.serving.latency import PERCENTILES
from ui.input_fields import target_percentile_field, target_value_field, url_field, values_by_name
from ui.query_state import Field, encode_params

RATE, CONCURRENCY = RATE_FIELDS
ENGINE = field_named(SETTING_FIELDS, "engine")
VLLM_VERSION = field_named(SETTING_FIELDS, "vllm_version")  # URL key vllm; empty: today's vLLM
# the predict mode's deployment inputs on the page (the model and engine are both modes' fields)
PREDICT_DEPLOYMENT = (GPU_FIELD, *PARALLEL_FIELDS, SETTING_FIELDS[0], *SETTING_FIELDS[2:4])
# every input of the predict mode that is a field of an input group (`SloPredictParams` has each by its name)
PREDICT_INPUTS = (
    MODEL_FIELD,
    *PREDICT_DEPLOYMENT,
    ENGINE,
    VLLM_VERSION,
    *RATE_FIELDS,
    *SHAPE_FIELDS,
    *LOAD_LEVERS,
    *SPECULATION_FIELDS,
    *DISAGG_FIELDS,
    *OFFLOAD_FIELDS[:2],
)
SEED = field_named(SHAPE_FIELDS, "seed")
DISAGG_TOO = field_named(SEARCH_FIELDS, "disagg")  # the search mode's `slo --disagg` (URL key disagg_too)

D = DEFAULT_PARAMS
P = DEFAULT_PREDICT_PARAMS
MODES = ("search", "predict")
MODE_LABELS = {"search": "Cheapest configuration for an SLO", "predict": "Predict my deployment"}
_P_TARGETS = dict(P.targets)


def _default_target(metric: TargetMetric) -> tuple[float | None, int]:
    """(value in the metric's unit or None, percentile) of its target in `SloPredictParams()` (the search's
    defaults are the same: TTFT p95 1 s, TPOT p95 50 ms)."""
    for q in PERCENTILES:
        if f"{metric.metric}_p{q}_s" in _P_TARGETS:
            return _P_TARGETS[f"{metric.metric}_p{q}_s"] * metric.factor, q
    return None, 99


# each metric's target value (its unit, empty: no target) and percentile, the seed `SloPredictParams()`'s
TARGET_VALUE_FIELDS = [target_value_field(m, _default_target(m)[0]) for m in TARGET_METRICS]
TARGET_Q_FIELDS = [target_percentile_field(m, _default_target(m)[1]) for m in TARGET_METRICS]


# the levers (predict mode): shared prefixes and chats, speculation (0 tokens: none), disaggregated prefill /
# decode, the host KV tier
LEVER_FIELDS = [
    *(url_field(f, getattr(P, f.name)) for f in LOAD_LEVERS),
    *(url_field(f, getattr(P, f.name)) for f in SPECULATION_FIELDS),
    *(url_field(f, getattr(P, f.name)) for f in (*DISAGG_FIELDS, *OFFLOAD_FIELDS[:2])),
]

PREDICT_FIELDS = [
    *(url_field(f, getattr(P, f.name)) for f in PREDICT_DEPLOYMENT),
    Field("load", P.load_kind, "choice", LOAD_KINDS, label="load given as"),
    url_field(CONCURRENCY, P.concurrency),
    *LEVER_FIELDS,
]

FIELDS = [
    Field("mode", "search", "choice", MODES, label="question"),
    url_field(MODEL_FIELD, D.model),
    url_field(RATE, D.rate),
    *(url_field(f, getattr(D, f.name), bounded=f.name == "length_spread") for f in SHAPE_FIELDS[:3]),
    *TARGET_VALUE_FIELDS[:2],  # ttft, tpot_ms
    *(url_field(f, getattr(D, f.name)) for f in SEARCH_URL_FIELDS if f is not DISAGG_TOO),
    Field("rates", False, "bool", label="find the highest rates"),
    url_field(DISAGG_TOO, D.disagg),  # disagg_too
    *TARGET_VALUE_FIELDS[2:],  # itl_ms, e2e
    *TARGET_Q_FIELDS,
    url_field(ENGINE, D.engine),
    url_field(VLLM_VERSION, D.vllm_version),
    url_field(SEED, D.seed),
    *PREDICT_FIELDS,
]
SHARED_KEYS = (
    "model",
    "rate",
    "prompt_len",
    "output_len",
    "spread",
    "ttft",
    "tpot_ms",
    "itl_ms",
    "e2e",
    "ttft_q",
    "tpot_q",
    "itl_q",
    "e2e_q",
    "engine",
    "vllm",
    "seed",
)
MODE_KEYS = {
    "search": ("mode", *SHARED_KEYS, "gpus", "max_gpus", "kv", "weights", "rates", "disagg_too"),
    "predict": ("mode", *SHARED_KEYS, *(f.key for f in PREDICT_FIELDS)),
}


def url_params(values: dict[str, Any]) -> dict[str, str]:
    """The URL parameters of the mode and every field of that mode (a link does not depend on defaults)."""
    keys = MODE_KEYS[values["mode"]]
    return encode_params(values, [f for f in FIELDS if f.key in keys])


def params_from(values: dict[str, Any]) -> SloPlannerParams:
    """The search's inputs as `SloPlannerParams` (targets in seconds, each at its percentile). Builds nothing
    that can fail: core's checks run in `SloPlannerParams.check`."""
    return SloPlannerParams(
        **values_by_name(values, (MODEL_FIELD, RATE, *SHAPE_FIELDS, ENGINE, VLLM_VERSION)),
        targets=targets_from(values),
        chart_percentiles=(int(values["ttft_q"]), int(values["tpot_q"])),
        **values_by_name(values, SEARCH_URL_FIELDS),
    )


def targets_from(values: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """The targets of the shared target fields: ((`{metric}_p{q}_s`, seconds), ...), an empty value no target
    (`page_target_values`; unchecked: core checks them, by their flags' fields)."""
    return tuple(page_target_values(values).items())


def predict_params_from(values: dict[str, Any]) -> SloPredictParams:
    """The predict mode's inputs as `SloPredictParams` (targets converted to seconds, each at its percentile),
    every other input by its field's name. Builds nothing that can fail: core's checks run in
    `SloPredictParams.check`."""
    return SloPredictParams(
        load_kind=values["load"], targets=targets_from(values), **values_by_name(values, PREDICT_INPUTS)
    )
