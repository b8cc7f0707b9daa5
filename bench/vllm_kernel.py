"""vLLM's CPU paged-attention kernel as a baseline for the lab's: the same decode problem timed on both, paired
round by round.

vLLM cannot be imported into the project's environment (its own pins), so its kernel runs in a child process in
vLLM's interpreter (`bench/vllm_kernel_worker.py` under `core.serve.vllm_env.find_vllm().python`), fed the
problem the lab measures through a file: the same query, K and V values, dtype, heads and context lengths. vLLM's
CPU backend takes blocks of a multiple of 32 tokens, so its cache uses blocks of 32 where the lab's uses the
config's (16 by default); each hands its blocks out in a random order. What is timed on vLLM's side is the call
vLLM makes per layer (`torch.ops._C.cpu_attention_with_kv_cache`), its scheduler metadata built once beforehand as
vLLM builds it once per step; the worker times the call itself, so the pipe between the processes is not counted.
Rounds alternate (lab, vLLM, lab, vLLM, ...) so background load hits both alike; ratio = the median over rounds
of lab_ms / vllm_ms in the same round.
"""

import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from core.errors import VLLMUnavailableError
from core.kernels.attention import contiguous_attention, paged_attention
from core.kernels.timer import LoadMonitor, apply_timing_settings, spread
from core.kernels.timing import KernelConfig, _quartiles, make_problem, tolerance
from core.serve.vllm_env import find_vllm

WORKER = Path(__file__).resolve().parent / "vllm_kernel_worker.py"
VLLM_BLOCK_SIZE = (
    32  # vLLM's CPU attention backend: MultipleOf(32) (cpu_attn.py, get_supported_kernel_block_sizes)
)
VLLM_DTYPES = ("float32", "bfloat16", "float16")  # CPUAttentionBackend.supported_dtypes
START_TIMEOUT_S = 300


class VLLMKernel:
    """vLLM's CPU attention kernel in a child process of vLLM's interpreter; `with VLLMKernel(threads) as k:`."""

    def __init__(self, threads: int) -> None:
        self.python = find_vllm().python
        self.threads = threads
        self.info: dict = {}

    def __enter__(self) -> "VLLMKernel":
        self.process = subprocess.Popen(
            [str(self.python), str(WORKER), str(self.threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={"OMP_NUM_THREADS": str(self.threads), "VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"},
        )
        self.info = self._reply(None)
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _reply(self, command: str | None) -> dict:
        if command is not None:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise VLLMUnavailableError(
                f"vLLM's kernel worker exited (status {self.process.poll()}) on {command or 'start'!r}"
            )
        reply = json.loads(line)
        if "error" in reply:
            raise VLLMUnavailableError(f"vLLM's kernel worker refused {command!r}: {reply['error']}")
        return reply

    def load(self, problem: dict[str, torch.Tensor], directory: Path) -> dict:
        """Hand over a decode problem (query, key, value, context_lens as `make_problem` returns them)."""
        path = directory / "problem.pt"
        keys = ("query", "key", "value", "context_lens")
        torch.save({**{k: problem[k] for k in keys}, "block_size": VLLM_BLOCK_SIZE}, path)
        reply = self._reply(f"load {path}")
        path.unlink()
        return reply

    def run(self) -> float:
        """One call of vLLM's kernel: its wall time in ms, measured in the worker."""
        return float(self._reply("run")["ms"])

    def output(self, directory: Path) -> torch.Tensor:
        path = directory / "output.pt"
        self._reply(f"output {path}")
        out = torch.load(path)
        path.unlink()
        return out


def compare(
    config: KernelConfig, kernel: VLLMKernel, backend: str = "cpu", repeats: int = 11, warmup: int = 3
) -> dict:
    """The lab's `backend` against vLLM's kernel on `config` (a CPU problem), paired by round.

    Returns batch, context_len, dtype, backend; lab_ms and vllm_ms with quartiles; ratio (lab over vLLM, the median
    of the per-round ratios) with quartiles; vllm_isa (the ISA hint vLLM's backend picks here); vllm_block_size;
    max_abs_err of each against contiguous attention on the same K/V (`lab_max_abs_err`, `vllm_max_abs_err`) and
    `tolerance`; repeats and the machine's load (other_cores, load_avg, busy)."""
    apply_timing_settings()
    p = make_problem(config, "cpu")
    paged_args = (p["query"], p["key_cache"], p["value_cache"], p["block_tables"], p["context_lens"])
    with tempfile.TemporaryDirectory(prefix="vllm-kernel-") as tmp:
        ready = kernel.load(p, Path(tmp))
        lab, vllm = [], []
        with LoadMonitor() as monitor:
            for round_index in range(warmup + repeats):
                began = time.perf_counter()
                got = paged_attention(*paged_args, backend=backend)
                lab_ms = (time.perf_counter() - began) * 1e3
                vllm_ms = kernel.run()
                if round_index >= warmup:
                    lab.append(lab_ms)
                    vllm.append(vllm_ms)
        theirs = kernel.output(Path(tmp))
    reference = contiguous_attention(p["query"], p["key"], p["value"], p["context_lens"]).float()
    load = monitor.load
    return {
        "batch": config.batch,
        "context_len": config.context_len,
        "dtype": config.dtype,
        "backend": backend,
        **_quartiles("lab_ms", spread(lab)),
        **_quartiles("vllm_ms", spread(vllm)),
        **_quartiles("ratio", spread([a / b for a, b in zip(lab, vllm, strict=True)])),
        "vllm_isa": ready["isa"],
        "vllm_block_size": VLLM_BLOCK_SIZE,
        "lab_block_size": config.block_size,
        "lab_max_abs_err": (got.float() - reference).abs().max().item(),
        "vllm_max_abs_err": (theirs.float() - reference).abs().max().item(),
        "tolerance": tolerance(config.dtype),
        "repeats": repeats,
        "other_cores": None if load.other_cores is None else round(load.other_cores, 3),
        "load_avg": round(load.load_avg, 2),
        "busy": load.busy,
    }
