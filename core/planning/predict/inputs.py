"""One converter from a values dict (keyed by the input groups' field names, `core.fields`) to the planner's
domain types, used by the command line (`vars(args)` of `core.planning.commands.flags`) and the pages
(`core.page_models.slo_predict`) alike: `load_from` -> `Load`, `speculation_from` -> `Speculation`. A key left
out takes its field's default; each value is checked once, by the domain type's constructor, with the message
that names its flag."""

from collections.abc import Mapping
from typing import Any

from core.planning.predict.load import LOAD_FIELDS, Load


def _values(fields, values: Mapping[str, Any]) -> dict[str, Any]:
    return {field.name: values.get(field.name, field.default) for field in fields}


def load_from(values: Mapping[str, Any]) -> Load:
    """The `Load` of `values` (rate or concurrency, exactly one not None; the lengths; the levers)."""
    return Load(**_values(LOAD_FIELDS, values))
