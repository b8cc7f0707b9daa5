"""The KV core's token guard (`check_kv_token_ids`): its fast path (every id an exact int, checked in C) accepts
exactly what the full rule accepts for plain ints, and everything else takes the full rule: numpy integers in,
bools, floats, strings and an empty prompt out, each with the request named."""

import numpy as np
import pytest

from core.errors import InvalidArgumentError
from core.kv.request import check_kv_token_ids


def test_plain_and_numpy_ints_pass_as_a_new_list():
    given = (5, 7, 2**60)
    assert check_kv_token_ids("r", given) == [5, 7, 2**60]
    mixed = [1, np.int64(2), np.int32(3)]
    out = check_kv_token_ids("r", mixed)
    assert out == [1, 2, 3] and out is not mixed


@pytest.mark.parametrize("bad", [[1, True], [False], [1, 2.0], ["3"], [1, None]])
def test_bools_and_non_integers_are_refused_naming_the_request(bad):
    with pytest.raises(InvalidArgumentError, match="request 'r7': token ids must be integers"):
        check_kv_token_ids("r7", bad)


def test_an_empty_prompt_is_refused():
    with pytest.raises(InvalidArgumentError, match="at least 1 token"):
        check_kv_token_ids("r", [])
