"""The one check of a request's token ids: validated at the edge where they enter, trusted inside.

Two edges take token ids from outside: the library (`Engine.add_request` / `generate` called by a Python user)
and the HTTP server (`core.serve.protocol`, from a JSON body). Both call `check_token_ids`, which returns the ids
as a `CheckedTokenIds` (a tuple of Python ints, tagged with the vocabulary size they were checked against).
The engine takes a `CheckedTokenIds` of its own vocabulary as it is, so ids the server checked are not checked
again; anything else given to the engine (a list, a numpy array, ids checked against another vocabulary) is
checked there. Below the engine nothing checks them against a vocabulary again (the KV core's
`core.kv.request.check_kv_token_ids` only checks that they are integers, as it copies them).

The rule: a list (any iterable but text, bytes or a mapping) of integers (Python or numpy, never bool), each in
[0, vocab_size); at most `max_len` of them when given; at least one unless `allow_empty`. A bad list raises
`TokenIdsError` naming `param` (the list) or `param[i]` (the first bad id).
"""

from collections.abc import Iterable, Mapping
from numbers import Integral

from core.common import json_type_name
from core.errors import TokenIdsError


class CheckedTokenIds(tuple):
    """Token ids `check_token_ids` accepted: Python ints in [0, `vocab_size`). Made only by `check_token_ids`;
    equal to the plain tuple of the same ids."""

    vocab_size: int

    def __new__(cls, ids: Iterable[int], vocab_size: int) -> "CheckedTokenIds":
        self = super().__new__(cls, ids)
        self.vocab_size = vocab_size
        return self

    def __reduce__(self):
        return (type(self), (tuple(self), self.vocab_size))


def check_token_ids(
    value: object,
    vocab_size: int,
    *,
    param: str = "prompt",
    max_len: int | None = None,
    allow_empty: bool = False,
) -> CheckedTokenIds:
    """`value` as `CheckedTokenIds` of a vocabulary of `vocab_size` ids. Raises TokenIdsError (see the module
    docstring for the rule); `param` is how the caller names `value` in messages."""
    if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise TokenIdsError(f"{param} must be an array of token ids, got {json_type_name(value)}", param)
    try:
        ids = value if isinstance(value, list | tuple) else list(value)
    except TypeError:  # iterable in name only (a 0-d array)
        raise TokenIdsError(
            f"{param} must be an array of token ids, got {json_type_name(value)}", param
        ) from None
    if max_len is not None and len(ids) > max_len:
        raise TokenIdsError(f"{param} has {len(ids):,} token ids; at most {max_len:,} are allowed", param)
    if not ids:
        if allow_empty:
            return CheckedTokenIds((), vocab_size)
        raise TokenIdsError(f"{param} needs at least one token", param)
    if all(type(t) is int for t in ids) and min(ids) >= 0 and max(ids) < vocab_size:  # the common case, fast
        return CheckedTokenIds(ids, vocab_size)
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, Integral):
            raise TokenIdsError(
                f"{param}[{i}] must be an integer token id, got {json_type_name(t)}", f"{param}[{i}]"
            )
        if not 0 <= t < vocab_size:
            shown = f"{int(t):,}" if abs(t) < 10**30 else "a larger number"
            raise TokenIdsError(
                f"{param}[{i}] is {shown}, outside the vocabulary (token ids 0 to {vocab_size - 1:,})",
                f"{param}[{i}]",
            )
    return CheckedTokenIds((int(t) for t in ids), vocab_size)
