"""The pages' side of the input groups (`core.fields.InputField`): each field's URL field (`url_field`: its key,
kind, choices and step from the schema, its default the page's seed) and widget (`input_widget`: its label and
key from the schema), and the values dict the converters of `core.planning.predict.inputs` take
(`values_by_name`). Number fields get no bounds in the URL or the widget unless asked (a slider needs them): a
bad value reaches the domain type's one check, whose message (naming the flag) the page shows with st.error,
as the command line prints it. No streamlit here."""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from core.fields import InputField
from core.planning.predict.target_fields import TargetMetric
from core.serving.latency import PERCENTILES
from ui.query_state import Field

_SEED = object()


def url_field(field: InputField, default: Any = _SEED, *, bounded: bool = False, prefix: str = "") -> Field:
    """The URL field of `field`, seeded with `default` (the schema's default when left out); `bounded`: its
    minimum and maximum too (a slider's range, or a page that refuses an out-of-range URL value as it parses
    it, by the field's `check`: its message, the command line's). Empty ("auto") is allowed when the field is optional and the page seeds it empty. `prefix`: a page's
    group of inputs shown twice (the Capacity Planner's scenarios, "a_" and "b_") keys each copy `prefix` +
    `url_key`."""
    seed = field.default if default is _SEED else default
    return Field(
        prefix + field.url_key,
        seed,
        field.kind,
        field.choices,
        minimum=field.minimum if bounded else None,
        maximum=field.maximum if bounded else None,
        optional=field.optional and seed is None,
        label=field.label,
        step=field.step,
        check=field.check if bounded and field.kind in ("int", "float") else None,
    )


def values_by_name(
    values: Mapping[str, Any], fields: Iterable[InputField], *, prefix: str = ""
) -> dict[str, Any]:
    """A page's values (keyed by URL key, after `prefix`) as the converters take them (keyed by field name)."""
    return {field.name: values[prefix + field.url_key] for field in fields}


def input_widget(
    w: Callable[..., Any], factory: Callable[..., Any], field: InputField, *, prefix: str = "", **kwargs: Any
) -> Any:
    """`w(factory, label, key, ...)` (`w`: a page's `UrlState.widget`) with the label and key (after `prefix`)
    of `field`."""
    return w(factory, field.label, prefix + field.url_key, **kwargs)


def target_value_field(metric: TargetMetric, default: float | None) -> Field:
    """The URL field of `metric`'s target value (in its unit; empty: no target), seeded with `default`: no
    bounds here, core checks the value in seconds by its flag's field (`TARGET_FIELDS`)."""
    return Field(
        metric.url_key,
        default,
        "float",
        optional=True,
        label=metric.label,
        step=metric.step,
    )


def target_percentile_field(metric: TargetMetric, default: int) -> Field:
    """The URL field of `metric`'s target percentile (p50 ... p99), seeded with `default`."""
    return Field(metric.q_key, default, "choice", tuple(PERCENTILES), label=metric.q_label)
