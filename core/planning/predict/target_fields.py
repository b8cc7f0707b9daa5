"""The latency targets, declared once (`core.fields`): `TARGET_FIELDS`, one field per percentile key of a
steady-state estimate (`ttft_p95_s`, flag `--ttft-p95`, seconds, in (0, 3600]), from which `slo`'s and
`max-rate`'s flags are made and by which `Slo`, `max_rate` and both modes of the SLO planner page check a target
(one message, naming the flag); and `TARGET_METRICS`, the SLO planner page's way to enter them: per metric one
value (its URL key, unit and step: TTFT and end-to-end in seconds, TPOT and ITL in milliseconds) and its
percentile (`{metric}_q`), from which the page's URL fields and widgets are made (`ui.input_fields`).
`targets_from` is the one converter: a values dict (the flags', or the page's `page_target_values`) to
{key: seconds}, every value checked by its field."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidArgumentError
from core.fields import InputField
from core.serving.latency import PERCENTILES
from core.serving.steady_state import STEADY_METRICS, metric_keys

MAX_TARGET_S = 3600.0


def _target_field(metric: str, q: int) -> InputField:
    return InputField(
        f"{metric}_p{q}_s",
        f"--{metric}-p{q}",
        None,  # the page enters a metric's value and its percentile apart (`TARGET_METRICS`)
        "float",
        label=f"{metric.upper()} p{q} target",
        help=f"the {metric.upper()} p{q} target, seconds (default: none)",
        unit="seconds",
        minimum=0.0,
        maximum=MAX_TARGET_S,
        exclusive_minimum=True,
        optional=True,
    )


# --ttft-p50 ... --e2e-p99, in `metric_keys()` order
TARGET_FIELDS = tuple(_target_field(metric, q) for metric in STEADY_METRICS for q in PERCENTILES)
_BY_KEY = {field.name: field for field in TARGET_FIELDS}
assert tuple(_BY_KEY) == metric_keys()


@dataclass(frozen=True)
class TargetMetric:
    """One metric's target as the SLO planner page enters it: a value (URL key `url_key`, in `unit`, `factor`
    of them a second, widget step `step`) at a percentile (URL key `{metric}_q`). The URL keys are a contract
    (shared links)."""

    metric: str
    url_key: str
    unit: str
    factor: float
    step: float

    @property
    def label(self) -> str:
        return f"{self.metric.upper()} target, {self.unit}"

    @property
    def q_key(self) -> str:
        return f"{self.metric}_q"

    @property
    def q_label(self) -> str:
        return f"{self.metric.upper()} target percentile"


TARGET_METRICS = (
    TargetMetric("ttft", "ttft", "s", 1.0, 0.1),
    TargetMetric("tpot", "tpot_ms", "ms", 1e3, 5.0),
    TargetMetric("itl", "itl_ms", "ms", 1e3, 1.0),
    TargetMetric("e2e", "e2e", "s", 1.0, 0.1),
)


def target_field(key: str) -> InputField:
    """The field of target `key` ("ttft_p95_s"); InvalidArgumentError naming the keys allowed for another."""
    if key not in _BY_KEY:
        raise InvalidArgumentError(f"unknown target {key!r}; targets are {', '.join(metric_keys())}")
    return _BY_KEY[key]


def check_targets(targets: Mapping[str, Any]) -> dict[str, float]:
    """`targets` ({key: seconds}, None: no target) with every key a percentile key and every value checked by its
    field (positive, finite, at most an hour; the message names the flag), the Nones left out, in the order
    given."""
    checked = {key: target_field(key).check(value) for key, value in targets.items()}
    return {key: value for key, value in checked.items() if value is not None}


def targets_from(values: Mapping[str, Any]) -> dict[str, float]:
    """The targets set in `values` (keyed by field name, the flags' `vars(args)`; a key left out or None: no
    target), checked (`check_targets`), in `metric_keys()` order."""
    return check_targets({field.name: values.get(field.name) for field in TARGET_FIELDS})


def page_target_values(values: Mapping[str, Any]) -> dict[str, float]:
    """The page's targets ({url_key: value in its unit, q_key: percentile}, an empty value no target) as a
    values dict by field name in seconds, unchecked (`targets_from` checks): {"tpot_p99_s": 0.05, ...}."""
    out = {}
    for m in TARGET_METRICS:
        value = values[m.url_key]
        if value is not None:
            out[f"{m.metric}_p{int(values[m.q_key])}_s"] = float(value) / m.factor
    return out


def target_words(targets: Mapping[str, float]) -> list[str]:
    """The command-line words of `targets` ({key: seconds}): what `targets_from` reads back."""
    return [word for key, value in targets.items() for word in target_field(key).words(value)]
