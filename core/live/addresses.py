"""User-given live addresses, checked before any connection: metrics URLs (http/https only) and KV-event
endpoints (ZMQ `tcp://host:port` only), each against the operator's PAGED_LAB_LIVE_HOSTS (`core/hosts.py`).

Two checks. `check_metrics_url` / `check_events_endpoint` parse what the user typed and check the host as written
(no DNS): a refused address is reported at once. `resolve_checked`, called by whoever connects, right before it
connects, looks the name up once, checks every address it gave, and returns them: the caller connects to one of
exactly those addresses (never to the name again, so DNS cannot answer differently the second time).

A data-parallel vLLM publishes rank r's events on the endpoint's port + r (`endpoint_for_rank`).
"""

import re
import socket
import urllib.parse
from dataclasses import dataclass

from core.errors import InvalidArgumentError, LiveEndpointError
from core.hosts import HostPolicy, parse_ip
from core.limits import Limits

MAX_ADDRESS_LENGTH = 500
_TCP = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?):(\d{1,5})$")


@dataclass(frozen=True)
class MetricsUrl:
    url: str  # as given, stripped
    host: str  # as written (an IPv6 host in brackets), lower case
    port: int
    policy: HostPolicy  # what it may resolve to, checked again when it is fetched


@dataclass(frozen=True)
class EventsEndpoint:
    host: str
    port: int
    policy: HostPolicy

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"


def check_metrics_url(url: str, limits: Limits) -> MetricsUrl:
    """The checked URL. Raises InvalidArgumentError for anything but an http(s) URL with a host (no user:password
    part), LimitExceededError when PAGED_LAB_LIVE_HOSTS does not allow its host."""
    text = (url or "").strip()
    if len(text) > MAX_ADDRESS_LENGTH:
        raise InvalidArgumentError(f"the metrics URL is longer than {MAX_ADDRESS_LENGTH} characters")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as err:
        raise InvalidArgumentError(f"{text!r} is not a URL ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError(
            f"{text!r} is not an http:// or https:// URL with a host; the Live page reads a server's metrics "
            "over HTTP, e.g. http://127.0.0.1:8000/metrics"
        )
    if parts.username is not None or any(c.isspace() for c in text):
        raise InvalidArgumentError(f"{text!r}: a metrics URL may not carry user:password@ or spaces")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname.lower()
    port = port if port is not None else (443 if parts.scheme == "https" else 80)
    limits.check_live_address(host, port, "the metrics URL's host")
    return MetricsUrl(text, host, port, limits.live_policy)


def check_events_endpoint(endpoint: str, limits: Limits) -> EventsEndpoint:
    """The checked endpoint. Raises InvalidArgumentError for anything but `tcp://host:port` (port 1-65,535; no
    `*`, which binds rather than connects), LimitExceededError when PAGED_LAB_LIVE_HOSTS does not allow it."""
    text = (endpoint or "").strip()
    match = _TCP.match(text) if len(text) <= MAX_ADDRESS_LENGTH else None
    if match is None or not 1 <= int(match.group(2)) <= 65_535:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise InvalidArgumentError(
            f"{shown!r} is not a ZMQ tcp://host:port endpoint (port 1-65,535), e.g. tcp://127.0.0.1:5557"
        )
    host, port = match.group(1).lower(), int(match.group(2))
    limits.check_live_address(host, port, "the KV events endpoint")
    return EventsEndpoint(host, port, limits.live_policy)


def endpoint_for_rank(endpoint: EventsEndpoint, rank: int, limits: Limits) -> EventsEndpoint:
    """Where data-parallel rank `rank` publishes: the same host, port + rank (vLLM's convention), checked
    against PAGED_LAB_LIVE_HOSTS like the base endpoint."""
    if rank < 0 or endpoint.port + rank > 65_535:
        raise InvalidArgumentError(f"rank {rank} puts the port past 65,535 (base port {endpoint.port:,})")
    ranked = EventsEndpoint(endpoint.host, endpoint.port + rank, limits.live_policy)
    limits.check_live_address(ranked.host, ranked.port, f"rank {rank}'s KV events endpoint")
    return ranked


def resolve_checked(host: str, port: int, policy: HostPolicy, what: str) -> list[str]:
    """The IP addresses `host` resolves to, looked up once, every one allowed by `policy` for `port` (an address
    literal is its own answer). Connect to one of these, never to `host` again. Raises LiveAddressRefusedError
    when the host as written or any address it resolves to is not allowed (a name that answers with one allowed
    and one refused address is refused), LiveEndpointError (failure "unresolvable") when it has no address."""
    policy.admit(host, port, what)
    literal = parse_ip(host)
    if literal is not None:
        return [str(literal)]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as err:
        reason = (
            "the name does not resolve"
            if isinstance(err, socket.gaierror)
            else "the name cannot be looked up"
        )
        raise LiveEndpointError(f"{what} {host}:{port}: unresolvable: {reason}", "unresolvable") from None
    addresses = list(dict.fromkeys(str(parse_ip(info[4][0])) for info in infos))
    if not addresses:
        raise LiveEndpointError(f"{what} {host}:{port}: unresolvable: no address", "unresolvable")
    for address in addresses:
        policy.permit(host, address, port, what)
    return addresses
