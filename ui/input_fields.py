"""The pages' side of the input groups (`core.fields.InputField`): each field's URL field (`url_field`: its key,
kind, choices and step from the schema, its default the page's seed) and widget (`input_widget`: its label and
key from the schema), and the values dict the converters of `core.planning.predict.inputs` take
(`values_by_name`). Number fields get no bounds in the URL or the widget unless asked (a slider needs them): a
bad value reaches the domain type's one check, whose message (naming the flag) the page shows with st.error,
as the command line prints it. No streamlit here."""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from core.fields import InputField
from ui.query_state import Field

_SEED = object()


def url_field(field: InputField, default: Any = _SEED, *, bounded: bool = False) -> Field:
    """The URL field of `field`, seeded with `default` (the schema's default when left out); `bounded`: its
    minimum and maximum too (a slider's range). Empty ("auto") is allowed when the field is optional and the
    page seeds it empty."""
    seed = field.default if default is _SEED else default
    return Field(
        field.url_key,
        seed,
        field.kind,
        field.choices,
        minimum=field.minimum if bounded else None,
        maximum=field.maximum if bounded else None,
        optional=field.optional and seed is None,
        label=field.label,
        step=field.step,
    )


def values_by_name(values: Mapping[str, Any], fields: Iterable[InputField]) -> dict[str, Any]:
    """A page's values (keyed by URL key) as the converters take them (keyed by field name)."""
    return {field.name: values[field.url_key] for field in fields}


def input_widget(w: Callable[..., Any], factory: Callable[..., Any], field: InputField, **kwargs: Any) -> Any:
    """`w(factory, label, key, ...)` (`w`: a page's `UrlState.widget`) with the label and key of `field`."""
    return w(factory, field.label, field.url_key, **kwargs)
