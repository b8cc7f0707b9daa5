"""A KV-event publisher written the way vLLM's wire format is documented (not core/live's code): an XPUB (a PUB
that also reports subscriptions, so tests publish only once a subscriber is listening) sending
`[topic, 8-byte big-endian seq, payload]`, and a ROUTER replaying buffered batches to `[id, b"", seq]` requests
with `[id, b"", seq, payload]` messages and a `[id, b"", -1, b""]` end marker. Binds 127.0.0.1 only."""

import threading

import zmq

from core.kv.events import encode_event_batch


class FakeVllmPublisher:
    def __init__(self, topic: str = "kv-events", replay: bool = True, port: int | None = None):
        self.context = zmq.Context()
        self.topic = topic.encode()
        self.pub = self.context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{port or '*'}")  # a given port: another rank's (endpoint port + rank)
        self.endpoint = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.replay_requests: list[int] = []
        self._stop = threading.Event()
        self.replay_endpoint = None
        if replay:
            self.router = self.context.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def wait_subscribed(self, timeout_ms: int = 5000) -> None:
        assert self.pub.poll(timeout_ms), "no subscriber joined"
        assert self.pub.recv()[0] == 1  # a subscribe message: b"\x01" + topic

    def publish(self, events, *, send: bool = True, ts: float = 0.0, seq: int | None = None) -> int:
        """Encode, buffer for replay and (unless send=False, a batch the network 'lost') send one batch."""
        seq = self.next_seq if seq is None else seq
        self.next_seq = seq + 1
        payload = encode_event_batch(events, ts)
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, empty, start = self.router.recv_multipart()
            assert empty == b""
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self._stop.set()
        if self.replay_endpoint:
            self._thread.join(5)
            self.router.close(0)
        self.pub.close(0)
        self.context.term()
