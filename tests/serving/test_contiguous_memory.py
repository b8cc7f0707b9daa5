"""The contiguous (Orca) reservation rules: what each baseline reserves before the buddy allocator rounds it."""

import pytest

from core.errors import InvalidArgumentError
from core.serving.contiguous_memory import next_pow2, reservation


def test_next_pow2():
    assert [next_pow2(v) for v in (1, 2, 3, 25, 32, 33, 2047, 2048)] == [1, 2, 4, 32, 32, 64, 2048, 2048]


def test_reservation_rules_of_the_three_orca_baselines():
    assert reservation("orca-max", 100, 25, 2048) == 2048
    assert reservation("orca-pow2", 100, 25, 2048) == 132  # the paper: a true output of 25 reserves 32
    assert reservation("orca-pow2", 1500, 900, 2048) == 2048  # capped at the maximum length
    assert reservation("orca-oracle", 100, 25, 2048) == 125
    with pytest.raises(InvalidArgumentError):
        reservation("orca-huge", 1, 1, 2048)
