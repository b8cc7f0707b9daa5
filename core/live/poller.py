"""One poll of a fleet's metrics URLs, concurrently, every failure kept as its typed error (never raised), so one
unreachable replica does not hide the others."""

from concurrent.futures import ThreadPoolExecutor

from core.errors import LabError
from core.live.addresses import MetricsUrl
from core.live.fetch import fetch_metrics_text
from core.live.metrics import VllmMetrics, parse_vllm_metrics

MAX_SOURCES = 16


def source_label(url: MetricsUrl, urls: list[MetricsUrl]) -> str:
    """A short name for a source: host:port, or the whole URL when two sources share a host:port."""
    short = f"{url.host}:{url.port}"
    return url.url if sum(f"{u.host}:{u.port}" == short for u in urls) > 1 else short


def poll_metrics(urls: list[MetricsUrl], timeout_s: float = 3.0) -> dict[str, VllmMetrics | LabError]:
    """label -> the parsed scrape, or the LabError (LiveEndpointError, MetricsFormatError) that stopped it.
    All URLs are fetched at once, so a poll takes the slowest one's time, at most about `timeout_s`."""
    if not urls:
        return {}

    def one(url: MetricsUrl) -> VllmMetrics | LabError:
        try:
            return parse_vllm_metrics(fetch_metrics_text(url, timeout_s))
        except LabError as err:
            return err

    with ThreadPoolExecutor(max_workers=min(len(urls), MAX_SOURCES)) as pool:
        results = list(pool.map(one, urls))
    return {source_label(u, urls): r for u, r in zip(urls, results, strict=True)}
