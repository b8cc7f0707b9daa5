"""One real vLLM (its CPU build) on loopback for the whole test run, shared by the pytest-xdist workers.

The first test that asks for it starts `vllm serve` on SmolLM2-135M-Instruct (the fetched GGUF written as a Hugging
Face folder) from `.venv-vllm` (`core.serve.vllm_env`), on free loopback ports, with block size 32 (the CPU
attention backend takes multiples of 32), 1 GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE=1`), prefix caching and KV
events. vLLM binds its PUB socket only for a wildcard endpoint and connects to any other, so the events endpoint
names 127.0.0.1: vLLM connects, and a test that wants the events binds a SUB socket there (nothing listens beyond
loopback); the replay endpoint (a ROUTER vLLM always binds) is on 127.0.0.1 too.

Started once per run: under pytest-xdist the workers share a state file in the run's base temporary directory, the
first one starts the server under a file lock and the others read its address; it is stopped after the last
real-vLLM test (`stop_after_last_test`, from conftest's `pytest_runtest_teardown`) where that one is known, else
by the run's controller at the end (`stop_shared_vllm`, from conftest's `pytest_sessionfinish`). Tests take the
server one at a time (`use_vllm`: an exclusive lock), each starting from an empty prefix cache
(`/reset_prefix_cache`, served with VLLM_SERVER_DEV_MODE=1), since hit counts and events depend on what the cache
held.

Outside CI a machine without vLLM skips these tests saying how to install it; under CI=true that fails them.
"""

import contextlib
import fcntl
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

STATE_FILE = "real-vllm.json"
START_LOCK = "real-vllm-start.lock"
USE_LOCK = "real-vllm-use.lock"
SERVED_NAME = "smollm2"
BLOCK_SIZE = 32
KV_CACHE_SPACE_GIB = 1
MAX_MODEL_LEN = 1024  # the longest prompt here is ~540 tokens
# vLLM's CPU backend sizes 1 GiB as 1,456 blocks of 32 tokens for bf16 SmolLM2; filling that takes ~80 s of prefill
# on 2 cores, so the server keeps 64 of them (`--num-gpu-blocks-override`: what it computed stays in its start log
# and in cache_config_info's kv_cache_memory_bytes; vLLM wants max_model_len in the 63 after its null block) and a
# test overflows it with ~9k tokens.
# `-O0`: no torch.compile. What these tests check (hashes, events, counters, blocks) does not depend on it, and
# compiling SmolLM2 took 43 of the server's 67 s start on 2 cores (vLLM 0.32's AOT cache fails to load back here:
# "'function' object has no attribute 'finalize_loading'", so it compiles on every start); eager decodes ~1.6x
# slower, prefills as fast.
EAGER = ("-O0",)
# The model runs in vLLM's engine-core process (`--distributed-executor-backend uni`, which its CPU platform takes
# only with VLLM_ENABLE_V1_MULTIPROCESSING=0; the API server and the engine core stay two processes): with its
# default multiprocessing executor a third process ran the model and, after every message, spun on the shared-memory
# queue for a second (`sched_yield`), ~77 s of a full run's samples beside ~127 s of model compute (py-spy), on
# the two cores the other worker shares. What the tests check (hashes, events, counters, blocks) does not depend on
# it; tests/vllm/ alone went from 200 s to 152 s, its start from 35 s to 25 s.
ONE_PROCESS = ("--distributed-executor-backend", "uni")
ONE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# One OpenMP thread, as the suite's workers and the servers they start have (tests/conftest.py): the other worker
# keeps a core busy all run long, so vLLM's second thread waited on a core that was not free at every barrier. On
# the shared 2-core machine under load, 8 output tokens took 6-10 s with 2 threads and 0.4-1.3 s with 1 (a 384-token
# prefill 3-4 s and 0.6-1.2 s), and tests/vllm/ summed 265 s against 188 s.
THREADS = 1
NUM_GPU_BLOCKS_OVERRIDE = 64
TOPIC = "kv-events"
# Set by the controller in each worker's `workerinput` (tests/conftest.py): the real-vLLM tests run as one unit
# on one worker (`--dist loadfile`; a worker's own `dist` option always reads "no").
ONE_WORKER_KEY = "real_vllm_tests_on_one_worker"
START_TIMEOUT_S = 600  # ~45 s on 2 quiet cores, minutes on busy ones


@dataclass(frozen=True)
class RealVLLM:
    """A running vLLM: its HTTP base URL, served model name and folder, cache settings, and KV-event endpoints
    (`events_endpoint`: vLLM connects, bind a SUB there; `replay_endpoint`: vLLM's ROUTER)."""

    url: str
    model: str
    model_dir: str
    block_size: int
    kv_cache_space_gib: int
    num_gpu_blocks_override: int
    max_model_len: int
    dtype: str  # vllm serve --dtype (`served_dtype`)
    events_endpoint: str
    replay_endpoint: str
    topic: str
    pid: int
    log_path: str

    def get(self, path: str, timeout: float = 30) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return response.read()

    def post(self, path: str, body: dict | None = None, timeout: float = 300) -> dict:
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
        return json.loads(text) if text.strip() else {}

    def complete(self, prompt: list[int] | str, max_tokens: int = 1, **extra) -> dict:
        """One /v1/completions request (greedy, `ignore_eos` so the length is what was asked)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        return self.post("/v1/completions", body | {"ignore_eos": True} | extra)

    def reset_prefix_cache(self) -> None:
        self.post("/reset_prefix_cache")


def _shared_dir(config) -> Path:
    """The run's base temporary directory: a worker's own is `<controller's>/gwN`, so its parent."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _unavailable(message: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def model_folder() -> Path:
    """SmolLM2 as a Hugging Face folder in the model cache (written once from the fetched GGUF)."""
    from core.engine.fetch import model_cache_dir
    from core.engine.hf_export import export_hf_folder
    from tests.real_model import real_model_path

    gguf = real_model_path()
    return export_hf_folder(gguf, model_cache_dir() / "SmolLM2-135M-Instruct-hf")


def served_dtype() -> str:
    """The --dtype the tests' vLLM serves SmolLM2 in: bfloat16 (what vLLM picks for its config, --dtype auto) on a
    CPU that computes bf16 natively (avx512_bf16 or amx_bf16; Arm's bf16), else float32, which the lab then plans
    by being told it (the Live page's served dtype). Where bf16 is emulated a bf16 matmul took 84x a float32 one
    (docs/development.md) and the vLLM tests were most of the suite's time. PAGED_LAB_TEST_VLLM_DTYPE overrides."""
    from core.kernels.cpu_isa import cpu_features

    forced = os.environ.get("PAGED_LAB_TEST_VLLM_DTYPE")
    if forced:
        return forced
    return "bfloat16" if cpu_features() & {"avx512_bf16", "amx_bf16", "bf16"} else "float32"


def _start(shared: Path) -> RealVLLM:
    from core.errors import VLLMUnavailableError
    from core.serve.vllm_env import find_vllm
    from core.serve.vllm_server import VLLMServeConfig, VLLMServer, free_port

    try:
        find_vllm()
    except VLLMUnavailableError as err:
        _unavailable(str(err))
    folder = model_folder()
    events, replay = free_port(), free_port()
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{events}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        "topic": TOPIC,
    }
    dtype = served_dtype()
    config = VLLMServeConfig(
        model_dir=str(folder),
        served_name=SERVED_NAME,
        dtype=dtype,
        block_size=BLOCK_SIZE,
        kv_cache_space_gib=KV_CACHE_SPACE_GIB,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks_override=NUM_GPU_BLOCKS_OVERRIDE,
        threads=THREADS,
        kv_events=kv_events,
        extra_args=EAGER + ONE_PROCESS,
        extra_env={"VLLM_SERVER_DEV_MODE": "1"} | ONE_PROCESS_ENV,  # dev mode: /reset_prefix_cache
    )
    process = VLLMServer(config, log_path=shared / "real-vllm.log")
    try:
        process.start(timeout_s=START_TIMEOUT_S)
    except VLLMUnavailableError as err:
        pytest.fail(str(err))
    return RealVLLM(
        url=process.url,
        model=SERVED_NAME,
        model_dir=str(folder),
        block_size=BLOCK_SIZE,
        kv_cache_space_gib=KV_CACHE_SPACE_GIB,
        num_gpu_blocks_override=NUM_GPU_BLOCKS_OVERRIDE,
        max_model_len=MAX_MODEL_LEN,
        dtype=dtype,
        events_endpoint=kv_events["endpoint"],
        replay_endpoint=kv_events["replay_endpoint"],
        topic=TOPIC,
        pid=process.process.pid,
        log_path=str(process.log_path),
    )


def _kill(pid: int) -> None:
    """SIGTERM to the server's process group, SIGKILL after 10 s. A server this process started is reaped as it
    exits: unreaped, it stays in its group as a zombie and the wait ran its whole 10 s (a worker's stop)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
        for _ in range(100):
            _reap(pid)
            os.killpg(pid, 0)
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not this process's child: its parent reaps it
        os.waitpid(pid, os.WNOHANG)


def shared_vllm(config) -> RealVLLM:
    """The run's vLLM, started by the first caller of any worker (under a file lock)."""
    shared = _shared_dir(config)
    state = shared / STATE_FILE
    with open(shared / START_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if state.exists():
                server = RealVLLM(**json.loads(state.read_text()))
                if _healthy(server.url):
                    return server
                pytest.fail(f"the run's vLLM (pid {server.pid}) stopped answering; see {server.log_path}")
            server = _start(shared)
            state.write_text(json.dumps(asdict(server)))
            return server
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def use_vllm(config) -> Iterator[RealVLLM]:
    """The run's vLLM for one test alone (other workers' vLLM tests wait), its prefix cache emptied first."""
    server = shared_vllm(config)
    with open(_shared_dir(config) / USE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            server.reset_prefix_cache()
            yield server
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stop_shared_vllm(config, *, from_worker: bool = False) -> None:
    """Stop the run's vLLM if this run started one: at the session's end (the controller's, or the single
    process's; a worker's call does nothing unless `from_worker`, see `stop_after_last_test`)."""
    if hasattr(config, "workerinput") and not from_worker:
        return
    state = _shared_dir(config) / STATE_FILE
    with open(_shared_dir(config) / START_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if state.exists():
                _kill(json.loads(state.read_text())["pid"])
                state.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stop_after_last_test(config, tests: str, nodeid: str, next_nodeid: str | None) -> None:
    """After test `nodeid`, stop the run's vLLM when it was the last of `tests` (the folder of every test that
    uses it) and no other process can still ask for it: in one process, or under `--dist loadfile`, where the
    folder is one unit on one worker (tests/conftest.py's scheduler). It idled at ~2 % of a core for the other
    ~11 minutes of a full run, holding ~1.7 GB. A later test that asks for it again would start it again."""
    if not nodeid.startswith(tests) or (next_nodeid or "").startswith(tests):
        return
    if hasattr(config, "workerinput") and not config.workerinput.get(ONE_WORKER_KEY, False):
        return
    stop_shared_vllm(config, from_worker=True)
