"""The "cpu" backend: a small C kernel that reads K/V blocks in place through the block table (no gathered copy).

The C source (`paged_rows.c` beside this module, its vector helpers in `paged_rows_simd.h`) is compiled at first
use with the system C compiler (`$CC`, else cc, gcc or clang) into a shared library cached under `$XDG_CACHE_HOME/paged_attention_lab/` (default `~/.cache/paged_attention_lab/`), named by a
hash of the sources, the compiler, its flags and the CPU model and features, and called through ctypes with the tensors' data
pointers and strides. No torch C++ headers, no ninja: one build takes about a second. Where no compiler works,
`cpu_kernel_available()` is False, `cpu_kernel_error()` says why, and the backend is not offered.

What the kernel does, for one work item = (sequence s, a range of KV heads):
    q rows of the range, scaled, in float32;  m = -inf, l = 0, acc = 0            [heads, rows, D] float32
    for each block b of the table up to the last position any row may see (never further), in one pass over it:
        scores = q_r . K[b, t, h] for every head h of the range and the block's tokens t <= row_pos[r] only
            (K/V rows of (b, h) are read once for all the group's query rows; slots past are not read)
        online softmax (the paper's equation 4), per row: m' = max(m, max scores); acc = acc * e^(m - m') +
            sum_t e^(s_t - m') V[b, t, h];  l = l * e^(m - m') + sum_t e^(s_t - m')
    out = acc / l  (0 for a row that may see no position)
The block is read in the order it lies in memory (the cache is [blocks, tokens, KV heads, D]): q.K a few tokens at a
time for every head of the range, then the next tokens; P.V the same way. One (block, head)'s rows are a head's
stride apart (4 KiB in float32 for 8 heads of 128), so head by head the reads jump a page at every row; token by
token they run through the block front to back, as the hardware prefetcher follows.
Work items run in parallel with OpenMP (torch's own libgomp when torch is loaded first, so one thread pool); with
few sequences the KV heads of a sequence are split over several items so both cores have work. bfloat16 and
float16 are converted to float32 as they are loaded; the softmax and accumulation are float32; the kernel writes
float32, or bfloat16 for bfloat16 queries (rounded to nearest even in the kernel, as torch rounds: a separate
conversion would be one more OpenMP region, which costs most on a machine whose cores are shared); the caller
converts float16. While one block is computed, the next block's K/V rows of the item's heads are prefetched into
L2 (`prefetcht1`), a few rows between tiles (block ids are random, so the hardware prefetcher cannot guess the
jump; a whole block at once stalled the core instead). Prefetching into L1 (`prefetcht0`, before 2026-12-06) made
the fp32 kernel ~1.5x slower on one core (33 ms against 21 ms; vLLM's kernel 29-30 ms): docs/kernels-isa.md.
With head_dim a multiple of the vector width, the inner loops are register tiles written with GCC/clang vector
extensions, sized for the ISA the compiler targets (`core.kernels.cpu_isa`, `PAGED_LAB_CPU_ISA`): on AVX-512 4
query rows x 4 tokens for q.K and 4 rows x 64 dims for P.V, on AVX2 4 x 2 and 4 rows x 16 dims (16 registers),
plus a vectorised exp; bfloat16 rows are widened to float32 in registers as they are loaded. Other head_dims
take a plain loop. -ffp-contract=fast lets the compiler fuse multiply-adds (ISO C mode would forbid it).
One library is built and loaded per ISA asked for, so builds for several ISAs can run in one process.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from core.common import cdiv
from core.errors import BackendUnavailableError
from core.kernels.cpu_isa import FLAG_SETS, cache_key, isa_problem, selected_isa

SOURCE_PATH = Path(__file__).with_name("paged_rows.c")
HEADER_PATH = Path(__file__).with_name("paged_rows_simd.h")  # included by paged_rows.c
C_SOURCE = SOURCE_PATH.read_text()
C_HEADER = HEADER_PATH.read_text()

BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-std=gnu11", "-ffp-contract=fast")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
ENV_COMPILER = "PAGED_LAB_CC"  # compiler to use; "none" disables the backend
FULL_WINDOW = 1 << 62  # the kernel's window for full attention: longer than any sequence

_lock = threading.Lock()
_state: dict[str, dict] = {}  # per ISA asked for: {"lib", "info"} or {"error"}


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


def _compiler_version(compiler: str) -> str:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout


def _build(compiler: str, isa: str = "native") -> tuple[Path, tuple[str, ...]]:
    """Compile C_SOURCE for `isa` (once per source/compiler/flags/CPU); return the cached library and its flags.

    Tries the ISA's flag sets in order (`cpu_isa.FLAG_SETS`; for native, -march=native then none). When all fail,
    every attempt's command, exit status and full compiler output are written to a `.log` beside where the
    library would be, and the RuntimeError names it."""
    version = _compiler_version(compiler)
    errors = []
    for isa_flags in FLAG_SETS[isa]:
        flags = BASE_FLAGS + isa_flags
        key = "\n".join([C_SOURCE, C_HEADER, compiler, version, " ".join(flags), cache_key()])
        target = cache_dir() / f"paged_rows_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
        if target.exists():
            return target, flags
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / SOURCE_PATH.name
            src.write_text(C_SOURCE)
            (Path(tmp) / HEADER_PATH.name).write_text(C_HEADER)
            built = Path(tmp) / target.name
            proc = subprocess.run(
                [compiler, *flags, str(src), "-o", str(built), "-lm"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode == 0:
                os.replace(built, target)  # atomic: concurrent builders leave one complete file
                return target, flags
            errors.append(
                f"$ {compiler} {' '.join(flags)} paged_rows.c -o {target.name} -lm\n"
                f"exit status {proc.returncode}\n{proc.stdout}{proc.stderr}"
            )
    log = target.with_suffix(".log")
    log.write_text("\n\n".join(errors))
    last_line = next((line for line in reversed(errors[-1].strip().splitlines()) if line.strip()), "")
    raise RuntimeError(f"{last_line.strip()[:300]} (the compiler's full log is in {log})")


def _open(path: Path, compiler: str, isa: str, flags: tuple[str, ...]) -> dict:
    """Load a built library; return {"lib", "info"} with what the library says it was built for."""
    lib = ctypes.CDLL(str(path))
    fn = lib.paged_rows_out
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = (
        [ptr, i64, i64, i64]
        + [ptr, i64, i64, i64] * 2
        + [ptr, i64, ptr, ptr, ctypes.c_int]
        + [i64] * 5
        + [ctypes.c_float, ctypes.c_int, ctypes.c_int, i64, i64]
    )
    fn.restype = ctypes.c_int
    lib.paged_rows_isa.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    lib.paged_rows_isa.restype = ctypes.c_char_p
    tiles = (ctypes.c_int64 * 4)()
    built_for = lib.paged_rows_isa(tiles).decode()
    info = {
        "requested": isa,
        "isa": built_for,
        "vector_floats": tiles[0],
        "rows_per_tile": tiles[1],
        "qk_tokens_per_tile": tiles[2],
        "pv_vectors_per_tile": tiles[3],
        "flags": list(flags),
        "compiler": _compiler_version(compiler).splitlines()[0].strip(),
        "library": path.name,
    }
    return {"lib": lib, "info": info}


def _load(isa: str | None = None) -> dict:
    """{"lib", "info"} of the library built for `isa` (default: `selected_isa()`), or raise
    BackendUnavailableError with the reason (cached per ISA either way)."""
    isa = selected_isa() if isa is None else isa
    with _lock:
        if isa not in _state:
            compiler = _find_compiler()
            problem = isa_problem(isa)
            if problem is not None:
                _state[isa] = {"error": problem}
            elif compiler is None:
                _state[isa] = {
                    "error": f"no C compiler found (tried ${ENV_COMPILER}, $CC, cc, gcc, clang); the 'cpu' "
                    "backend compiles a small C kernel at first use"
                }
            else:
                try:
                    path, flags = _build(compiler, isa)
                    _state[isa] = _open(path, compiler, isa, flags)
                except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as error:
                    _state[isa] = {"error": f"building the C kernel with {compiler} failed: {error}"}
        if "error" in _state[isa]:
            raise BackendUnavailableError(f"backend 'cpu' is unavailable: {_state[isa]['error']}")
        return _state[isa]


def kernel_info(isa: str | None = None) -> dict:
    """What the library for `isa` (default: `selected_isa()`) was built for, as the library itself reports it:
    requested (the ISA asked for), isa ("avx512", "avx2", "neon" or "generic": the tiles compiled in),
    vector_floats, rows_per_tile, qk_tokens_per_tile, pv_vectors_per_tile, flags, compiler, library (file name).
    Raises BackendUnavailableError when it cannot be built here."""
    return dict(_load(isa)["info"])


def cpu_kernel_available(isa: str | None = None) -> bool:
    """True when the C kernel for `isa` (default: `selected_isa()`) is built (building it now if needed) and loads."""
    try:
        _load(isa)
    except BackendUnavailableError:
        return False
    return True


def cpu_kernel_error(isa: str | None = None) -> str | None:
    """Why the C kernel for `isa` (default: `selected_isa()`) is unavailable, or None when it is available."""
    try:
        _load(isa)
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
    window: int | None = None,
    isa: str | None = None,
) -> torch.Tensor:
    """The "cpu" backend: rows [S, KV, R, D] attend to positions max(0, row_pos[s, r] - window + 1) ..
    row_pos[s, r] of their sequence (window None: from 0; row_pos -1: none, output 0), K/V read in place from the caches [num_blocks, block_size, KV, D] through block_tables.

    Arguments are validated by the caller (core.kernels.attention): CPU tensors, stride 1 in D, block ids in use in range.
    `lens` is not needed (row_pos < lens). Only table entries from the block of the sequence's first visible
    position to the block of max(row_pos[s]) are read.
    isa: the build to run (default `selected_isa()`, i.e. `PAGED_LAB_CPU_ISA` or native).
    Returns [S, KV, R, D] in rows' dtype, written into `out` (same shape, contiguous) when given.
    """
    fn = _load(isa)["lib"].paged_rows_out
    num_seqs, num_kv_heads, num_rows, head_dim = rows.shape
    if rows.dtype not in DTYPE_CODES or rows.device.type != "cpu":
        raise BackendUnavailableError(
            f"backend 'cpu' needs CPU float32/bfloat16/float16 tensors, got {rows.dtype} on {rows.device}"
        )
    table = block_tables.to(torch.int64).contiguous()  # [S, max_blocks]
    pos = row_pos.to(torch.int64).contiguous()  # [S, R]
    # the kernel writes float32, or bfloat16 for bfloat16 rows (rounded as torch rounds): no conversion after it
    out_dtype = torch.bfloat16 if rows.dtype == torch.bfloat16 else torch.float32
    direct = out is not None and out.dtype == out_dtype
    result = out if direct else torch.empty(rows.shape, dtype=out_dtype)
    threads = torch.get_num_threads()
    status = fn(
        rows.data_ptr(),
        *rows.stride()[:3],
        key_cache.data_ptr(),
        *key_cache.stride()[:3],
        value_cache.data_ptr(),
        *value_cache.stride()[:3],
        table.data_ptr(),
        table.stride(0),
        pos.data_ptr(),
        result.data_ptr(),
        DTYPE_CODES[out_dtype],
        num_seqs,
        num_kv_heads,
        num_rows,
        head_dim,
        key_cache.shape[1],
        float(scale),
        DTYPE_CODES[rows.dtype],
        threads,
        head_split(num_seqs, num_kv_heads, threads),
        FULL_WINDOW if window is None else int(window),
    )
    if status != 0:
        raise MemoryError("the C paged-attention kernel could not allocate its scratch memory")
    if direct:
        return out
    if out is not None:
        return out.copy_(result)
    return result if result.dtype == rows.dtype else result.to(rows.dtype)
