"""A real vLLM (its CPU build, `core.serve.vllm_env`) started as a child process on loopback: `VLLMServer`.

    with VLLMServer(VLLMServeConfig(model_dir="/path/to/hf-folder")) as server:
        server.url, server.post("/v1/completions", {...})

`vllm serve` runs from the vLLM venv with the config's flags on a free 127.0.0.1 port (nothing listens beyond
loopback), its output in a log file; `start()` waits for `/health` and raises VLLMUnavailableError with the log's
end when it exits or does not answer in time; `stop()` ends its process group (vLLM's API server and engine core).
The KV cache is vLLM's CPU one, `VLLM_CPU_KVCACHE_SPACE` GiB, sized by vLLM itself unless `num_gpu_blocks_override`
is given. vLLM pins its OpenMP threads to cores unless told not to; on a shared machine `bind_threads=False` (the
default) leaves the scheduling to the kernel.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import VLLMUnavailableError
from core.serve.ports import free_port
from core.serve.vllm_env import find_vllm

__all__ = ["HOST", "START_TIMEOUT_S", "VLLMServeConfig", "VLLMServer", "free_port"]

HOST = "127.0.0.1"
# a line that starts an error report in vLLM's log: its logger's ERROR level, or a Python traceback
_ERROR_LINE = re.compile(r"\bERROR\b|^Traceback \(most recent call last\)")
START_TIMEOUT_S = 600  # the first start compiles the model (~1-4 minutes on 2 busy cores)


@dataclass(frozen=True)
class VLLMServeConfig:
    """What `vllm serve` is told. model_dir: a Hugging Face folder (`python -m core.engine.fetch
    smollm2-135m-instruct --hf DIR`); served_name: the model name requests use; block_size: a multiple of 32 (the
    CPU attention backend's); kv_cache_space_gib: VLLM_CPU_KVCACHE_SPACE; max_num_seqs / max_num_batched_tokens:
    the scheduler's limits (None: vLLM's defaults); threads: OMP_NUM_THREADS; nice: the niceness to start it at
    (a negative one needs root; where refused it runs as started, `VLLMServer.niceness` says which); kv_events:
    vLLM's --kv-events-config object (None: no events; an endpoint naming 127.0.0.1 makes vLLM connect there, so
    nothing it publishes listens beyond loopback); extra_args: more flags as given. The one place the lab writes a
    `vllm serve` command: the Live page's launcher, the benches and the tests' shared server all build it here."""

    model_dir: str
    served_name: str = "smollm2"
    block_size: int = 32
    dtype: str = "bfloat16"
    kv_cache_space_gib: int = 1
    max_model_len: int = 2048
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    threads: int = 2
    bind_threads: bool = False
    nice: int = 0
    kv_events: dict | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    def command(self, vllm: Path, port: int) -> list[str]:
        args = [
            str(vllm),
            "serve",
            self.model_dir,
            "--served-model-name",
            self.served_name,
            "--host",
            HOST,
            "--port",
            str(port),
            "--block-size",
            str(self.block_size),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
        ]
        args.append("--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching")
        for flag, value in (
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--num-gpu-blocks-override", self.num_gpu_blocks_override),
        ):
            if value is not None:
                args += [flag, str(value)]
        if self.kv_events is not None:
            args += ["--kv-events-config", json.dumps(self.kv_events)]
        return args + list(self.extra_args)

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_space_gib),
            "OMP_NUM_THREADS": str(self.threads),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
        }
        if not self.bind_threads:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        return env | self.extra_env


def _renice(nice: int):
    """A preexec function setting the child's niceness to `nice` where allowed (else leaving it as it is)."""

    def apply() -> None:
        with contextlib.suppress(OSError):
            os.nice(nice - os.nice(0))

    return apply if nice else None


class VLLMServer:
    """`vllm serve` of `config` on a free loopback port; `with VLLMServer(config) as server:` starts and stops it."""

    def __init__(self, config: VLLMServeConfig, log_path: str | Path | None = None) -> None:
        self.config = config
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = Path(log_path or tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "VLLMServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start it and wait for /health. Raises VLLMUnavailableError (vLLM not installed, exited, too slow)."""
        command = self.config.command(find_vllm().command, self.port)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.config.env(),
                start_new_session=True,
                preexec_fn=_renice(self.config.nice),
            )
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                status = self.process.poll()
                self.stop()
                raise VLLMUnavailableError(
                    f"vllm serve did not start (exit {status}, {timeout_s:.0f} s allowed); from "
                    f"{self.log_path}:\n{self.log_excerpt()}"
                )
            time.sleep(1)

    @property
    def niceness(self) -> int | None:
        """The server process's niceness (/proc), None when it is not running or unreadable."""
        if self.process is None:
            return None
        try:
            return int(Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, ValueError, IndexError):
            return None

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each process of the server's group has used so far, by its name in /proc
        (the API server, the engine core, the model worker; the same name summed); {} when not running."""
        if self.process is None:
            return {}
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                head, tail = stat.read_text().rsplit(")", 1)
            except OSError:
                continue  # the process ended while we read
            fields = tail.split()
            if int(fields[2]) != self.process.pid:  # the process group the server leads
                continue
            name = head.split("(", 1)[1]
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return out

    def log_tail(self, lines: int = 15) -> str:
        return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-lines:])

    def log_excerpt(self, lines: int = 15) -> str:
        """The log's first error, shortened to its first line and the exception it ends with (vLLM's engine core
        logs the root cause there, e.g. `ZMQError: Address already in use`; its API server says only "see root
        cause above" at the end), then the log's last `lines` lines."""
        text = self.log_path.read_text(errors="replace").splitlines(True)
        tail = text[-lines:]
        cause = first_error(text[: len(text) - len(tail)])  # before the tail: no line shown twice
        return "".join([*cause, "[...]\n", *tail] if cause else tail)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def get(self, path: str, timeout: float = 30) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return response.read()

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
        return json.loads(text) if text.strip() else {}

    def stop(self) -> None:
        """End the server's process group (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        if self.process is None:
            return
        process, self.process = self.process, None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # the engine core and anything else left in the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def first_error(lines: list[str], context: int = 2) -> list[str]:
    """The first error report in a vLLM log's `lines`: its first line, "..." and the last `context` + 1 lines of
    the report (the exception and what led to it). A report is a run of lines carrying the logger's ERROR level
    with the first one's prefix, or a bare Python traceback up to its exception line. [] when there is none."""
    first = next((i for i, line in enumerate(lines) if _ERROR_LINE.search(line)), None)
    if first is None:
        return []
    prefix = lines[first].split(" ERROR ")[0] + " ERROR " if " ERROR " in lines[first] else None
    end = first + 1
    while end < len(lines) and (
        lines[end].startswith(prefix) if prefix else lines[end].startswith((" ", "\t"))
    ):
        end += 1
    if prefix is None and end < len(lines):
        end += 1  # the exception line after a bare traceback's indented frames
    report = lines[first:end]
    if len(report) <= context + 2:
        return report
    return [report[0], "...\n", *report[-(context + 1) :]]
