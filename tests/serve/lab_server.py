"""Start `python -m core.serve` on 127.0.0.1 for a test and stop it after; plus a tiny HTTP client (urllib)."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabServer:
    def __init__(self, *args: str, events: bool = True, startup_s: float = 120):
        self.port = free_port()
        self.events_port, self.replay_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "core.serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        if events:
            config = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv-events",
                      "endpoint": f"tcp://*:{self.events_port}", "replay_endpoint": f"tcp://*:{self.replay_port}"}  # fmt: skip
            cmd += ["--kv-events-config", json.dumps(config)]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="core-serve-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"core.serve exited: {self.output()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"core.serve did not answer /health in {startup_s} s: {self.output()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def get(self, path: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return r.status, r.read()

    def post(self, path: str, body, timeout: float = 120) -> tuple[int, object]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                raw = r.read()
                status = r.status
                kind = r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            raw, status, kind = err.read(), err.code, err.headers.get("Content-Type", "")
        if "event-stream" in kind:
            lines = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
            return status, [json.loads(x) if x != "[DONE]" else x for x in lines]
        return status, json.loads(raw) if raw else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.log.close()
        os.unlink(self.log.name)
