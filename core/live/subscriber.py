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
"""

import time
from dataclasses import dataclass, field

import zmq

from core.errors import KVEventDecodeError, LabError, LiveEndpointError
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


class KVEventSubscriber:
    """One server's (one data-parallel rank's) event stream and its tree. Close it when done."""

    def __init__(
        self,
        endpoint: EventsEndpoint,
        *,
        topic: str = DEFAULT_TOPIC,
        replay_endpoint: EventsEndpoint | None = None,
        context: zmq.Context | None = None,
        replay_timeout_s: float = 1.0,
        receive_buffer: int = 100_000,
    ):
        self.endpoint = endpoint
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
        try:
            self._sub = self._context.socket(zmq.SUB)
            self._sub.setsockopt(zmq.RCVHWM, receive_buffer)
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.setsockopt(zmq.IPV6, int(self._pub_address.startswith("tcp://[")))
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            self._sub.connect(self._pub_address)
        except zmq.ZMQError as err:
            raise LiveEndpointError(f"cannot subscribe to {endpoint.address}: {err}", "network") from None

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
        return self.stats.applied - applied_before

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
    topic: str = DEFAULT_TOPIC,
    replay_endpoint: EventsEndpoint | None = None,
    context: zmq.Context | None = None,
) -> list[KVEventSubscriber]:
    """One subscriber per data-parallel rank 0..ranks-1: rank r on the endpoint's (and replay endpoint's) port
    + r, as vLLM binds them. Every address is checked against PAGED_LAB_LIVE_HOSTS before any is opened."""
    pubs = [endpoint_for_rank(endpoint, r, limits) for r in range(ranks)]
    replays = [
        endpoint_for_rank(replay_endpoint, r, limits) if replay_endpoint else None for r in range(ranks)
    ]
    subscribers: list[KVEventSubscriber] = []
    try:
        for pub, replay in zip(pubs, replays, strict=True):
            subscribers.append(KVEventSubscriber(pub, topic=topic, replay_endpoint=replay, context=context))
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
