"""What one viewer of the Live page watches: a fleet's metrics URLs and KV-event endpoints, polled on demand.

`LiveWatch` owns the history of scrapes and one event subscriber per data-parallel rank. Nothing runs between
`poll()` calls except ZMQ's receive buffer, so a watch nobody polls costs no work. Changing the sources
(`configure` with different ones) starts a new history and closes the old sockets.
"""

import contextlib
import time
from dataclasses import dataclass, field

from core.errors import LabError
from core.limits import Limits
from core.live.addresses import EventsEndpoint, MetricsUrl
from core.live.history import LiveHistory
from core.live.poller import poll_metrics
from core.live.subscriber import DEFAULT_TOPIC, KVEventSubscriber, subscribe_fleet


@dataclass(frozen=True)
class Sources:
    urls: tuple[MetricsUrl, ...] = ()
    events: EventsEndpoint | None = None
    replay: EventsEndpoint | None = None
    ranks: int = 1
    topic: str = DEFAULT_TOPIC
    bind: bool = False  # bind the SUB sockets (a vLLM whose endpoint names this host connects to them)


@dataclass
class PollResult:
    t: float  # seconds since the watch began
    errors: dict[str, str] = field(default_factory=dict)  # source -> what went wrong this poll
    events_error: str = ""
    batches_applied: int = 0


class LiveWatch:
    def __init__(self, max_polls: int = 720):
        self.sources = Sources()
        self.history = LiveHistory(max_polls)
        self.subscribers: list[KVEventSubscriber] = []
        self.started = time.monotonic()
        self._events_error = ""
        self._max_polls = max_polls

    def configure(self, sources: Sources, limits: Limits) -> None:
        """Watch `sources` (already checked against `limits`); the same sources keep their history and sockets."""
        if sources == self.sources:
            return
        self.close()
        self.sources = sources
        self.history = LiveHistory(self._max_polls)
        self.started = time.monotonic()
        self._events_error = ""
        if sources.events is not None:
            try:
                self.subscribers = subscribe_fleet(
                    sources.events,
                    sources.ranks,
                    limits,
                    topic=sources.topic,
                    replay_endpoint=sources.replay,
                    bind=sources.bind,
                )
            except LabError as err:
                self._events_error = str(err)

    def poll(self, timeout_s: float = 3.0) -> PollResult:
        """Scrape every metrics URL (at once) and apply every waiting event batch; failures are reported in the
        result, never raised."""
        t = time.monotonic() - self.started
        results = poll_metrics(list(self.sources.urls), timeout_s)
        scrapes = {label: r if not isinstance(r, LabError) else None for label, r in results.items()}
        if scrapes:
            self.history.record(t, scrapes)
        result = PollResult(t, {label: str(r) for label, r in results.items() if isinstance(r, LabError)})
        result.events_error = self._events_error
        for sub in self.subscribers:
            result.batches_applied += sub.poll(0.0)
        return result

    @property
    def pub_silent(self) -> bool:
        """Some rank's replay brought batches while its PUB socket delivered none (`KVEventSubscriber.pub_silent`)."""
        return any(sub.pub_silent for sub in self.subscribers)

    def close(self) -> None:
        for sub in self.subscribers:
            sub.close()
        self.subscribers = []

    def __del__(self):  # a session that ends drops its watch: release the sockets
        with contextlib.suppress(Exception):
            self.close()
