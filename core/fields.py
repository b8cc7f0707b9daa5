"""Every input declared once: an `InputField` is one input of the planner (its domain name, CLI flag, URL key,
type, bounds, label, help, default and unit), and a tuple of them is an input group (the load's
`core.planning.predict.load.LOAD_FIELDS`, speculation's `core.planning.cost.speculative.SPECULATION_FIELDS`, a
deployment's `core.planning.predict.deployment_fields`, a disaggregated one's
`core.planning.predict.disagg.DISAGG_FIELDS`, the latency targets' `core.planning.predict.target_fields`, the
capacity plan's and vLLM on a CPU's `core.planning.predict.plan_fields`, the SLO search's
`core.planning.search.search_fields.SEARCH_FIELDS`, a staged ramp's `core.planning.predict.ramp.RAMP_FIELDS`).
From a group are made the command line's flags (`core.planning.commands.flags.add_flags`), the pages' URL fields and widget labels (`ui.input_fields`),
and the one check of each value (`InputField.check`, which the domain type calls in its own constructor, so a bad
value has one message whether it came from a flag, a URL or a widget: the flag's name, what is allowed and what
was given). The converters from a values dict (keyed by `name`) to the domain types live beside them
(`core.planning.predict.inputs`).

No package of core is imported here (a top-level module): the groups import this type, not the reverse.
"""

from dataclasses import dataclass
from typing import Any

from core.common import check_float, check_int
from core.errors import InvalidArgumentError

KINDS = ("int", "float", "str", "choice", "multi", "ints", "bool")


@dataclass(frozen=True)
class InputField:
    """One input. name: the domain type's field and the key of a values dict; flag: the CLI flag ("--turn-gap",
    a public contract); url_key: the SLO planner page's URL parameter and widget key (a public contract too);
    kind: one of KINDS ("multi": several distinct choices, a tuple; "ints": several ints within the bounds, a
    sorted tuple of distinct values); default: the flag's default (a page may seed another); label: the widget's label (and the
    URL error's); help: the flag's help text; unit: what the number counts ("tokens"), named in the message;
    minimum / maximum / exclusive_minimum: the bounds `check` enforces; optional: None is allowed (the flag left
    out, the URL's "auto"); choices: a choice's allowed values; step: a number widget's step; required: the flag
    must be given (its `default` then only seeds a page); metavar: the flag's value in --help. url_key None: on
    no page. A "bool" is a switch: off by default, its flag turns it on (--disagg); on by default, its flag turns
    it off (`hybrid_kv_cache_manager`, flag --disable-hybrid-kv-cache-manager)."""

    name: str
    flag: str
    url_key: str | None
    kind: str
    default: Any = None
    label: str = ""
    help: str | None = None
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    optional: bool = False
    choices: tuple[Any, ...] = ()
    step: float | None = None
    required: bool = False
    metavar: str | None = None  # the flag's value in --help (default: the flag's name in capitals)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown input kind {self.kind!r}; allowed: {', '.join(KINDS)}")

    @property
    def what(self) -> str:
        """How a message names this input: its flag, with its unit ("--turn-gap (seconds)")."""
        return f"{self.flag} ({self.unit})" if self.unit else self.flag

    def check(self, value: Any) -> Any:
        """`value` as this input's type (an int, a finite float, ...) within its bounds; None when optional.
        Raises InvalidArgumentError naming the flag, what is allowed and what was given."""
        if value is None and self.optional:
            return None
        if self.kind == "int":
            return check_int(value, self.what, minimum=self.minimum, maximum=self.maximum)
        if self.kind == "float":
            return check_float(
                value,
                self.what,
                minimum=self.minimum,
                maximum=self.maximum,
                exclusive_minimum=self.exclusive_minimum,
            )
        if self.kind == "multi":
            values = (value,) if isinstance(value, str) else tuple(value)
            if not values:
                raise InvalidArgumentError(f"{self.flag} needs at least one value")
            if any(v not in self.choices for v in values):
                allowed = ", ".join(str(c) for c in self.choices)
                raise InvalidArgumentError(f"{self.flag} must be among {allowed}; got {list(values)}")
            return tuple(dict.fromkeys(values))  # each once, in the order given
        if self.kind == "ints":
            values = (value,) if isinstance(value, int) else tuple(value)
            if not values:
                raise InvalidArgumentError(f"{self.flag} needs at least one value")
            return tuple(
                sorted({check_int(v, self.what, minimum=self.minimum, maximum=self.maximum) for v in values})
            )
        if self.kind == "choice" and value not in self.choices:
            allowed = ", ".join(str(c) for c in self.choices)
            raise InvalidArgumentError(f"{self.flag} must be one of {allowed}, got {value!r}")
        if self.kind == "bool" and not isinstance(value, bool):
            raise InvalidArgumentError(f"{self.flag} must be true or false, got {value!r}")
        if self.kind == "str" and not isinstance(value, str):
            raise InvalidArgumentError(f"{self.flag} must be text, got {value!r}")
        return value

    def words(self, value: Any) -> list[str]:
        """The command-line words that give `value` (none for None or a switch off): `["--turns", "3"]`,
        `["--rate", "12.0"]` (a float as `repr`, so it reads back exactly), `["--disagg"]`."""
        if self.kind == "bool":  # a switch away from the default: --disagg, --disable-hybrid-kv-cache-manager
            return [self.flag] if value is not None and bool(value) != bool(self.default) else []
        if value is None:
            return []
        if self.kind in ("multi", "ints"):
            return [self.flag, *(str(v) for v in value)]
        return [self.flag, repr(float(value)) if self.kind == "float" else str(value)]


def field_named(fields: tuple[InputField, ...], name: str) -> InputField:
    """The field of `fields` called `name` (KeyError for none)."""
    for field in fields:
        if field.name == name:
            return field
    raise KeyError(name)


def check_fields(obj: object, fields: tuple[InputField, ...]) -> None:
    """Check every field of `fields` on `obj` (an attribute per name), storing the checked value (a frozen
    dataclass's `int` / `float` normalised as `check_int` / `check_float` return it)."""
    for field in fields:
        object.__setattr__(obj, field.name, field.check(getattr(obj, field.name)))


def check_values(values: dict[str, Any], fields: tuple[InputField, ...]) -> dict[str, Any]:
    """`values` with every field of `fields` checked (`InputField.check`), for inputs no domain type holds."""
    return values | {field.name: field.check(values[field.name]) for field in fields}
