"""One converter from a values dict (keyed by the input groups' field names, `core.fields`) to the planner's
domain types, used by the command line (`vars(args)` of `core.planning.commands.flags`) and the pages
(`core.page_models.slo_predict`) alike: `load_from` -> `Load`, `speculation_from` -> `Speculation` (and back: `speculation_words`). A key left
out takes its field's default; each value is checked once, by the domain type's constructor, with the message
that names its flag."""

from collections.abc import Mapping
from typing import Any

from core.errors import InvalidArgumentError
from core.planning.cost.speculative import SPECULATION_FIELDS, Speculation, parse_acceptance
from core.planning.predict.load import LOAD_FIELDS, Load


def _values(fields, values: Mapping[str, Any]) -> dict[str, Any]:
    return {field.name: values.get(field.name, field.default) for field in fields}


def load_from(values: Mapping[str, Any]) -> Load:
    """The `Load` of `values` (rate or concurrency, exactly one not None; the lengths; the levers)."""
    return Load(**_values(LOAD_FIELDS, values))


def speculation_from(values: Mapping[str, Any]) -> Speculation | None:
    """The `Speculation` of spec_tokens (None or 0: none), spec_acceptance ("a1,...,aK"), spec_method and
    draft_model (counted only for the "draft-model" method). Raises InvalidArgumentError naming the flag: an
    acceptance or a method without K, K without an acceptance, or what `Speculation` refuses."""
    v = _values(SPECULATION_FIELDS, values)
    if not v["spec_tokens"]:
        if v["spec_acceptance"] or v["spec_method"] != "ngram":
            raise InvalidArgumentError(
                "--spec-acceptance, --spec-method and --draft-model need --spec-tokens K"
            )
        return None
    if v["spec_acceptance"] is None:
        raise InvalidArgumentError(
            "--spec-tokens needs --spec-acceptance a1,...,aK (one rate per draft token)"
        )
    draft = v["draft_model"] if v["spec_method"] == "draft-model" else None
    rates = parse_acceptance(v["spec_acceptance"])
    return Speculation(v["spec_tokens"], rates, v["spec_method"], draft)


def speculation_words(speculation: Speculation | None) -> list[str]:
    """The command-line words of `speculation` (none for None): what `speculation_from` reads back."""
    if speculation is None:
        return []
    values = {
        "spec_tokens": speculation.num_tokens,
        "spec_acceptance": ",".join(repr(a) for a in speculation.acceptance),
        "spec_method": speculation.method,
        "draft_model": speculation.draft_model,
    }
    return [word for field in SPECULATION_FIELDS for word in field.words(values[field.name])]
