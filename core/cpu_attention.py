"""The "cpu" backend: a small C kernel that reads K/V blocks in place through the block table (no gathered copy).

The C source below is compiled at first use with the system C compiler (`$CC`, else cc, gcc or clang) into a shared
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
float32 and the caller converts to the query's dtype. While a block is processed the next block's rows of the same
head are prefetched (block ids are random, so the hardware prefetcher cannot guess the jump).
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

from core.errors import BackendUnavailableError

C_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

#if defined(__FLT16_MAX__)
static inline float f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
#else
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (e == 0) { float f = ldexpf((float)man, -24); return sign ? -f : f; }
    v.u = sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (man << 13);
    return v.f;
}
#endif

/* n elements of type dtype at src -> float32 at dst */
static inline void load_row(float *restrict dst, const void *src, int64_t n, int dtype) {
    if (dtype == DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == DT_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
    }
}

static inline void prefetch_rows(const char *base, int64_t row_stride_bytes, int rows, int64_t row_bytes) {
    for (int t = 0; t < rows; t++)
        for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(base + t * row_stride_bytes + o, 0, 3);
}

/* rows [S, KV, R, D] (element strides q_s, q_h, q_r; stride 1 in D) attend to positions 0..row_pos[s, r] of
   sequence s (-1: none, output 0). K/V caches [num_blocks, BS, KV, D] with element strides (k_b, k_t, k_h),
   (v_b, v_t, v_h). table [S, table_stride] int64. out [S, KV, R, D] float32 contiguous.
   Returns 0, or -1 when scratch memory could not be allocated. */
int paged_rows(const void *q, int64_t q_s, int64_t q_h, int64_t q_r,
               const void *kc, int64_t k_b, int64_t k_t, int64_t k_h,
               const void *vc, int64_t v_b, int64_t v_t, int64_t v_h,
               const int64_t *table, int64_t table_stride, const int64_t *row_pos, float *out,
               int64_t S, int64_t KV, int64_t R, int64_t D, int64_t BS, float scale, int dtype,
               int nthreads, int64_t head_split) {
    const int64_t esize = dtype == DT_F32 ? 4 : 2;
    const int64_t items = S * head_split;
    const int64_t heads_per_item = (KV + head_split - 1) / head_split;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        float *qf = malloc(sizeof(float) * heads_per_item * R * D);
        float *acc = malloc(sizeof(float) * heads_per_item * R * D);
        float *m = malloc(sizeof(float) * heads_per_item * R);
        float *l = malloc(sizeof(float) * heads_per_item * R);
        float *kbuf = malloc(sizeof(float) * BS * D);
        float *vbuf = malloc(sizeof(float) * BS * D);
        float *sc = malloc(sizeof(float) * BS);
        int ok = qf && acc && m && l && kbuf && vbuf && sc;
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; item++) {
            if (!ok) continue;
            const int64_t s = item / head_split, part = item % head_split;
            const int64_t h0 = part * KV / head_split, h1 = (part + 1) * KV / head_split;
            const int64_t *pos = row_pos + s * R;
            int64_t maxpos = -1;
            for (int64_t r = 0; r < R; r++) maxpos = pos[r] > maxpos ? pos[r] : maxpos;
            for (int64_t h = h0; h < h1; h++) {
                for (int64_t r = 0; r < R; r++) {
                    const int64_t i = (h - h0) * R + r;
                    const char *src = (const char *)q + (s * q_s + h * q_h + r * q_r) * esize;
                    load_row(qf + i * D, src, D, dtype);
                    for (int64_t d = 0; d < D; d++) { qf[i * D + d] *= scale; acc[i * D + d] = 0.0f; }
                    m[i] = -INFINITY;
                    l[i] = 0.0f;
                }
            }
            const int64_t nblocks = maxpos < 0 ? 0 : maxpos / BS + 1;
            for (int64_t b = 0; b < nblocks; b++) {
                const int64_t bid = table[s * table_stride + b];
                const int64_t t0 = b * BS;
                const int64_t tb = maxpos + 1 - t0 < BS ? maxpos + 1 - t0 : BS; /* tokens read in this block */
                int64_t next_tb = 0, next_bid = 0;
                if (b + 1 < nblocks) {
                    next_bid = table[s * table_stride + b + 1];
                    next_tb = maxpos + 1 - (t0 + BS) < BS ? maxpos + 1 - (t0 + BS) : BS;
                }
                for (int64_t h = h0; h < h1; h++) {
                    const char *kb = (const char *)kc + (bid * k_b + h * k_h) * esize;
                    const char *vb = (const char *)vc + (bid * v_b + h * v_h) * esize;
                    if (next_tb) {
                        prefetch_rows((const char *)kc + (next_bid * k_b + h * k_h) * esize, k_t * esize,
                                      (int)next_tb, D * esize);
                        prefetch_rows((const char *)vc + (next_bid * v_b + h * v_h) * esize, v_t * esize,
                                      (int)next_tb, D * esize);
                    }
                    const float *kr = (const float *)kb, *vr = (const float *)vb;
                    int64_t krs = k_t, vrs = v_t; /* float row strides */
                    if (dtype != DT_F32) {
                        for (int64_t t = 0; t < tb; t++) {
                            load_row(kbuf + t * D, kb + t * k_t * esize, D, dtype);
                            load_row(vbuf + t * D, vb + t * v_t * esize, D, dtype);
                        }
                        kr = kbuf, vr = vbuf, krs = D, vrs = D;
                    }
                    for (int64_t r = 0; r < R; r++) {
                        if (pos[r] < t0) continue;
                        const int64_t n = pos[r] - t0 + 1 < tb ? pos[r] - t0 + 1 : tb;
                        const int64_t i = (h - h0) * R + r;
                        const float *qi = qf + i * D;
                        float *ai = acc + i * D;
                        float bm = -INFINITY;
                        for (int64_t t = 0; t < n; t++) {
                            const float *k = kr + t * krs;
                            float dot = 0.0f;
                            #pragma omp simd reduction(+ : dot)
                            for (int64_t d = 0; d < D; d++) dot += qi[d] * k[d];
                            sc[t] = dot;
                            bm = dot > bm ? dot : bm;
                        }
                        if (bm > m[i]) {
                            const float alpha = expf(m[i] - bm); /* 0 when m was -inf */
                            l[i] *= alpha;
                            #pragma omp simd
                            for (int64_t d = 0; d < D; d++) ai[d] *= alpha;
                            m[i] = bm;
                        }
                        float sum = 0.0f;
                        for (int64_t t = 0; t < n; t++) {
                            const float p = expf(sc[t] - m[i]);
                            sum += p;
                            const float *v = vr + t * vrs;
                            #pragma omp simd
                            for (int64_t d = 0; d < D; d++) ai[d] += p * v[d];
                        }
                        l[i] += sum;
                    }
                }
            }
            for (int64_t h = h0; h < h1; h++) {
                for (int64_t r = 0; r < R; r++) {
                    const int64_t i = (h - h0) * R + r;
                    float *o = out + ((s * KV + h) * R + r) * D;
                    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
                    for (int64_t d = 0; d < D; d++) o[d] = l[i] > 0.0f ? acc[i * D + d] * inv : 0.0f;
                }
            }
        }
        free(qf); free(acc); free(m); free(l); free(kbuf); free(vbuf); free(sc);
    }
    return failed ? -1 : 0;
}
"""

BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-std=c11")
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
    """Compile C_SOURCE (once per source/compiler/flags/CPU) and return the cached library's path."""
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
            errors.append(f"{' '.join(flags)}: {proc.stderr.strip()[-500:]}")
    raise RuntimeError("; ".join(errors))


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
    return max(1, min(num_kv_heads, -(-4 * threads // num_seqs)))


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

    Arguments are validated by the caller (core.attention): CPU tensors, stride 1 in D, block ids in use in range.
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
