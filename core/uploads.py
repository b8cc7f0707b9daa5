"""Uploaded files (a serving trace, a config.json, a safetensors index): the checks every upload passes before any
of it is parsed, in one place.

Order, each step refusing with a typed error and a reason before the next one runs:
1. `read_upload`: the size against PAGED_LAB_MAX_UPLOAD_BYTES, from the file's `size` (a Streamlit upload), its
   `stat` (a path) or by seeking (a file object) *before* a byte is read; a stream of unknown size is read at most
   one byte past the limit. Raises `LimitExceededError`.
2. `upload_text`: empty, a compressed archive (gzip, zip, bzip2, xz, zstd, 7z, zlib, tar: recognised by their
   magic bytes and never decompressed, so a zip bomb costs nothing), UTF-16, binary (a NUL byte), not UTF-8.
   Raises `InvalidArgumentError`. Returns the text (a UTF-8 byte-order mark dropped).
3. `parse_json`: a JSON document, with malformed JSON, nesting bombs (`[[[[...`: Python's parser raises
   RecursionError) and integers of thousands of digits all reported as `InvalidArgumentError`.
Row-level checks (columns, lengths, the request limit while reading) belong to the format's reader
(`core.serving.workload.load_trace`).
"""

import json
import os
from pathlib import Path
from typing import Any

from core.errors import InvalidArgumentError
from core.limits import Limits

# magic bytes at the start of the file -> format (file(1)'s signatures)
COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"PK\x03\x04": "zip",
    b"PK\x05\x06": "zip",
    b"PK\x07\x08": "zip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"7z\xbc\xaf\x27\x1c": "7z",
    b"\x78\x01": "zlib",
    b"\x78\x9c": "zlib",
    b"\x78\xda": "zlib",
}
_TAR_MAGIC_OFFSET = 257  # POSIX tar: "ustar" at byte 257 of the first header


def read_upload(file: Any, what: str, limits: Limits) -> bytes:
    """The bytes of `file` (bytes, a path, or a binary file object such as a Streamlit `UploadedFile`), refused
    with LimitExceededError (naming PAGED_LAB_MAX_UPLOAD_BYTES) when over `limits.max_upload_bytes`.

    The size is checked before reading whenever it is known: a `size` attribute, a path's `stat`, or a seekable
    file's end position; otherwise at most `max_upload_bytes + 1` bytes are read. A file object is read from its
    current position (`getvalue()` when it has one: the whole buffer, whatever the position)."""
    if isinstance(file, bytes | bytearray | memoryview):
        limits.check_upload(len(file), what)
        return bytes(file)
    if isinstance(file, str | os.PathLike):
        path = Path(file)
        try:
            limits.check_upload(path.stat().st_size, what)
            data = path.read_bytes()
        except OSError as err:
            raise InvalidArgumentError(f"cannot read {what} {str(file)!r}: {err.strerror}") from None
        limits.check_upload(len(data), what)  # it may have grown since stat
        return data
    if not hasattr(file, "read"):
        raise InvalidArgumentError(
            f"{what} must be bytes, a path or a file object, got {type(file).__name__}"
        )
    size = getattr(file, "size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        limits.check_upload(size, what)
    elif _seekable(file):
        start = file.tell()
        end = file.seek(0, os.SEEK_END)
        file.seek(start)
        limits.check_upload(end - start, what)
    data = file.getvalue() if hasattr(file, "getvalue") else file.read(limits.max_upload_bytes + 1)
    if isinstance(data, str):
        data = data.encode("utf-8")
    limits.check_upload(len(data), what, at_least=not hasattr(file, "getvalue"))
    return bytes(data)


def _seekable(file: Any) -> bool:
    try:
        return bool(file.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def archive_kind(data: bytes) -> str | None:
    """The compressed-archive format `data` starts with ("gzip", "zip", ...), or None. Looks at magic bytes only:
    nothing is decompressed."""
    for magic, kind in COMPRESSED_MAGIC.items():
        if data.startswith(magic):
            return kind
    if data[_TAR_MAGIC_OFFSET : _TAR_MAGIC_OFFSET + 5] == b"ustar":
        return "tar"
    return None


def upload_text(data: bytes, what: str, expected: str, max_bytes: int | None = None) -> str:
    """`data` decoded as UTF-8 text (a leading byte-order mark dropped).

    Raises InvalidArgumentError naming `what` and asking for `expected` (e.g. "a CSV or JSONL trace") when the
    file is a compressed archive (never decompressed), longer than `max_bytes` (a format's own bound, below the
    operator's upload limit), UTF-16, binary (a NUL byte), not UTF-8, or empty / only whitespace."""
    kind = archive_kind(data)
    if kind is not None:
        raise InvalidArgumentError(
            f"{what} is a {kind} compressed archive: upload the uncompressed CSV/JSONL/JSON ({expected}); "
            "archives are never unpacked"
        )
    if max_bytes is not None and len(data) > max_bytes:
        raise InvalidArgumentError(
            f"{what} has {len(data):,} bytes; {expected} of at most {max_bytes:,} bytes is accepted"
        )
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InvalidArgumentError(f"{what} is UTF-16 text: save it as UTF-8 ({expected})")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InvalidArgumentError(f"{what} is binary (a NUL byte at byte {nul:,}), not {expected}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InvalidArgumentError(
            f"{what} is not UTF-8 text (byte {err.start:,}): upload {expected}"
        ) from None
    if not text or text.isspace():  # (no copy of the text, unlike strip())
        raise InvalidArgumentError(f"{what} is empty: upload {expected}")
    return text


def parse_json(text: str | bytes, what: str) -> Any:
    """The JSON document in `text`; InvalidArgumentError (with the parser's line and column) for malformed JSON,
    nesting deeper than the interpreter's recursion limit, or an integer longer than Python's 4,300 digits."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidArgumentError(f"{what} is not valid JSON: {err}") from None
    except RecursionError:
        raise InvalidArgumentError(
            f"{what} cannot be read: its JSON is nested too deeply (a nesting bomb?)"
        ) from None
    except UnicodeDecodeError as err:  # bytes given
        raise InvalidArgumentError(f"{what} is not UTF-8 JSON (byte {err.start:,})") from None
    except ValueError as err:  # an integer of thousands of digits
        raise InvalidArgumentError(f"{what} cannot be read: {err}") from None
