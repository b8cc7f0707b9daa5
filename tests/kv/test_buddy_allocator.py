"""The buddy allocator, the contiguous KV pool that places the Orca baselines' reservations."""

import itertools
import random

import pytest

from core.errors import InvalidArgumentError
from core.kv.buddy_allocator import BuddyAllocator


def test_paper_capacity_holds_exactly_seven_max_reservations():
    """15,728 slots = 8,192 + 4,096 + 2,048 + 1,024 + 256 + 64 + 32 + 16: seven 2,048 segments, and the rest
    (8.9% of the cache, Figure 2's external fragmentation of Orca Max) can never hold an eighth."""
    buddy = BuddyAllocator(15_728)
    assert buddy.free_list_size == 8 and buddy.largest_segment == 8192
    addresses = [buddy.allocate(2048) for _ in range(7)]
    assert None not in addresses and len(set(addresses)) == 7
    assert buddy.allocate(2048) is None
    assert buddy.free_slots == 15_728 - 7 * 2048
    assert buddy.free_slots / 15_728 == pytest.approx(0.0885, abs=1e-3)


def test_external_fragmentation_is_real():
    buddy = BuddyAllocator(64)
    blocks = [buddy.allocate(16) for _ in range(4)]
    buddy.free(blocks[0])
    buddy.free(blocks[2])
    assert buddy.free_slots == 32
    assert buddy.allocate(32) is None  # 32 slots free, but not in one aligned piece
    buddy.free(blocks[1])  # 0..47 free -> merges into [0, 32) + [32, 48)
    assert buddy.allocate(32) == 0


def test_split_rounds_to_power_of_two_and_merge_restores_roots():
    buddy = BuddyAllocator(100)  # roots [0, 64) + [64, 96) + [96, 100)
    a = buddy.allocate(5)  # 8 slots, split from the smallest sufficient block: the 32-slot root
    assert a == 64 and buddy.free_slots == 92
    assert buddy.allocate(33) == 0  # 64 slots: the 64-slot root
    assert buddy.allocate(32) is None  # 24 slots left in the 32-slot root, 4 in the last one
    assert buddy.allocate(16) == 80 and buddy.allocate(8) == 72
    assert buddy.allocate(1) == 96
    for address in (a, 0, 80, 72, 96):
        buddy.free(address)
    assert buddy.free_slots == 100 and buddy.free_list_size == 3
    with pytest.raises(InvalidArgumentError):
        buddy.free(12345)


def test_random_operations_never_overlap_and_stay_aligned():
    rng = random.Random(0)
    capacity = 15_728
    buddy = BuddyAllocator(capacity)
    live: dict[int, int] = {}
    for _ in range(3_000):
        if live and rng.random() < 0.45:
            address = rng.choice(sorted(live))
            buddy.free(address)
            del live[address]
        else:
            size = rng.randint(1, 2048)
            address = buddy.allocate(size)
            if address is not None:
                seg = 1 << (size - 1).bit_length()  # the power of two the segment is rounded to
                assert address % seg == 0 and address + seg <= capacity
                live[address] = seg
        spans = sorted(live.items())
        for (a1, s1), (a2, _) in itertools.pairwise(spans):
            assert a1 + s1 <= a2
        assert buddy.free_slots == capacity - sum(live.values())
        assert buddy.segments() == live
    for address in list(live):
        buddy.free(address)
    assert buddy.free_list_size == 8 and buddy.largest_free() == 8192
