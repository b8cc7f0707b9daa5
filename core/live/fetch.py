"""Fetch a metrics body over HTTP(S), bounded and pinned: the host is resolved once and every address it gave is
checked against PAGED_LAB_LIVE_HOSTS (`resolve_checked`), then the connection goes to exactly a checked address
(the socket is opened to the IP; the Host header, TLS SNI and the certificate check use the name). One GET, no
redirects (a redirect could leave the allowed hosts), no proxy, one deadline for the whole exchange, a size cap.
`post_json` makes the same pinned exchange as a JSON POST (the Live page's /tokenize and /detokenize).

Every failure is a LiveEndpointError whose `failure` names its class (core/errors.py `LIVE_FAILURES`) and whose
message names the URL and the class, never anything of what answered (no status reason, no header, no body),
so the page cannot be used to read a service it was not meant to read.
"""

import errno
import http.client
import json
import socket
import ssl
import time
import urllib.parse

from core.errors import LiveEndpointError
from core.live.addresses import MetricsUrl, resolve_checked

MAX_METRICS_BYTES = 16 * 1024 * 1024  # a large vLLM fleet's /metrics is a few hundred kB
MAX_JSON_BYTES = 4 * 1024 * 1024  # a /tokenize answer of a long prompt
_CHUNK = 64 * 1024


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to `host` (the Host header) whose socket goes to the already checked `address`."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    """The same over TLS: SNI and the certificate's name are the URL's host, the socket goes to `address`."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, address, timeout)
        self._context = ssl.create_default_context()

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)


def fetch_metrics_text(url: MetricsUrl, timeout_s: float = 3.0, max_bytes: int = MAX_METRICS_BYTES) -> str:
    """The body at `url` as text (see `_fetch`)."""
    return _fetch(url, timeout_s, max_bytes, None)


def post_json(
    url: MetricsUrl, body: object, timeout_s: float = 3.0, max_bytes: int = MAX_JSON_BYTES
) -> object:
    """POST `body` as JSON to `url` (same checks and failures as `fetch_metrics_text`; a 4xx answer is an
    "http-status" failure, its body unread) and parse the answer as JSON ("not-http" when it is not)."""
    text = _fetch(url, timeout_s, max_bytes, json.dumps(body).encode())
    try:
        return json.loads(text)
    except ValueError:
        raise LiveEndpointError(f"{url.url}: the answer is not JSON", "not-http") from None


def _fetch(url: MetricsUrl, timeout_s: float, max_bytes: int, body: bytes | None) -> str:
    """The body at `url` as text (UTF-8, undecodable bytes replaced). Raises LiveAddressRefusedError when the host
    or an address it resolves to is not allowed, LiveEndpointError when it cannot be resolved, refuses, cannot be
    reached, does not answer within `timeout_s` in all, does not speak HTTP, answers an error status or a redirect,
    or sends over `max_bytes`. Each checked address is tried in turn while connections are refused."""
    addresses = resolve_checked(url.host, url.port, url.policy, "the metrics URL's host")
    deadline = time.monotonic() + timeout_s
    refused: LiveEndpointError | None = None
    for address in addresses:
        try:
            return _fetch_from(url, address, deadline, timeout_s, max_bytes, body)
        except LiveEndpointError as err:
            if err.failure not in ("refused", "unreachable") or time.monotonic() >= deadline:
                raise
            refused = err
    raise refused


def _fetch_from(
    url: MetricsUrl, address: str, deadline: float, timeout_s: float, max_bytes: int, body: bytes | None
) -> str:
    parts = urllib.parse.urlsplit(url.url)
    kind = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = kind(parts.hostname, url.port, address, timeout=max(0.01, deadline - time.monotonic()))
    try:
        headers = {"Accept": "text/plain", "Accept-Encoding": "identity", "User-Agent": "paged-attention-lab"}
        if body is not None:
            headers.update({"Accept": "application/json", "Content-Type": "application/json"})
        conn.request("GET" if body is None else "POST", path, body=body, headers=headers)
        response = conn.getresponse()
        if 300 <= response.status < 400:
            raise LiveEndpointError(
                f"{url.url}: redirect (HTTP {response.status}) not followed: a redirect could leave the allowed "
                "hosts; give the final URL",
                "redirect",
            )
        if response.status != 200:
            raise LiveEndpointError(f"{url.url}: HTTP {response.status} (an error status)", "http-status")
        answer = bytearray()
        while len(answer) <= max_bytes:
            # each read also times out, so a server dripping bytes is cut off within about 2 x timeout_s
            if time.monotonic() > deadline:
                raise TimeoutError
            chunk = response.read(_CHUNK)
            if not chunk:
                break
            answer += chunk
        if len(answer) > max_bytes:
            raise LiveEndpointError(
                f"{url.url}: too large: more than {max_bytes:,} bytes",
                "too-large",
            )
        return answer.decode("utf-8", errors="replace")
    except LiveEndpointError:
        raise
    except Exception as err:  # every socket, TLS and protocol failure: its class, never what answered
        failure, words = _classify(err)
        shown = f"{url.url}: {words}"
        if failure == "timeout":
            shown = f"{url.url}: timeout: no complete answer within {timeout_s:g} s"
        raise LiveEndpointError(shown, failure) from None
    finally:
        conn.close()


def _classify(err: BaseException) -> tuple[str, str]:
    """(failure class, the words for it) of an exception raised while talking to a server."""
    if isinstance(err, TimeoutError | socket.timeout):
        return "timeout", "timeout"
    if isinstance(err, ssl.SSLCertVerificationError):
        return "tls", "TLS failed: the server's certificate is not trusted for this name"
    if isinstance(err, ssl.SSLError):
        return "tls", "TLS handshake failed"
    if isinstance(err, http.client.IncompleteRead):
        return "reset", "connection closed before the answer was complete"
    if isinstance(err, http.client.HTTPException):
        return "not-http", "not an HTTP answer (is this the right port?)"
    if isinstance(err, ConnectionRefusedError):
        return "refused", "connection refused (nothing listens there)"
    if isinstance(err, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
        return "reset", "connection reset before the answer was complete"
    if isinstance(err, OSError) and err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable", "host unreachable (no route)"
    if isinstance(err, OSError):
        name = errno.errorcode.get(err.errno, "") if err.errno else ""
        return "network", f"network error{f' ({name})' if name else ''}"
    return "not-http", f"not a readable HTTP answer ({type(err).__name__})"
