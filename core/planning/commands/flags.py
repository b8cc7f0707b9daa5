"""The command line's flags of an input group (`core.fields.InputField`), made from the group: the flag, its
type, default, help, and `dest` the field's name, so `vars(args)` is the values dict the converters of
`core.planning.predict.inputs` take. No `choices=` here: a choice is checked once, by the domain type, with the
same message the pages show."""

import argparse

from core.fields import InputField

_TYPES = {"int": int, "float": float, "str": str, "choice": str, "multi": str, "ints": int}


def flag_kwargs(field: InputField) -> dict:
    """`add_argument`'s keyword arguments for `field` (a bool is a switch: `store_true`, or `store_false` for one
    on by default: --disable-hybrid-kv-cache-manager)."""
    kwargs: dict = {"dest": field.name}
    if field.help is not None:
        kwargs["help"] = field.help
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
        return kwargs | {"nargs": "+", "default": list(field.default)}
    return kwargs | ({"required": True} if field.required else {"default": field.default})


def add_flags(
    parser: argparse.ArgumentParser, fields: tuple[InputField, ...], defaults: dict | None = None
) -> None:
    """One flag per field of `fields`, in order; `defaults`: a command's own default for some (by field name),
    which makes a required flag optional."""
    for field in fields:
        kwargs = flag_kwargs(field)
        if defaults and field.name in defaults:
            kwargs = {k: v for k, v in kwargs.items() if k != "required"} | {"default": defaults[field.name]}
        parser.add_argument(field.flag, **kwargs)


def add_exclusive_flags(parser: argparse.ArgumentParser, fields: tuple[InputField, ...]) -> None:
    """The fields as a required group of which exactly one is given (`--rate | --concurrency`)."""
    group = parser.add_mutually_exclusive_group(required=True)
    for field in fields:
        group.add_argument(field.flag, **flag_kwargs(field))
