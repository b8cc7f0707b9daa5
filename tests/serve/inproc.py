"""`core.serve` run inside the test process: the same engine, loop and app `python -m core.serve` builds
(`build_served`, `build_app`), served by uvicorn in a thread on 127.0.0.1, so a test talks to it over real sockets
(real disconnects) and can still look inside the engine afterwards. The test stops it."""

import http.client
import json
import socket
import threading
import time

import uvicorn

from core.serve.app import build_app
from core.serve.launcher import free_port
from core.serve.server import ServeConfig, build_served


class InProcessServer:
    """`build_served(ServeConfig(model, **options))` served on 127.0.0.1:`port`; `served` holds the engine and
    its loop."""

    def __init__(self, model: str = "tiny", **options):
        self.served, self.publisher = build_served(ServeConfig(model, **options))
        self.engine, self.loop = self.served.engine, self.served.loop
        self.app = build_app(self.served)
        self.port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.loop.start()
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.02)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict | None = None,
        timeout: float = 120,
    ) -> tuple[int, dict, bytes]:
        """(status, headers, body) of one request on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def post(self, path: str, body) -> tuple[int, object]:
        """(status, parsed JSON) of a POST of `body` (bytes as they are, anything else as JSON)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, _, raw = self.request("POST", path, data, {"Content-Type": "application/json"})
        return status, json.loads(raw) if raw else None

    def connect(self) -> socket.socket:
        """A raw socket to the server, for clients that go away mid-request."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=60)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Until the engine has no unfinished request and the loop tracks none; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.engine.has_unfinished_requests() and not self.loop._requests:
                time.sleep(0.2)  # one more loop pass sets the gauges
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.loop.stop()
        if self.publisher is not None:
            self.publisher.close()
