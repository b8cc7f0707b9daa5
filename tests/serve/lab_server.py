"""`core.serve` started for a test on free loopback ports (core.live.lab_server.LabServer) with a tiny HTTP client;
the test stops it."""

import json
import socket
import urllib.error
import urllib.request

from core.live.lab_server import LabServer

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerUnderTest(LabServer):
    def __init__(self, model: str = "tiny", *, num_blocks: int = 128, events: bool = True, extra_args=(),
                 startup_s: float = 120):  # fmt: skip
        super().__init__(model, (free_port(), free_port(), free_port()), num_blocks, events=events,
                         extra_args=extra_args)  # fmt: skip
        self.start(wait_s=startup_s)

    @property
    def events_port(self) -> int:
        return self.ports[1]

    @property
    def replay_port(self) -> int:
        return self.ports[2]

    def get(self, path: str) -> tuple[int, bytes]:
        with OPENER.open(self.url + path, timeout=10) as r:
            return r.status, r.read()

    def post(self, path: str, body, timeout: float = 120) -> tuple[int, object]:
        """(status, parsed JSON), or for a stream (status, [each `data:` payload parsed, "[DONE]"])."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with OPENER.open(request, timeout=timeout) as r:
                raw, status, kind = r.read(), r.status, r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            raw, status, kind = err.read(), err.code, err.headers.get("Content-Type", "")
        if "event-stream" in kind:
            lines = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
            return status, [json.loads(x) if x != "[DONE]" else x for x in lines]
        return status, json.loads(raw) if raw else None
