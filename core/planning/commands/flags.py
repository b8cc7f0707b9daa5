"""The command line's flags of an input group (`core.fields.InputField`), made from the group: the flag, its
type, default, help, and `dest` the field's name, so `vars(args)` is the values dict the converters of
`core.planning.predict.inputs` take. No `choices=` here: a choice is checked once, by the domain type, with the
same message the pages show."""

import argparse

from core.fields import InputField

_TYPES = {"int": int, "float": float, "str": str, "choice": str, "multi": str, "ints": int}


_FIELD_DEFAULT = object()  # `flag_kwargs`: the field's own default


def shown_default(value) -> str:
    """A default as --help prints it and a user types it: 0.9, 50, 8192, auto, "l40s h100-80gb" (a list)."""
    if isinstance(value, (list, tuple)):
        return " ".join(shown_default(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def help_text(field: InputField, default, required: bool) -> str:
    """The flag's --help line: the field's help (else its label), then "required" or its default when it has one
    (argparse formats help with %, so a % in it is doubled)."""
    text = (field.help or field.label).replace("%", "%%")
    if required:
        return f"{text} (required)"
    if field.kind == "bool" or default is None or "default" in text:
        return text  # a switch, no default, or a help that says its default itself
    return f"{text} (default: {shown_default(default).replace('%', '%%')})"


def flag_kwargs(field: InputField, default=_FIELD_DEFAULT, required: bool | None = None) -> dict:
    """`add_argument`'s keyword arguments for `field` (a bool is a switch: `store_true`, or `store_false` for one
    on by default: --disable-hybrid-kv-cache-manager). default / required: a command's own, instead of the
    field's (a default makes a required field optional). The help says the default, or that the flag is
    required."""
    if default is _FIELD_DEFAULT:
        default = list(field.default) if field.kind in ("multi", "ints") else field.default
        required = field.required if required is None else required
    else:
        required = bool(required)
    kwargs: dict = {"dest": field.name, "help": help_text(field, default, required)}
    if field.kind == "bool":
        return kwargs | {"action": "store_false" if field.default else "store_true"}
    kind = _TYPES[field.kind]
    if field.kind == "choice" and field.choices:  # a choice of numbers reads numbers: --block-size 32
        kind = type(field.choices[0])
    kwargs |= {
        "type": kind,
        "metavar": field.metavar or field.flag.removeprefix("--").upper().replace("-", "_"),
    }
    if field.kind in ("multi", "ints"):  # one or more values: --gpus l40s h100-80gb, --tp 1 2 4
        kwargs["nargs"] = "+"
    return kwargs | ({"required": True} if required else {"default": default})


def add_flags(
    parser: argparse.ArgumentParser, fields: tuple[InputField, ...], defaults: dict | None = None
) -> None:
    """One flag per field of `fields`, in order; `defaults`: a command's own default for some (by field name),
    which makes a required flag optional."""
    for field in fields:
        if defaults and field.name in defaults:
            parser.add_argument(field.flag, **flag_kwargs(field, defaults[field.name]))
        else:
            parser.add_argument(field.flag, **flag_kwargs(field))


def add_exclusive_flags(parser: argparse.ArgumentParser, fields: tuple[InputField, ...]) -> None:
    """The fields as a required group of which exactly one is given (`--rate | --concurrency`)."""
    group = parser.add_mutually_exclusive_group(required=True)
    for field in fields:
        group.add_argument(field.flag, **flag_kwargs(field))
