"""Page state that lives in the URL: a schema of typed fields, parsed and validated like any user input.

A page declares its fields once (`Field`), reads `st.query_params` through `parse_params` (every bad value is
replaced by the field's default and reported with the reason, never raised), seeds its widgets from the
result, and writes the current values back with `encode_params` so the URL always reproduces the screen.
Nothing here imports streamlit: the functions take and return plain mappings, so they are tested directly.

Value kinds: "int", "float" (finite, within [minimum, maximum]); "choice" (one of `choices`); "multi" (a tuple of
distinct `choices`, comma-separated in the URL, in the order given); "bool" ("1"/"0", "true"/"false"); "str" (at
most `max_length` characters). `optional=True` adds "auto" (None). A number field made from an input's
declaration (`ui.input_fields.url_field`, bounded) is checked by that input's `check`, with its message.
"""

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import LabError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
AUTO = "auto"


@dataclass(frozen=True)
class Field:
    """One URL parameter. `key` is the parameter name; `default` the value when absent or invalid.

    The same field gives its widget its bounds and step (`widget_bounds`), so they are stated once."""

    key: str
    default: Any
    kind: str = "str"
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False
    max_length: int = 200
    label: str = ""
    step: float | None = None  # a number widget's step
    # a number's one check (`core.fields.InputField.check`): when set, the URL refuses what it refuses, with its
    # message (the command line's); else the bounds above are checked here
    check: Callable[[Any], Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in ("int", "float", "choice", "multi", "bool", "str"):
            raise ValueError(f"unknown field kind {self.kind!r}")

    def parse(self, raw: str) -> Any:
        """The value of `raw`, or raise ValueError with a reason a user can act on."""
        text = str(raw).strip()
        if self.optional and text.lower() in (AUTO, ""):
            return None
        if self.kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError("expected 1/0 or true/false")
        if self.kind == "choice":
            for choice in self.choices:
                if text == str(choice):
                    return choice
            raise ValueError(f"unknown value; allowed: {', '.join(str(c) for c in self.choices)}")
        if self.kind == "multi":
            names = [part.strip() for part in text.split(",") if part.strip()] if len(text) <= 1000 else None
            known = {str(choice): choice for choice in self.choices}
            if names is None or any(name not in known for name in names) or len(set(names)) != len(names):
                raise ValueError(f"expected distinct values among {', '.join(known)}, comma-separated")
            return tuple(known[name] for name in names)
        if self.kind == "str":
            if len(text) > self.max_length:
                raise ValueError(f"longer than {self.max_length:,} characters")
            return text
        try:
            value: Any = int(text) if self.kind == "int" else float(text)
        except ValueError:
            kind = "a whole number" if self.kind == "int" else "a number"
            raise ValueError(f"expected {kind}") from None
        if not math.isfinite(value):
            raise ValueError("expected a finite number")
        if self.check is not None:
            try:
                return self.check(value)
            except LabError as error:
                raise ValueError(str(error)) from None
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be at least {self.minimum:,g}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be at most {self.maximum:,g}")
        return value

    def encode(self, value: Any) -> str:
        if value is None:
            return AUTO
        if self.kind == "bool":
            return "1" if value else "0"
        if self.kind == "multi":
            return ",".join(str(v) for v in value)
        if self.kind == "float":
            return f"{float(value):g}" if abs(float(value)) < 1e15 else repr(float(value))
        return str(value)


def parse_params(params: Mapping[str, Any], fields: Iterable[Field]) -> tuple[dict[str, Any], list[str]]:
    """(values, errors): a value for every field, and one message per rejected parameter.

    A parameter given several times (a list) uses its last value. Unknown parameters are ignored.
    """
    values: dict[str, Any] = {}
    errors: list[str] = []
    for field in fields:
        raw = params.get(field.key)
        if isinstance(raw, list | tuple):
            raw = raw[-1] if raw else None
        if raw is None:
            values[field.key] = field.default
            continue
        try:
            values[field.key] = field.parse(raw)
        except ValueError as reason:
            shown = str(raw) if len(str(raw)) <= 60 else str(raw)[:57] + "..."
            name = f" ({field.label})" if field.label else ""
            errors.append(
                f"URL parameter `{field.key}`{name} = {shown!r} ignored: {reason}. Using the default."
            )
            values[field.key] = field.default
    return values, errors


def encode_params(values: Mapping[str, Any], fields: Iterable[Field]) -> dict[str, str]:
    """The URL parameters for `values` (every field, so a shared link does not depend on defaults)."""
    return {field.key: field.encode(values[field.key]) for field in fields if field.key in values}


def widget_bounds(field: Field) -> dict[str, Any]:
    """Keyword arguments that bound a widget to `field`: `options` for a choice; `min_value`, `max_value` and
    `step` for a number, typed like the field (int or float, as streamlit requires them all of one type)."""
    if field.kind in ("choice", "multi"):
        return {"options": list(field.choices)}
    if field.kind not in ("int", "float"):
        return {}
    cast = int if field.kind == "int" else float
    bounds = {"min_value": field.minimum, "max_value": field.maximum, "step": field.step}
    return {name: cast(value) for name, value in bounds.items() if value is not None}
