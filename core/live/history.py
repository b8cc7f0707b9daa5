"""Scrapes of a fleet over time: the series the Live page draws, per server and for the fleet.

`LiveHistory.record(t, scrapes)` takes one poll: source label -> `VllmMetrics` (or None when that source failed
this time). The fleet's figures at that poll are `combine_metrics` of the sources that answered. At most
`max_polls` polls are kept (the oldest dropped).

Window figures compare a poll with the one before it for the same source: hit rate of the window =
(hits now - hits then) / (queries now - queries then); a histogram window = now.minus(then). A counter that went
down (the server restarted) makes that window the whole new scrape.
"""

from collections import deque
from dataclasses import dataclass

import pandas as pd

from core.live.histogram import Histogram
from core.live.metrics import VllmMetrics, combine_metrics

FLEET = "fleet"


@dataclass(frozen=True)
class Poll:
    t: float  # seconds (any clock; the page uses time since it began watching)
    scrapes: dict[str, VllmMetrics | None]
    fleet: VllmMetrics | None


class LiveHistory:
    def __init__(self, max_polls: int = 720):
        self.polls: deque[Poll] = deque(maxlen=max_polls)

    def record(self, t: float, scrapes: dict[str, VllmMetrics | None]) -> Poll:
        answered = [m for m in scrapes.values() if m is not None]
        poll = Poll(t, dict(scrapes), combine_metrics(answered) if answered else None)
        self.polls.append(poll)
        return poll

    def sources(self) -> list[str]:
        """Source labels in the order first seen."""
        return list(dict.fromkeys(s for p in self.polls for s in p.scrapes))

    def latest(self, source: str = FLEET) -> VllmMetrics | None:
        """The last answer of `source` (FLEET: the fleet's last combined figures)."""
        for poll in reversed(self.polls):
            m = poll.fleet if source == FLEET else poll.scrapes.get(source)
            if m is not None:
                return m
        return None

    def _series(self, source: str) -> list[tuple[float, VllmMetrics]]:
        out = []
        for poll in self.polls:
            m = poll.fleet if source == FLEET else poll.scrapes.get(source)
            if m is not None:
                out.append((poll.t, m))
        return out

    def frame(self) -> pd.DataFrame:
        """One row per (poll, source) that answered, the fleet included (source FLEET) when there are several
        sources: t, source, kv_cache_usage, running, waiting, preemptions, hit_rate (overall), window_hit_rate
        (None for a source's first poll or a window without queries)."""
        sources = self.sources()
        names = [*sources, FLEET] if len(sources) > 1 else sources
        rows = []
        for source in names:
            previous: VllmMetrics | None = None
            for t, m in self._series(source):
                rows.append(
                    {
                        "t": t,
                        "source": source,
                        "kv_cache_usage": m.kv_cache_usage,
                        "running": m.num_requests_running,
                        "waiting": m.num_requests_waiting,
                        "preemptions": m.num_preemptions,
                        "hit_rate": m.prefix_cache_hit_rate,
                        "window_hit_rate": window_hit_rate(previous, m),
                    }
                )
                previous = m
        columns = ["t", "source", "kv_cache_usage", "running", "waiting", "preemptions", "hit_rate"]
        return pd.DataFrame(rows, columns=[*columns, "window_hit_rate"])

    def latency_window(self, source: str, field: str, polls_back: int = 1) -> Histogram | None:
        """The `field` histogram ("ttft", "itl", "e2e") of `source` over its last `polls_back` polls."""
        series = self._series(source)
        if not series or getattr(series[-1][1], field) is None:
            return None
        now = getattr(series[-1][1], field)
        if len(series) <= polls_back or getattr(series[-1 - polls_back][1], field) is None:
            return now
        return now.minus(getattr(series[-1 - polls_back][1], field))


def window_hit_rate(before: VllmMetrics | None, after: VllmMetrics) -> float | None:
    """Prefix-cache hits / queries between two scrapes of one source (None without both counters or without
    queries in between). After a restart (queries went down) the window is the new scrape's totals."""
    if before is None or None in (before.prefix_cache_queries, before.prefix_cache_hits):
        return None
    if after.prefix_cache_queries is None or after.prefix_cache_hits is None:
        return None
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    if queries < 0 or hits < 0:
        queries, hits = after.prefix_cache_queries, after.prefix_cache_hits
    return hits / queries if queries > 0 else None
