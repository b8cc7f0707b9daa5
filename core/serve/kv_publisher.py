"""KV cache events of `core.serve` on ZMQ, framed as vLLM's `ZmqEventPublisher` frames them.

`ZmqEventPublisher`: a PUB socket (bound to `endpoint`, or with `bind=False` connected to it: the consumer binds,
as for a vLLM whose endpoint names a host) sending `[topic, seq (8 bytes big-endian, from 0), payload]` (payload:
`encode_event_batch`), and an optional replay ROUTER answering a request `[id, b"", start seq]` (a REQ or DEALER
client; `[id, start seq]` is accepted too) with `[id, b"", seq, payload]` for every buffered batch from there
and `[id, b"", -1, b""]`. One thread owns both sockets; `publish` only enqueues, so the engine loop never blocks.
The events themselves come from the engine's block pool (`BlockManager.take_events`, core/kv/block_pool.py).
"""

import queue
import threading
import time
from collections import deque

import zmq

from core.errors import InvalidArgumentError
from core.kv.events import KVEvent, encode_event_batch

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ZmqEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        bind: bool = True,
    ):
        self.topic = topic.encode()
        self._context = zmq.Context()
        self._queue: queue.Queue = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._stop = threading.Event()
        self.published = 0
        try:
            self._pub = self._context.socket(zmq.PUB)
            self._pub.setsockopt(zmq.SNDHWM, hwm)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.setsockopt(zmq.IPV6, int(endpoint.startswith("tcp://[")))
            if bind:
                self._pub.bind(endpoint)
                self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode()
            else:
                self._pub.connect(endpoint)  # ZMQ reconnects until the consumer's socket is there
                self.endpoint = endpoint
            self.binds = bool(bind)
            self._replay = None
            self.replay_endpoint = None
            if replay_endpoint:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
                self.replay_endpoint = self._replay.getsockopt(zmq.LAST_ENDPOINT).decode()
        except zmq.ZMQError as err:
            self._context.destroy(linger=0)
            raise InvalidArgumentError(
                f"cannot open the KV events sockets ({endpoint}, {replay_endpoint}): {err}"
            ) from None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[KVEvent], ts: float | None = None) -> None:
        """Queue one batch (nothing for an empty list)."""
        if events:
            self._queue.put((time.time() if ts is None else ts, list(events)))

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set() or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                ts, events = self._queue.get(timeout=0.02)
            except queue.Empty:
                continue
            payload = encode_event_batch(events, ts)
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
            self._buffer.append((seq, payload))
            self.published += 1
            seq += 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) == 3 and frames[1] == b"":
            client, start = frames[0], frames[2]
        elif len(frames) == 2:
            client, start = frames
        else:
            return  # not a replay request
        if len(start) != 8:
            return
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
        self._replay.send_multipart([client, b"", END_SEQ, b""])

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued, then close the sockets."""
        self._stop.set()
        self._thread.join(timeout_s)
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)
        self._context.term()
