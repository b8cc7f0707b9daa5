"""The SLO planner page's inputs as URL fields (types, bounds, steps, defaults), so a search or a prediction is
shared as a link.

Keys are the page's widget keys. `mode` picks the question: "search" (the cheapest configuration, defaults
`SloPlannerParams()`'s: Llama-3.1-8B, 12 req/s of 2,000 in / 300 out tokens, TTFT p95 <= 1 s, TPOT p95 <= 50 ms
over H100 / H200 / L40S) or "predict" (one deployment at one load, defaults `SloPredictParams()`'s). The workload
and the TTFT / TPOT targets are shared by both modes; the URL holds the mode and that mode's fields
(`MODE_KEYS`). The model, the deployment, the load, speculation, the disaggregated pools and the host tier are
their input groups' fields (`core.fields`; `ui.input_fields.url_field`: key, kind, label, step from the
declaration, the seed this page's scenario): their numbers have no bounds here, nor do the latency targets, so
a bad value reaches core's one check, whose typed error (naming the flag) the page shows. TPOT and ITL targets are
entered in milliseconds, TTFT and end-to-end in seconds; each target's percentile is its own field
(`{metric}_q`, predict mode). No streamlit here.
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
from core.planning.search.slo_candidates import SEARCH_FIELDS
from core.serving.latency import PERCENTILES
from ui.input_fields import url_field, values_by_name
from ui.query_state import Field, encode_params

RATE, CONCURRENCY = RATE_FIELDS
ENGINE = field_named(SETTING_FIELDS, "engine")
# the predict mode's deployment inputs on the page (the model and engine are both modes' fields)
PREDICT_DEPLOYMENT = (GPU_FIELD, *PARALLEL_FIELDS, SETTING_FIELDS[0], *SETTING_FIELDS[2:4])
# every input of the predict mode that is a field of an input group (`SloPredictParams` has each by its name)
PREDICT_INPUTS = (
    MODEL_FIELD,
    *PREDICT_DEPLOYMENT,
    ENGINE,
    *RATE_FIELDS,
    *SHAPE_FIELDS,
    *LOAD_LEVERS,
    *SPECULATION_FIELDS,
    *DISAGG_FIELDS,
    *OFFLOAD_FIELDS[:2],
)
SEED = field_named(SHAPE_FIELDS, "seed")

D = DEFAULT_PARAMS
P = DEFAULT_PREDICT_PARAMS
MODES = ("search", "predict")
MODE_LABELS = {"search": "Cheapest configuration for an SLO", "predict": "Predict my deployment"}
PERCENTILE_CHOICES = tuple(PERCENTILES)
# each target: (metric, value field, percentile field, unit: factor from seconds to the field's unit)
TARGETS = (
    ("ttft", "ttft", "ttft_q", "s", 1.0),
    ("tpot", "tpot_ms", "tpot_q", "ms", 1e3),
    ("itl", "itl_ms", "itl_q", "ms", 1e3),
    ("e2e", "e2e", "e2e_q", "s", 1.0),
)
_P_TARGETS = dict(P.targets)


def _default_target(metric: str) -> tuple[float | None, int]:
    """(value in seconds or None, percentile) of `metric`'s target in `SloPredictParams()` (the search's
    defaults are the same: TTFT p95 1 s, TPOT p95 50 ms)."""
    for q in PERCENTILE_CHOICES:
        if f"{metric}_p{q}_s" in _P_TARGETS:
            return _P_TARGETS[f"{metric}_p{q}_s"], q
    return None, 99


_TARGETS0 = {
    m: None if _default_target(m)[0] is None else _default_target(m)[0] * f for m, _, _, _, f in TARGETS
}


def _target_fields() -> list[Field]:
    fields = []
    for metric, value_key, _, unit, factor in TARGETS[2:]:  # ttft / tpot values are the search's fields
        value, _ = _default_target(metric)
        fields.append(
            Field(
                value_key,
                None if value is None else value * factor,
                "float",
                maximum=3600.0 * factor,
                step=1.0 if unit == "ms" else 0.1,
                optional=True,
                label=f"{metric.upper()} target, {unit}",
            )
        )
    for metric, _, q_key, _, _ in TARGETS:
        fields.append(
            Field(
                q_key,
                _default_target(metric)[1],
                "choice",
                PERCENTILE_CHOICES,
                label=f"{metric.upper()} target percentile",
            )
        )
    return fields


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
    Field(
        "ttft",
        _TARGETS0.get("ttft"),
        "float",
        maximum=3600.0,
        step=0.1,
        optional=True,
        label="TTFT target, s",
    ),
    Field(
        "tpot_ms",
        _TARGETS0.get("tpot"),
        "float",
        maximum=3.6e6,
        step=5.0,
        optional=True,
        label="TPOT target, ms",
    ),
    *(url_field(f, getattr(D, f.name)) for f in SEARCH_FIELDS),
    Field("rates", False, "bool", label="find the highest rates"),
    Field("disagg_too", D.disagg, "bool", label="disaggregated deployments too"),
    *_target_fields(),
    url_field(ENGINE, D.engine),
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
        **values_by_name(values, (MODEL_FIELD, RATE, *SHAPE_FIELDS, ENGINE)),
        targets=targets_from(values),
        chart_percentiles=(int(values["ttft_q"]), int(values["tpot_q"])),
        **values_by_name(values, SEARCH_FIELDS),
        disagg=bool(values["disagg_too"]),
    )


def _optional(value, factor: float = 1.0) -> float | None:
    return None if value is None else float(value) / factor


def targets_from(values: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """The targets of the shared target fields: ((`{metric}_p{q}_s`, seconds), ...), an empty value no target."""
    targets = []
    for metric, value_key, q_key, _, factor in TARGETS:
        value = _optional(values[value_key], factor)
        if value is not None:
            targets.append((f"{metric}_p{int(values[q_key])}_s", value))
    return tuple(targets)


def predict_params_from(values: dict[str, Any]) -> SloPredictParams:
    """The predict mode's inputs as `SloPredictParams` (targets converted to seconds, each at its percentile),
    every other input by its field's name. Builds nothing that can fail: core's checks run in
    `SloPredictParams.check`."""
    return SloPredictParams(
        load_kind=values["load"], targets=targets_from(values), **values_by_name(values, PREDICT_INPUTS)
    )
