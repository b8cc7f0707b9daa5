"""`BuddyAllocator`: the contiguous KV pool of the Orca baselines, a binary buddy allocator over token slots.

It lives beside `BlockPool` because it is the other kind of KV pool this lab simulates: one segment per sequence
in a linear address space, where `BlockPool` hands out fixed-size blocks. The reservation rules that size the
segments are the Orca policy's (`core.serving.contiguous_memory`).
"""

from core.common import check_int
from core.errors import InvalidArgumentError


class BuddyAllocator:
    """A binary buddy allocator over slots [0, capacity).

    A capacity that is not a power of two is split into aligned power-of-two *root* chunks, largest first
    (15,728 = 8,192 + 4,096 + 2,048 + 1,024 + 256 + 64 + 32 + 16); blocks never merge across roots.
    `allocate(size)` rounds size up to a power of two, takes the lowest-addressed free block of the smallest
    sufficient order, splits it down, and returns the segment's start address, or None when no free block is large
    enough (nothing changes then). `free(address)` returns the segment and merges buddies back up.

    Invariant: free blocks and allocated segments tile [0, capacity) exactly; `free_slots` is their free part.
    """

    def __init__(self, capacity: int):
        capacity = check_int(capacity, "capacity (slots)", minimum=1)
        self.capacity = capacity
        self._free: dict[int, set[int]] = {}  # order -> start addresses of free blocks
        self._roots: set[tuple[int, int]] = set()
        self._allocated: dict[int, int] = {}  # start -> order
        address = 0
        for order in range(capacity.bit_length() - 1, -1, -1):
            if capacity & (1 << order):
                self._roots.add((address, order))
                self._free.setdefault(order, set()).add(address)
                address += 1 << order
        self.free_slots = capacity
        self.max_order = capacity.bit_length() - 1

    @property
    def largest_segment(self) -> int:
        """The largest segment that could ever be placed (the biggest root chunk), in slots."""
        return 1 << self.max_order

    @property
    def free_list_size(self) -> int:
        """Number of free blocks over all orders."""
        return sum(len(s) for s in self._free.values())

    def largest_free(self) -> int:
        """Slots of the largest free block (0 when full)."""
        orders = [o for o, s in self._free.items() if s]
        return 1 << max(orders) if orders else 0

    def can_allocate(self, size: int) -> bool:
        order = (int(size) - 1).bit_length()
        return any(s for o, s in self._free.items() if o >= order)

    def allocate(self, size: int) -> int | None:
        size = check_int(size, "segment size (slots)", minimum=1)
        order = (size - 1).bit_length()
        candidates = [o for o, s in self._free.items() if o >= order and s]
        if not candidates:
            return None
        found = min(candidates)
        address = min(self._free[found])
        self._free[found].discard(address)
        while found > order:  # split: keep the lower half, free the upper buddy
            found -= 1
            self._free.setdefault(found, set()).add(address + (1 << found))
        self._allocated[address] = order
        self.free_slots -= 1 << order
        return address

    def free(self, address: int) -> None:
        order = self._allocated.pop(address, None)
        if order is None:
            raise InvalidArgumentError(f"no segment starts at slot {address}")
        self.free_slots += 1 << order
        while (address, order) not in self._roots:
            buddy = address ^ (1 << order)
            peers = self._free.get(order)
            if not peers or buddy not in peers:
                break
            peers.discard(buddy)
            address = min(address, buddy)
            order += 1
        self._free.setdefault(order, set()).add(address)

    def segments(self) -> dict[int, int]:
        """Allocated segments: start address -> size in slots."""
        return {a: 1 << o for a, o in self._allocated.items()}
