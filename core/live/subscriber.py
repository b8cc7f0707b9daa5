"""Subscribe to a vLLM server's KV cache events over ZMQ and keep its `CachedBlockTree` current.

Wire format (vLLM's `ZmqEventPublisher`): a PUB socket sends multipart `[topic, seq, payload]`, seq an 8-byte
big-endian counter starting at 0 and rising by one per batch, payload a msgpack batch (`decode_event_batch`).
A replay ROUTER (optional) answers a request carrying the first missing seq (8 bytes big-endian, after an empty
delimiter frame) with one `[seq, payload]` message per buffered batch from there on, then `[-1, b""]`.

`KVEventSubscriber.poll()` drains what arrived (no background thread: nothing runs between polls except ZMQ's
own receive buffer, bounded by its high-water mark). Sequence handling:
- seq = last + 1: applied.
- seq > last + 1 (a gap): with a replay endpoint, the missed batches are asked for and applied in order; what
  the replay cannot supply is counted in `stats.lost` and the tree may lack (or still hold) those blocks.
- a seq the subscriber already saw on the PUB socket again or lower: the publisher restarted (its counter is
  back at 0), so the tree is cleared (a restarted server's cache is empty) and rebuilt from there.
- a seq already applied from a replay but new on the PUB socket: a duplicate, skipped.
- with a replay endpoint, the first poll fetches the publisher's buffered history from seq 0 (and the first
  message does, if that found nothing), so the tree starts with what was cached before we subscribed, as far as
  the buffer reaches, even when the server is idle.
A message that is not `[topic, 8 bytes, payload]` or whose payload does not decode is counted and skipped: it
changes neither the tree nor what the subscriber believes about the publisher's sequence (a bad frame cannot
clear the tree by looking like a restart); only a bad frame that is exactly the next seq advances `last_seq`, so
it is not counted lost.

Addresses: each endpoint's host is resolved once when the subscriber is made, every address checked against
PAGED_LAB_LIVE_HOSTS (`resolve_checked`), and the socket connects to the checked IP (ZMQ's own reconnects then
reuse that IP, never the name).

Both ways (vLLM's rule, `ZmqEventPublisher._is_bind_endpoint` in vllm/distributed/kv_events.py): a vLLM whose
`endpoint` is a wildcard (`tcp://*:5557`) binds its PUB socket and the subscriber connects (the default); a vLLM
whose endpoint names a host (`tcp://127.0.0.1:5557`) *connects* its PUB socket to whoever binds there, so the
subscriber binds (`bind=True`; loopback addresses only: the lab never listens beyond this host). The replay
socket is always bound by vLLM, so the subscriber always connects to it.

A silent PUB socket: with a replay endpoint, a poll (SILENT_PROBE_S or more after the first, at most once per
SILENT_PROBE_S) while nothing at all has come on the PUB socket asks
the replay for what came after the last batch applied; batches it brings (`stats.replayed_while_silent`) keep
the tree current and mean the PUB socket is not reaching us (`pub_silent`): typically the subscriber connects
while vLLM connects too (its endpoint names a host), and should bind instead.
"""

import ipaddress
import time
from dataclasses import dataclass, field

import zmq

from core.errors import InvalidArgumentError, KVEventDecodeError, LabError, LiveEndpointError
from core.kv.events import KVEventBatch, decode_event_batch
from core.limits import Limits
from core.live.addresses import EventsEndpoint, endpoint_for_rank, resolve_checked
from core.live.tree import CachedBlockTree

DEFAULT_TOPIC = "kv-events"
END_SEQ = -1


@dataclass
class SubscriberStats:
    """Counts since the subscriber started. `gaps`: (first missing, last missing, recovered by replay)."""

    received: int = 0
    applied: int = 0
    duplicates: int = 0
    replayed: int = 0
    lost: int = 0
    restarts: int = 0
    bad_messages: int = 0
    last_seq: int | None = None
    last_ts: float | None = None  # the server's timestamp of the last batch applied
    gaps: list[tuple[int, int, bool]] = field(default_factory=list)
    last_error: str = ""
    replayed_while_silent: int = 0  # batches the replay brought while the PUB socket had delivered none


class KVEventSubscriber:
    """One server's (one data-parallel rank's) event stream and its tree. Close it when done.

    bind: bind the SUB socket on `endpoint` (a loopback address) for a vLLM that connects its PUB socket there,
    instead of connecting to a vLLM that binds. Raises InvalidArgumentError for a bind address that is not
    loopback, LiveEndpointError when the socket cannot be opened (e.g. the port is taken)."""

    RECEIVE_BUFFER = 100_000  # batches ZMQ holds for us between polls (the SUB socket's high-water mark)
    BIND_WAIT_S = 2.0  # seconds a binding subscriber waits for its address to be released (_bind_when_free)
    SILENT_PROBE_S = 2.0  # after the first poll, at most one replay probe for a silent PUB socket per this

    def __init__(
        self,
        endpoint: EventsEndpoint,
        *,
        topic: str = DEFAULT_TOPIC,
        replay_endpoint: EventsEndpoint | None = None,
        context: zmq.Context | None = None,
        replay_timeout_s: float = 1.0,
        bind: bool = False,
    ):
        self.endpoint = endpoint
        self.bind = bool(bind)
        self.topic = topic
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.tree = CachedBlockTree()
        self.stats = SubscriberStats()
        self._context = context or zmq.Context.instance()
        self._sub_high: int | None = None  # highest seq seen on the PUB socket
        self._caught_up = False
        self._replay: zmq.Socket | None = None
        self._pub_address = pinned_address(endpoint, "the KV events endpoint")
        self._replay_address = (
            pinned_address(replay_endpoint, "the replay endpoint") if replay_endpoint is not None else None
        )
        if self.bind:
            host = self._pub_address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
            if not ipaddress.ip_address(host).is_loopback:
                raise InvalidArgumentError(
                    f"a binding subscriber listens on a loopback address only (127.0.0.1, ::1), not {host}; "
                    "give this host's loopback address and point vLLM's endpoint at it"
                )
        self._next_probe: float | None = None  # when a poll may next ask the replay whether the PUB is silent
        try:
            self._sub = self._context.socket(zmq.SUB)
            self._sub.setsockopt(zmq.RCVHWM, self.RECEIVE_BUFFER)
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.setsockopt(zmq.IPV6, int(self._pub_address.startswith("tcp://[")))
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            if self.bind:
                self._bind_when_free()
            else:
                self._sub.connect(self._pub_address)
        except zmq.ZMQError as err:
            self._sub.close(linger=0)
            how = "listen for KV events on" if self.bind else "subscribe to"
            raise LiveEndpointError(f"cannot {how} {endpoint.address}: {err}", "network") from None

    def _bind_when_free(self) -> None:
        """Bind the SUB socket, waiting up to BIND_WAIT_S while the address is in use: a subscriber closed just
        before (the last page run's, or the last test's) releases its listening socket in ZeroMQ's I/O thread, a
        moment after `close` returns. Any other error, or the address still in use after that, is raised."""
        deadline = time.monotonic() + self.BIND_WAIT_S
        while True:
            try:
                self._sub.bind(self._pub_address)
                return
            except zmq.ZMQError as err:
                if err.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    # --- receiving -----------------------------------------------------------------------------------------
    def poll(self, timeout_s: float = 0.0, max_messages: int = 100_000) -> int:
        """Apply every message waiting (waiting up to `timeout_s` for the first); returns batches applied."""
        applied_before = self.stats.applied
        if not self._caught_up:
            self._caught_up = True
            if self.replay_endpoint is not None:
                self._replay_from(0, 2**63 - 1, catch_up=True)
        deadline = time.monotonic() + timeout_s
        for _ in range(max_messages):
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sub.poll(wait_ms if self.stats.applied == applied_before else 0):
                break
            self.on_message(self._sub.recv_multipart())
        now = time.monotonic()
        if self._next_probe is None:
            self._next_probe = now + self.SILENT_PROBE_S
        elif now >= self._next_probe and self.stats.received == 0 and self.replay_endpoint is not None:
            self._next_probe = now + self.SILENT_PROBE_S
            before = self.stats.applied
            last = self.stats.last_seq
            self._replay_from(0 if last is None else last + 1, 2**63 - 1, catch_up=True)
            self.stats.replayed_while_silent += self.stats.applied - before
        return self.stats.applied - applied_before

    @property
    def pub_silent(self) -> bool:
        """The replay brought batches the PUB socket never delivered, and it has delivered nothing at all: the
        events are published, but not to us (a vLLM whose endpoint names a host connects: bind instead)."""
        return self.stats.received == 0 and self.stats.replayed_while_silent > 0

    def on_message(self, frames: list[bytes]) -> None:
        """Handle one message as received on the PUB socket (`[topic, 8-byte seq, payload]`). Never raises for
        what the publisher sent: a bad message is counted in `stats.bad_messages` and leaves the tree as it was."""
        self.stats.received += 1
        if len(frames) != 3 or len(frames[1]) != 8:
            self._bad(f"a message of {len(frames)} frames, expected [topic, 8-byte seq, payload]")
            return
        seq = int.from_bytes(frames[1], "big")
        batch = self._decode(seq, frames[2])
        if batch is None:
            last = self.stats.last_seq
            if last is not None and seq == last + 1:  # skipped, not lost: it arrived
                self.stats.last_seq = self._sub_high = seq
            return
        if self._sub_high is not None and seq <= self._sub_high:
            self.stats.restarts += 1  # the publisher's counter went back: a new server process
            self.tree.clear()
            self.stats.last_seq = None
        self._sub_high = seq
        last = self.stats.last_seq
        if last is None and seq > 0 and self.replay_endpoint is not None:
            self._replay_from(0, seq - 1, catch_up=True)
        elif last is not None and seq <= last:
            self.stats.duplicates += 1
            return
        elif last is not None and seq > last + 1:
            self._gap(last + 1, seq - 1)
        if self.stats.last_seq is None or seq > self.stats.last_seq:
            self._apply_batch(seq, batch)

    def _gap(self, first: int, last: int) -> None:
        if self.replay_endpoint is not None:
            self._replay_from(first, last)
        recovered = self.stats.last_seq is not None and self.stats.last_seq >= last
        if not recovered:
            done = self.stats.last_seq if self.stats.last_seq is not None else first - 1
            self.stats.lost += last - max(done, first - 1)
        self.stats.gaps.append((first, last, recovered))

    def _decode(self, seq: int, payload: bytes) -> KVEventBatch | None:
        try:
            return decode_event_batch(payload)
        except KVEventDecodeError as err:
            self._bad(f"batch {seq}: {err}")
            return None

    def _apply(self, seq: int, payload: bytes) -> bool:
        batch = self._decode(seq, payload)
        if batch is None:
            self.stats.last_seq = seq  # skipped, not lost: it arrived
            return False
        self._apply_batch(seq, batch)
        return True

    def _apply_batch(self, seq: int, batch: KVEventBatch) -> None:
        self.tree.apply_batch(batch)
        self.stats.applied += 1
        self.stats.last_seq = seq
        self.stats.last_ts = batch.ts

    def _bad(self, message: str) -> None:
        self.stats.bad_messages += 1
        self.stats.last_error = message

    # --- replay --------------------------------------------------------------------------------------------
    def _replay_from(self, first: int, last: int, *, catch_up: bool = False) -> None:
        """Ask the replay socket for batches from `first` on and apply those that continue the stream, up to
        `last`. catch_up: a fresh subscriber filling in history, so a buffer that starts later is no loss."""
        try:
            frames_list = self._request_replay(first)
        except LiveEndpointError as err:
            self.stats.last_error = str(err)
            return
        for frames in frames_list:
            seq, payload = frames
            if seq > last:
                break
            current = self.stats.last_seq
            if current is not None and seq <= current:
                continue
            if current is not None and seq > current + 1 and not catch_up:
                self.stats.lost += seq - current - 1  # the publisher's buffer no longer holds these
            self._apply(seq, payload)
            self.stats.replayed += 1

    def _request_replay(self, first: int) -> list[tuple[int, bytes]]:
        """The `(seq, payload)` messages the replay socket sends for `first`, up to its end marker. Raises
        LiveEndpointError when it does not finish within `replay_timeout_s` (the socket is then replaced, so a
        late answer cannot be mistaken for the next one)."""
        if self._replay is None:
            self._replay = self._context.socket(zmq.DEALER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.setsockopt(zmq.IPV6, int(self._replay_address.startswith("tcp://[")))
            self._replay.connect(self._replay_address)
        self._replay.send_multipart([b"", first.to_bytes(8, "big")])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self.replay_timeout_s
        while (wait := deadline - time.monotonic()) > 0 and self._replay.poll(int(wait * 1000)):
            frames = self._replay.recv_multipart()
            while frames and frames[0] == b"":
                frames.pop(0)  # the delimiter a ROUTER puts before a REQ/DEALER reply
            if len(frames) < 2 or len(frames[-2]) != 8:
                continue
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq == END_SEQ or not frames[-1]:
                return out
            out.append((seq, frames[-1]))
        self._replay.close(linger=0)
        self._replay = None
        raise LiveEndpointError(
            f"the replay endpoint {self.replay_endpoint.address} did not finish answering within "
            f"{self.replay_timeout_s:g} s ({len(out):,} batches received)",
            "timeout",
        )

    def close(self) -> None:
        self._sub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
            self._replay = None


def subscribe_fleet(
    endpoint: EventsEndpoint,
    ranks: int,
    limits: Limits,
    *,
    replay_endpoint: EventsEndpoint | None = None,
    **options,
) -> list[KVEventSubscriber]:
    """One subscriber per data-parallel rank 0..ranks-1: rank r on the endpoint's (and replay endpoint's) port
    + r, as vLLM binds them (or connects to them: `bind=True`). `options`: KVEventSubscriber's keywords (topic,
    context, bind, replay_timeout_s). Every address is checked against PAGED_LAB_LIVE_HOSTS before any is
    opened."""
    pubs = [endpoint_for_rank(endpoint, r, limits) for r in range(ranks)]
    replays = [
        endpoint_for_rank(replay_endpoint, r, limits) if replay_endpoint else None for r in range(ranks)
    ]
    subscribers: list[KVEventSubscriber] = []
    try:
        for pub, replay in zip(pubs, replays, strict=True):
            subscribers.append(KVEventSubscriber(pub, replay_endpoint=replay, **options))
    except LabError:
        for s in subscribers:
            s.close()
        raise
    return subscribers


def pinned_address(endpoint: EventsEndpoint, what: str) -> str:
    """`tcp://IP:port` for `endpoint`: its host resolved once and checked (`resolve_checked`), the first IPv4
    address when there is one (ZMQ connects to one address), an IPv6 one in brackets. Raises as resolve_checked."""
    addresses = resolve_checked(endpoint.host, endpoint.port, endpoint.policy, what)
    address = next((a for a in addresses if ":" not in a), addresses[0])
    return f"tcp://[{address}]:{endpoint.port}" if ":" in address else f"tcp://{address}:{endpoint.port}"
