"""The "cpu" backend: a small C kernel that reads K/V blocks in place through the block table (no gathered copy).

The C source (`paged_rows.c` beside this module) is compiled at first use with the system C compiler (`$CC`, else cc, gcc or clang) into a shared
library cached under `$XDG_CACHE_HOME/paged_attention_lab/` (default `~/.cache/paged_attention_lab/`), named by a
hash of the source, the compiler, its flags and the CPU model, and called through ctypes with the tensors' data
pointers and strides. No torch C++ headers, no ninja: one build takes about a second. Where no compiler works,
`cpu_kernel_available()` is False, `cpu_kernel_error()` says why, and the backend is not offered.

What the kernel does, for one work item = (sequence s, a range of KV heads):
    q rows of the range, scaled, in float32;  m = -inf, l = 0, acc = 0            [rows, head_dim] float32
    for each block b of the table up to the last position any row may see (never further):
        for each KV head h of the range:   (K/V rows of (b, h) are read once for all the group's query rows)
            scores = q_r . K[b, :, h]      for the block's tokens t <= row_pos[r] only (slots past are not read)
            online softmax (the paper's equation 4): m' = max(m, max scores); acc = acc * e^(m - m') + sum_t
            e^(s_t - m') V[b, t, h];  l = l * e^(m - m') + sum_t e^(s_t - m')
    out = acc / l  (0 for a row that may see no position)
Work items run in parallel with OpenMP (torch's own libgomp when torch is loaded first, so one thread pool); with
few sequences the KV heads of a sequence are split over several items so both cores have work. bfloat16 and
float16 are converted to float32 as they are loaded; the softmax and accumulation are float32; the kernel writes
float32 and the caller converts to the query's dtype. When a block is started, the next block's rows of the item's
heads are prefetched in address order (block ids are random, so the hardware prefetcher cannot guess the jump).
With head_dim a multiple of 16, the inner loops are register tiles written with GCC/clang vector extensions
(4 query rows x 4 tokens for q.K, 4 rows x 64 dims for P.V, a vectorised exp); other head_dims take a plain
loop. -ffp-contract=fast lets the compiler fuse multiply-adds (ISO C mode would forbid it).
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from core.common import cdiv
from core.errors import BackendUnavailableError

SOURCE_PATH = Path(__file__).with_name("paged_rows.c")
C_SOURCE = SOURCE_PATH.read_text()

BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-std=gnu11", "-ffp-contract=fast")
NATIVE_FLAGS = ("-march=native",)  # the library is built and used on the same machine
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
ENV_COMPILER = "PAGED_LAB_CC"  # compiler to use; "none" disables the backend

_lock = threading.Lock()
_state: dict = {}


def cache_dir() -> Path:
    """Where built libraries are kept: $XDG_CACHE_HOME/paged_attention_lab (default ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "paged_attention_lab"


def _find_compiler() -> str | None:
    choice = os.environ.get(ENV_COMPILER)
    if choice is not None:
        return None if choice.lower() in ("", "none") else shutil.which(choice)
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(compiler: str) -> Path:
    """Compile C_SOURCE (once per source/compiler/flags/CPU) and return the cached library's path.

    Tries -march=native first, then without it. When both fail, every attempt's command, exit status and full
    compiler output are written to a `.log` beside where the library would be, and the RuntimeError names it."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    errors = []
    for flags in (BASE_FLAGS + NATIVE_FLAGS, BASE_FLAGS):
        key = "\n".join([C_SOURCE, compiler, version, " ".join(flags), platform.machine(), _cpu_model()])
        target = cache_dir() / f"paged_rows_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "paged_rows.c"
            src.write_text(C_SOURCE)
            built = Path(tmp) / target.name
            proc = subprocess.run(
                [compiler, *flags, str(src), "-o", str(built), "-lm"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode == 0:
                os.replace(built, target)  # atomic: concurrent builders leave one complete file
                return target
            errors.append(
                f"$ {compiler} {' '.join(flags)} paged_rows.c -o {target.name} -lm\n"
                f"exit status {proc.returncode}\n{proc.stdout}{proc.stderr}"
            )
    log = target.with_suffix(".log")
    log.write_text("\n\n".join(errors))
    last_line = next((line for line in reversed(errors[-1].strip().splitlines()) if line.strip()), "")
    raise RuntimeError(f"{last_line.strip()[:300]} (the compiler's full log is in {log})")


def _load():
    """The loaded library, or raise BackendUnavailableError with the reason (cached either way)."""
    with _lock:
        if "lib" not in _state and "error" not in _state:
            compiler = _find_compiler()
            if compiler is None:
                _state["error"] = (
                    f"no C compiler found (tried ${ENV_COMPILER}, $CC, cc, gcc, clang); the 'cpu' backend "
                    "compiles a small C kernel at first use"
                )
            else:
                try:
                    lib = ctypes.CDLL(str(_build(compiler)))
                    fn = lib.paged_rows
                    i64, ptr = ctypes.c_int64, ctypes.c_void_p
                    fn.argtypes = (
                        [ptr, i64, i64, i64] + [ptr, i64, i64, i64] * 2 + [ptr, i64, ptr, ptr]
                        + [i64] * 5 + [ctypes.c_float, ctypes.c_int, ctypes.c_int, i64]
                    )  # fmt: skip
                    fn.restype = ctypes.c_int
                    _state["lib"] = lib
                except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                    _state["error"] = f"building the C kernel with {compiler} failed: {error}"
        if "error" in _state:
            raise BackendUnavailableError(f"backend 'cpu' is unavailable: {_state['error']}")
        return _state["lib"]


def cpu_kernel_available() -> bool:
    """True when the C kernel is built (building it now if needed) and loads."""
    try:
        _load()
    except BackendUnavailableError:
        return False
    return True


def cpu_kernel_error() -> str | None:
    """Why the C kernel is unavailable, or None when it is available."""
    try:
        _load()
    except BackendUnavailableError as error:
        return str(error)
    return None


def head_split(num_seqs: int, num_kv_heads: int, threads: int) -> int:
    """Work items per sequence (each a range of KV heads): enough items for ~4 per thread, at most one per head."""
    return max(1, min(num_kv_heads, cdiv(4 * threads, num_seqs)))


def cpu_paged_rows(
    rows: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    row_pos: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The "cpu" backend: rows [S, KV, R, D] attend to positions 0..row_pos[s, r] of their sequence (-1: none,
    output 0), K/V read in place from the caches [num_blocks, block_size, KV, D] through block_tables.

    Arguments are validated by the caller (core.kernels.attention): CPU tensors, stride 1 in D, block ids in use in range.
    `lens` is not needed (row_pos < lens). Only table entries up to the block of max(row_pos[s]) are read.
    Returns [S, KV, R, D] in rows' dtype, written into `out` (same shape, contiguous) when given.
    """
    fn = _load().paged_rows
    num_seqs, num_kv_heads, num_rows, head_dim = rows.shape
    if rows.dtype not in DTYPE_CODES or rows.device.type != "cpu":
        raise BackendUnavailableError(
            f"backend 'cpu' needs CPU float32/bfloat16/float16 tensors, got {rows.dtype} on {rows.device}"
        )
    table = block_tables.to(torch.int64).contiguous()  # [S, max_blocks]
    pos = row_pos.to(torch.int64).contiguous()  # [S, R]
    direct = out is not None and out.dtype == torch.float32
    result = out if direct else torch.empty(rows.shape, dtype=torch.float32)
    threads = torch.get_num_threads()
    status = fn(
        rows.data_ptr(), *rows.stride()[:3],
        key_cache.data_ptr(), *key_cache.stride()[:3],
        value_cache.data_ptr(), *value_cache.stride()[:3],
        table.data_ptr(), table.stride(0), pos.data_ptr(), result.data_ptr(),
        num_seqs, num_kv_heads, num_rows, head_dim, key_cache.shape[1], float(scale),
        DTYPE_CODES[rows.dtype], threads, head_split(num_seqs, num_kv_heads, threads),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("the C paged-attention kernel could not allocate its scratch memory")
    if direct:
        return out
    if out is not None:
        return out.copy_(result)
    return result.to(rows.dtype)
