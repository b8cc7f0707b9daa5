"""Fetch a metrics body over HTTP, bounded: one GET, no redirects (a redirect could leave the allowed hosts), no
proxy, a timeout and a size cap. Every failure is a LiveEndpointError naming the URL and what went wrong."""

import http.client
import urllib.error
import urllib.request

from core.errors import LiveEndpointError
from core.live.addresses import MetricsUrl

MAX_METRICS_BYTES = 16 * 1024 * 1024  # a large vLLM fleet's /metrics is a few hundred kB


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} not followed", headers, fp)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def fetch_metrics_text(url: MetricsUrl, timeout_s: float = 3.0, max_bytes: int = MAX_METRICS_BYTES) -> str:
    """The body at `url` as text (UTF-8, undecodable bytes replaced). Raises LiveEndpointError when the server
    refuses, cannot be reached, times out, answers an HTTP error status or redirect, or sends over `max_bytes`."""
    request = urllib.request.Request(
        url.url, headers={"Accept": "text/plain", "User-Agent": "paged-attention-lab"}
    )
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            body = response.read(max_bytes + 1)
    except urllib.error.HTTPError as err:
        raise LiveEndpointError(f"{url.url} answered HTTP {err.code} ({err.reason})") from None
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, TimeoutError):
            raise LiveEndpointError(f"{url.url} did not answer within {timeout_s:g} s") from None
        raise LiveEndpointError(f"{url.url} cannot be reached: {reason}") from None
    except TimeoutError:
        raise LiveEndpointError(f"{url.url} did not answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException, ValueError) as err:
        raise LiveEndpointError(f"{url.url} failed: {type(err).__name__}: {err}") from None
    if len(body) > max_bytes:
        raise LiveEndpointError(
            f"{url.url} sent more than {max_bytes:,} bytes; a /metrics body is far smaller"
        )
    return body.decode("utf-8", errors="replace")
