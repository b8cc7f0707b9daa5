"""A result cache on disk that several processes share: a result computed once serves every server replica.

One file per result, named by a digest of the job key, holding the pickled `(key, value)`. Invariants:
- A reader sees a whole file or none: a writer writes a private temporary file in the same directory and renames
  it over the final name (`os.replace` is atomic on POSIX), so concurrent writers of the same key leave one
  complete file (the last rename wins; both hold the same result).
- Bounded: after each write the oldest files (by modification time, which a hit refreshes) are removed until at
  most `max_entries` files and `max_bytes` bytes remain; a file older than `ttl_s` is never returned.
- A file whose stored key differs from the asked key (a digest collision), or that does not unpickle (a partial
  file from a crash cannot exist, but a foreign one might), is a miss, never an error.
Only processes of the same host (the same code and trust) share a directory: the files are pickles.
"""

import contextlib
import hashlib
import os
import pickle
import tempfile
import time
from collections.abc import Hashable
from pathlib import Path

from core.jobs.cache import MISSING

SUFFIX = ".result"


def key_digest(key: Hashable) -> str:
    """A file name for `key`: sha256 of its repr, which is stable across processes for the job keys used here
    (tuples of module and function names and frozen dataclasses of numbers and strings)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:40]


class DiskResultCache:
    """`ResultCache`'s interface (get / put / len / clear) over files in `directory`, shared between processes."""

    def __init__(
        self, directory: str | os.PathLike, max_entries: int, ttl_s: float, max_bytes: int = 4 * 1024**3
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_entries, self.ttl_s, self.max_bytes = max_entries, ttl_s, max_bytes

    def _path(self, key: Hashable) -> Path:
        return self.directory / (key_digest(key) + SUFFIX)

    def contains(self, key: Hashable) -> bool:
        """Whether a fresh file for `key` exists (its content is not read: `get` may still miss on a collision)."""
        try:
            return time.time() - self._path(key).stat().st_mtime <= self.ttl_s
        except OSError:
            return False

    def get(self, key: Hashable) -> object:
        """The stored value for `key`, or MISSING when absent, expired or unreadable."""
        return self.get_sized(key)[0]

    def get_sized(self, key: Hashable) -> tuple[object, int]:
        """`(get(key), size of its file in bytes)`; `(MISSING, 0)` on a miss."""
        path = self._path(key)
        try:
            size = path.stat().st_size
            if time.time() - path.stat().st_mtime > self.ttl_s:
                return MISSING, 0
            with open(path, "rb") as file:
                stored_key, value = pickle.load(file)
        except (
            OSError,
            EOFError,
            pickle.UnpicklingError,
            ValueError,
            TypeError,
            AttributeError,
            ImportError,
        ):
            return MISSING, 0
        if stored_key != key:
            return MISSING, 0
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        return value, size

    def put(self, key: Hashable, value: object) -> bool:
        """Store `value` for `key`; False (nothing stored) when caching is off or the value does not pickle or
        the disk refuses it."""
        if self.max_entries < 1:
            return False
        try:
            data = pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return False
        if len(data) > self.max_bytes:
            return False
        try:
            descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=SUFFIX)
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
            os.replace(temporary, self._path(key))
        except OSError:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(temporary)
            return False
        self._prune()
        return True

    def _entries(self) -> list[tuple[float, int, Path]]:
        entries = []
        for path in self.directory.glob("*" + SUFFIX):
            if path.name.startswith(".tmp-"):
                continue
            with contextlib.suppress(OSError):
                stat = path.stat()
                entries.append((stat.st_mtime, stat.st_size, path))
        return sorted(entries)

    def _prune(self) -> None:
        """Remove expired files, then the least recently used until within both bounds."""
        entries = self._entries()
        now = time.time()
        total = sum(size for _, size, _ in entries)
        for index, (mtime, size, path) in enumerate(entries):
            remaining = len(entries) - index
            if now - mtime <= self.ttl_s and remaining <= self.max_entries and total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
            total -= size

    def __len__(self) -> int:
        return len(self._entries())

    def clear(self) -> None:
        for _, _, path in self._entries():
            with contextlib.suppress(OSError):
                path.unlink()
