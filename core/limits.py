"""Operator limits: the one configuration object a host sets to protect a shared demo server.

Every limit is read from an environment variable (or, in the app, a root-level `st.secrets` entry of the same
name, merged by `ui/jobs.py` `app_limits`), with safe defaults. `Limits` is frozen: it is read once per process
and shared as an immutable value. A bad value raises `LimitConfigError` naming the variable, what it was and what is
allowed; an unset or blank variable takes the default.

Variables (all integers unless marked):
- PAGED_LAB_MAX_BYTES: bytes one job's tensors may take (KV caches, benchmark buffers), default 4 GiB.
- PAGED_LAB_MAX_REQUESTS: requests one simulation may replay, default 10,000.
- PAGED_LAB_JOB_TIMEOUT_S (number): seconds of wall time one job may run before its worker is stopped, 120.
- PAGED_LAB_WORKERS: worker processes running heavy jobs, default max(1, min(4, CPU cores - 1)).
- PAGED_LAB_MAX_QUEUED_JOBS: jobs waiting for a worker, all sessions together, default 16; the queue grows
  past it with the people present (each holds at most one job), up to PAGED_LAB_MAX_SESSIONS.
- PAGED_LAB_MAX_SESSIONS: people whose heavy jobs may wait at once, default 100.
- PAGED_LAB_MAX_UPLOAD_BYTES: bytes of one uploaded file, default 25 MB (25,000,000).
- PAGED_LAB_CACHE_ENTRIES: finished job results kept, default 16 (a default simulation is ~20 MB).
- PAGED_LAB_CACHE_TTL_S (number): seconds a finished result stays cached, default 3,600.
- PAGED_LAB_MODEL_ROOT (an absolute directory path): the only directory the Engine page may load models from
  (it or any directory below it, after resolving `..` and symlinks). Unset or blank: any local directory, for
  one person running the lab on their own machine; a shared host sets it (the Docker image sets /models).
- PAGED_LAB_LIVE_HOSTS (a list): where the Live page may fetch metrics from and subscribe to KV events, since a
  server that fetches user-given URLs is a door into its own network (`core/hosts.py` has the whole policy).
  Unset or blank: only the ports a lab-started core.serve listens on at 127.0.0.1 (8000, 5557, 5558), the
  default everywhere (the app, `python -m hosting`, the Docker image); `off`: the Live page is turned off; else
  comma-separated entries: `*` (any public address), `host` or `host:port` (a name as written), an address
  (`10.0.0.5`, `[::1]:8000`) or a network (`10.0.0.0/8`). Private, loopback, link-local and other special
  addresses are refused unless an entry lists them, and the check is made on the address actually connected to,
  after DNS.
"""

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property

from core.errors import LimitConfigError, LimitExceededError
from core.hosts import DEFAULT_LIVE_HOSTS, HostPolicy

GiB = 1024**3


def _default_workers() -> int:
    return max(1, min(4, (os.cpu_count() or 1) - 1))


@dataclass(frozen=True)
class _Spec:
    variable: str
    kind: type  # int, float, str (an absolute directory path, blank for none) or list (of hosts, as a str)
    minimum: float  # numbers only
    maximum: float
    description: str
    unit: str


# field name -> how it is read; the order is the About page's order.
SPECS: dict[str, _Spec] = {
    "max_tensor_bytes": _Spec(
        "PAGED_LAB_MAX_BYTES", int, 1, 2**50, "Tensor bytes one job may allocate", "bytes"
    ),
    "max_simulated_requests": _Spec(
        "PAGED_LAB_MAX_REQUESTS", int, 1, 10**7, "Requests one simulation may replay", "requests"
    ),
    "job_timeout_s": _Spec(
        "PAGED_LAB_JOB_TIMEOUT_S", float, 0.1, 86_400, "Wall time one job may run", "seconds"
    ),
    "workers": _Spec("PAGED_LAB_WORKERS", int, 1, 64, "Worker processes for heavy jobs", "processes"),
    "max_queued_jobs": _Spec(
        "PAGED_LAB_MAX_QUEUED_JOBS", int, 1, 10_000, "Jobs waiting for a worker (all sessions)", "jobs"
    ),
    "max_sessions": _Spec(
        "PAGED_LAB_MAX_SESSIONS", int, 1, 100_000, "People whose heavy jobs may wait at once", "sessions"
    ),
    "max_upload_bytes": _Spec(
        "PAGED_LAB_MAX_UPLOAD_BYTES", int, 1, 2**40, "Bytes of one uploaded file", "bytes"
    ),
    "cache_entries": _Spec(
        "PAGED_LAB_CACHE_ENTRIES", int, 0, 100_000, "Finished job results kept in the cache", "results"
    ),
    "cache_ttl_s": _Spec(
        "PAGED_LAB_CACHE_TTL_S", float, 1, 30 * 86_400, "Time a finished result stays cached", "seconds"
    ),
    "model_root": _Spec(
        "PAGED_LAB_MODEL_ROOT", str, 0, 0, "Directory the Engine page may load models from", "path"
    ),
    "live_hosts": _Spec(
        "PAGED_LAB_LIVE_HOSTS", list, 0, 0, "Hosts the Live page may read metrics and events from", "hosts"
    ),
}
LIVE_OFF = "off"


@dataclass(frozen=True)
class Limits:
    """Operator limits of one server process. Field meanings and variables: see `SPECS` and the module doc."""

    max_tensor_bytes: int = 4 * GiB
    max_simulated_requests: int = 10_000
    job_timeout_s: float = 120.0
    workers: int = 1
    max_queued_jobs: int = 16
    max_upload_bytes: int = 25_000_000
    cache_entries: int = 16
    cache_ttl_s: float = 3_600.0
    max_sessions: int = 100  # after the others: positional construction keeps its meaning
    model_root: str = ""  # "": any directory
    live_hosts: str = ""  # "": the lab server's loopback ports; "off": the Live page is off; else entries

    def __post_init__(self) -> None:
        for name, spec in SPECS.items():
            _check(getattr(self, name), spec)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, object]) -> "Limits":
        """Limits from variables in `mapping` (e.g. `os.environ`, or `os.environ | secrets`); defaults for
        missing or blank ones. Raises LimitConfigError naming the first bad variable."""
        values: dict[str, object] = {"workers": _default_workers()}
        for name, spec in SPECS.items():
            raw = mapping.get(spec.variable)
            if raw is not None and str(raw).strip() != "":
                values[name] = _parse(raw, spec)
        return cls(**values)

    @classmethod
    def from_env(cls) -> "Limits":
        """Limits from this process's environment variables."""
        return cls.from_mapping(os.environ)

    def as_environ(self) -> dict[str, str]:
        """Every limit as its variable -> string, so a worker process reads exactly these limits."""
        return {
            SPECS[f.name].variable: value if isinstance(value := getattr(self, f.name), str) else repr(value)
            for f in fields(self)
        }

    def rows(self) -> list[dict[str, str]]:
        """One row per limit for display: limit, value (with thousands separators), variable."""
        return [
            {
                "limit": spec.description,
                "value": _format(getattr(self, name), spec),
                "variable": spec.variable,
            }
            for name, spec in SPECS.items()
        ]

    def check_requests(self, count: int, what: str = "the simulation") -> None:
        """Raise LimitExceededError when `count` simulated requests are over `max_simulated_requests`."""
        if count > self.max_simulated_requests:
            raise LimitExceededError(
                f"{what} has {count:,} requests, over this server's limit of {self.max_simulated_requests:,} "
                f"(PAGED_LAB_MAX_REQUESTS); use fewer requests",
                "PAGED_LAB_MAX_REQUESTS",
            )

    def check_rows_read(self, rows_read: int, where: str, what: str = "the trace") -> None:
        """Raise LimitExceededError once a file being read yields its `max_simulated_requests + 1`-th row.

        Called per row while reading, so a file of 10^6 rows is refused after parsing max + 1 of them, not after
        all; `where` names the row reached (e.g. "CSV row 10,002")."""
        if rows_read > self.max_simulated_requests:
            raise LimitExceededError(
                f"{what} has more than {self.max_simulated_requests:,} requests (reading stopped at {where}), over "
                f"this server's limit of {self.max_simulated_requests:,} (PAGED_LAB_MAX_REQUESTS); upload at most "
                f"{self.max_simulated_requests:,} rows",
                "PAGED_LAB_MAX_REQUESTS",
            )

    def check_upload(self, num_bytes: int, what: str = "the upload", *, at_least: bool = False) -> None:
        """Raise LimitExceededError when an uploaded file of `num_bytes` is over `max_upload_bytes`.

        at_least: `num_bytes` is only what was read so far (reading stopped past the limit), not the file's size."""
        if num_bytes > self.max_upload_bytes:
            size = f"more than {self.max_upload_bytes:,}" if at_least else f"{num_bytes:,}"
            raise LimitExceededError(
                f"{what} is {size} bytes, over this server's limit of {self.max_upload_bytes:,} bytes "
                f"(PAGED_LAB_MAX_UPLOAD_BYTES); upload a smaller file",
                "PAGED_LAB_MAX_UPLOAD_BYTES",
            )

    def check_model_directory(self, path: str) -> str:
        """The directory a model may be loaded from for the user-given `path`, checked before any file in it is
        opened. With no `model_root`: `path` stripped, unchanged (any directory). With one: a relative `path` is
        taken under the root; the result is `os.path.realpath` of it, so `..` and symlinks cannot leave the
        root, and it must be the root or a directory below it.

        Raises LimitExceededError naming PAGED_LAB_MODEL_ROOT for a path outside the root (the message never
        says whether that path exists), LimitConfigError when the root itself is not a directory here.
        Files inside an allowed directory are the operator's: symlinks among them are followed.
        """
        path = path.strip()
        if not self.model_root:
            return path
        root = self._resolved_model_root()
        try:
            resolved = os.path.realpath(os.path.join(root, path))
        except (ValueError, OSError):  # a NUL byte, a symlink loop
            resolved = None
        if resolved is None or os.path.commonpath([root, resolved]) != root:
            raise LimitExceededError(
                f"{path!r} is outside this server's model directory {self.model_root!r} (PAGED_LAB_MODEL_ROOT): "
                f"choose a model directory inside it, by name (e.g. 'llama') or as a path under it",
                "PAGED_LAB_MODEL_ROOT",
            )
        return resolved

    def model_directories(self) -> list[str]:
        """Names, sorted, of the model directories directly under `model_root`: those holding a config.json
        whose real path stays inside the root (so each passes `check_model_directory`). [] with no root, or
        when the root is missing or unreadable."""
        if not self.model_root or not os.path.isdir(self.model_root):
            return []
        root = self._resolved_model_root()
        try:
            names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        except OSError:
            return []
        inside = []
        for name in names:
            resolved = os.path.realpath(os.path.join(root, name))
            if os.path.commonpath([root, resolved]) == root and os.path.isfile(
                os.path.join(resolved, "config.json")
            ):
                inside.append(name)
        return inside

    @property
    def live_enabled(self) -> bool:
        """False when the operator turned the Live page off (PAGED_LAB_LIVE_HOSTS=off)."""
        return not self.live_policy.off

    @cached_property
    def live_policy(self) -> HostPolicy:
        """PAGED_LAB_LIVE_HOSTS parsed (`core/hosts.py`): where the Live page may connect."""
        return HostPolicy.parse(self.live_hosts)

    def check_live_address(self, host: str, port: int, what: str) -> None:
        """Raise LiveAddressRefusedError (a LimitExceededError naming PAGED_LAB_LIVE_HOSTS) unless the Live page may
        connect to `host`:`port` as written (`what` names the address in the message), before any DNS lookup:
        an address literal is checked whole; a name passes when an entry could allow what it resolves to, which
        `core.live.addresses.resolve_checked` then checks address by address."""
        self.live_policy.admit(host, port, what)

    def _resolved_model_root(self) -> str:
        root = os.path.realpath(self.model_root)
        if not os.path.isdir(root):
            raise LimitConfigError(
                f"PAGED_LAB_MODEL_ROOT={self.model_root!r} is not a directory on this server: the operator mounts "
                f"the model directories there (or unsets it to allow any local directory)",
                "PAGED_LAB_MODEL_ROOT",
            )
        return root


def read_limit(name: str, mapping: Mapping[str, object] | None = None):
    """One limit (a `Limits` field name) from `mapping` (default `os.environ`), without reading the others, so a
    bad value in an unrelated variable does not break a caller that needs only this one."""
    spec = SPECS[name]
    raw = (os.environ if mapping is None else mapping).get(spec.variable)
    if raw is None or str(raw).strip() == "":
        return _default_workers() if name == "workers" else getattr(Limits, name)
    return _parse(raw, spec)


def _parse(raw: object, spec: _Spec):
    if spec.kind in (str, list):
        return _check(str(raw).strip(), spec)
    text = str(raw).strip().replace("_", "")
    what = "an integer" if spec.kind is int else "a number"
    try:
        value = spec.kind(text) if spec.kind is float else int(text)
    except ValueError:
        if spec.kind is int:
            try:  # "4e9" or "1024.0": accept only when it is a whole number
                as_float = float(text)
            except ValueError:
                as_float = math.nan
            if math.isfinite(as_float) and as_float == int(as_float):
                return _check(int(as_float), spec)
        raise LimitConfigError(
            f"{spec.variable}={raw!r} is not {what} ({spec.unit})", spec.variable
        ) from None
    return _check(value, spec)


def _check(value, spec: _Spec):
    if spec.kind is list:
        return _check_hosts(value, spec)
    if spec.kind is str:
        if not isinstance(value, str) or (value and (not os.path.isabs(value) or "\0" in value)):
            raise LimitConfigError(
                f"{spec.variable} must be an absolute directory path (or blank for none), got {value!r}",
                spec.variable,
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LimitConfigError(f"{spec.variable} must be a finite number, got {value!r}", spec.variable)
    if spec.kind is int and not isinstance(value, int):
        raise LimitConfigError(f"{spec.variable} must be an integer, got {value!r}", spec.variable)
    if not spec.minimum <= value <= spec.maximum:
        raise LimitConfigError(
            f"{spec.variable} must be between {spec.minimum:,} and {spec.maximum:,} {spec.unit}, got {value:,}",
            spec.variable,
        )
    return value


def _check_hosts(value, spec: _Spec) -> str:
    if not isinstance(value, str):
        raise LimitConfigError(f"{spec.variable} must be text, got {value!r}", spec.variable)
    HostPolicy.parse(value)  # raises LimitConfigError naming the bad entry
    return value


# a unit in the singular, for a value of 1 ("1 process"); every other unit drops its plural s ("1 second")
SINGULAR_UNITS = {"processes": "process"}


def _format(value, spec: _Spec) -> str:
    if spec.kind is list:
        if not value:
            return f"not set: the lab server's loopback ports ({DEFAULT_LIVE_HOSTS})"
        return "off: the Live page is turned off" if value.lower() == LIVE_OFF else value
    if spec.kind is str:
        return value or "not set: any local directory"
    if spec.unit == "bytes":
        return f"{value:,} bytes ({value / GiB:,.2f} GiB)" if value >= GiB else f"{value:,} bytes"
    unit = spec.unit if value != 1 else SINGULAR_UNITS.get(spec.unit, spec.unit.removesuffix("s"))
    if spec.kind is float:
        return f"{value:,g} {unit}"
    return f"{value:,} {unit}"
