"""The command line's flags of an input group (`core.fields.InputField`), made from the group: the flag, its
type, default, help, and `dest` the field's name, so `vars(args)` is the values dict the converters of
`core.planning.predict.inputs` take. No `choices=` here: a choice is checked once, by the domain type, with the
same message the pages show."""

import argparse

from core.fields import InputField

_TYPES = {"int": int, "float": float, "str": str, "choice": str}


def flag_kwargs(field: InputField) -> dict:
    """`add_argument`'s keyword arguments for `field` (a bool is a `store_true` switch)."""
    kwargs: dict = {"dest": field.name}
    if field.help is not None:
        kwargs["help"] = field.help
    if field.kind == "bool":
        return kwargs | {"action": "store_true"}
    kwargs |= {
        "type": _TYPES[field.kind],
        "metavar": field.metavar or field.flag.removeprefix("--").upper().replace("-", "_"),
    }
    return kwargs | ({"required": True} if field.required else {"default": field.default})


def add_flags(parser: argparse.ArgumentParser, fields: tuple[InputField, ...]) -> None:
    """One flag per field of `fields`, in order."""
    for field in fields:
        parser.add_argument(field.flag, **flag_kwargs(field))


def add_exclusive_flags(parser: argparse.ArgumentParser, fields: tuple[InputField, ...]) -> None:
    """The fields as a required group of which exactly one is given (`--rate | --concurrency`)."""
    group = parser.add_mutually_exclusive_group(required=True)
    for field in fields:
        group.add_argument(field.flag, **flag_kwargs(field))
