"""Every error that core raises derives from `LabError`.

Messages say what was wrong and what is allowed. A call that raises leaves the object it was called on
exactly as it was before the call.
"""


class LabError(Exception):
    """Base class of every error raised by `core`."""


class InvalidArgumentError(LabError, ValueError):
    """An argument is out of range, of the wrong type, shape, dtype or device."""


class OutOfBlocksError(LabError):
    """The block pool has too few free blocks for the request."""

    def __init__(self, message: str, needed: int, free: int):
        super().__init__(message)
        self.needed = needed
        self.free = free


class UnknownSequenceError(LabError, LookupError):
    """An operation or query names a sequence id the manager does not hold."""


class DuplicateSequenceError(LabError):
    """A sequence id that is already live was given for a new sequence."""


class MemoryBudgetError(LabError):
    """An allocation would exceed the memory budget; raised before anything is allocated."""

    def __init__(self, message: str, requested_bytes: int, allowed_bytes: int):
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.allowed_bytes = allowed_bytes

    def __reduce__(self):  # travels from a worker process intact, with its fields
        return (type(self), (str(self), self.requested_bytes, self.allowed_bytes))


class BackendUnavailableError(LabError):
    """A compute backend was asked for that cannot run here (e.g. Triton without a GPU or without triton)."""


class ModelLoadError(LabError):
    """A model directory or config cannot be loaded: a missing or unreadable file, a missing weight, an
    unsupported architecture or setting. The message names the file, key or setting and what is supported."""


class ModelTooLargeError(ModelLoadError, MemoryBudgetError):
    """A model's weights (plus the smallest KV pool) exceed the memory budget; raised before loading them."""


class KVEventDecodeError(LabError, ValueError):
    """A KV cache event payload is not a batch in vLLM's wire format: not msgpack, not a `[ts, events, rank]`
    batch, an event of an unknown type, or a field of the wrong type. The message says which and where."""


class MetricsFormatError(InvalidArgumentError):
    """A body fetched as Prometheus metrics is not metrics (an HTML page, a truncated or malformed line) or holds
    no vLLM metric. `line_number` (1-based) names the first bad line, None when the body as a whole is wrong."""

    def __init__(self, message: str, line_number: int | None = None):
        super().__init__(message)
        self.line_number = line_number

    def __reduce__(self):
        return (type(self), (str(self), self.line_number))


class LiveEndpointError(LabError):
    """A live server's metrics URL or KV-events endpoint cannot be read: refused, unreachable, timed out, an HTTP
    error status, a malformed address, or a message that breaks the wire format. The message names the address."""


class ModelFetchError(ModelLoadError):
    """A model package could not be downloaded (offline, registry refused) or its file failed the checksum.
    The message says which step failed and how to fetch the file by hand; nothing is left in the cache."""
