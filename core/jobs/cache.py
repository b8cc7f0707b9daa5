"""A bounded, thread-safe memo of finished job results: at most `max_entries`, each for at most `ttl_s` seconds."""

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable

MISSING = object()  # what `get` returns for a key that is not cached (a result may itself be None)


class ResultCache:
    """LRU cache of immutable results keyed by a job's inputs.

    Invariants: never more than `max_entries` items (0 disables caching); with `max_bytes`, the items' declared
    sizes (`put`'s `nbytes`) sum to at most `max_bytes`, except that the newest item is kept even when it alone
    exceeds it; an item older than `ttl_s` is never returned. Values are stored as given and handed to every
    caller that asks: callers treat them as read-only, so sharing a value between sessions shares no mutable state.
    """

    def __init__(self, max_entries: int, ttl_s: float, clock=time.monotonic, max_bytes: int | None = None):
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._items: OrderedDict[Hashable, tuple[float, object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> object:
        """The cached value for `key`, or `MISSING` when absent or expired (an expired item is dropped)."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return MISSING
            stored_at, value, nbytes = item
            if self._clock() - stored_at > self.ttl_s:
                del self._items[key]
                self._bytes -= nbytes
                return MISSING
            self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: object, nbytes: int = 0) -> None:
        """Cache `value` for `key`; `nbytes` is its size as counted against `max_bytes` (e.g. its pickle's)."""
        with self._lock:
            if self.max_entries < 1:
                return
            if key in self._items:
                self._bytes -= self._items.pop(key)[2]
            self._items[key] = (self._clock(), value, nbytes)
            self._bytes += nbytes
            while len(self._items) > self.max_entries or (
                self.max_bytes is not None and self._bytes > self.max_bytes and len(self._items) > 1
            ):
                self._bytes -= self._items.popitem(last=False)[1][2]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
