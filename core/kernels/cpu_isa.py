"""Which vector ISA the "cpu" backend's C kernel is built for, and what this CPU can run.

`PAGED_LAB_CPU_ISA` (or `bench.attention --isa`) chooses the build target:
    native   the compiler's -march=native (the default): the widest ISA this CPU has
    avx512   x86-64-v4 (AVX-512 F/BW/CD/DQ/VL): 32 registers of 16 floats
    avx2     x86-64-v3 (AVX2, FMA, F16C): 16 registers of 8 floats
    neon     AArch64 Advanced SIMD: 32 registers of 4 floats
    generic  the portable 4-float tiles at the architecture's baseline (SSE2 on x86-64)
The kernel (`paged_rows.c`) picks its register tiles from the ISA the compiler targets, so one source builds the
right tiles everywhere; the ISA a build really targets is reported by the library itself
(`cpu_backend.kernel_info`). An explicit ISA must be one this CPU runs (`runnable_isas`): a build for an ISA the
CPU lacks would die on an illegal instruction, so it is refused with the missing features named.
"""

import functools
import os
import platform
from pathlib import Path

ENV_ISA = "PAGED_LAB_CPU_ISA"
ISAS = ("native", "avx512", "avx2", "neon", "generic")

# x86-64-v3 / -v4 as /proc/cpuinfo names their features (abm = LZCNT).
_X86_V3 = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_X86_V4 = (*_X86_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_REQUIRED = {"avx512": _X86_V4, "avx2": _X86_V3, "neon": ("asimd",)}
_ARCH = {"avx512": "x86_64", "avx2": "x86_64", "neon": "aarch64"}

# Compiler flag sets per ISA, tried in order (the -march level names need GCC 11 / clang 12; older compilers
# take the feature list). -mtune=native keeps the scheduling model of the machine the library is built on.
_V3_FEATURES = ("-mavx2", "-mfma", "-mf16c", "-mbmi", "-mbmi2", "-mlzcnt", "-mmovbe")
_V4_FEATURES = (*_V3_FEATURES, "-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl")
FLAG_SETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "native": (("-march=native",), ()),
    "avx512": (("-march=x86-64-v4", "-mtune=native"), _V4_FEATURES),
    "avx2": (("-march=x86-64-v3", "-mtune=native"), _V3_FEATURES),
    "neon": (("-march=armv8-a+simd", "-mtune=native"), ("-march=armv8-a+simd",)),
    "generic": (("-DPAGED_ISA_GENERIC",),),
}

# Features worth naming in a benchmark's machine description.
_SHOWN_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "asimd", "bf16", "sve")


def selected_isa() -> str:
    """The ISA asked for: `PAGED_LAB_CPU_ISA` lower-cased, "native" when unset or empty (not validated here)."""
    return (os.environ.get(ENV_ISA) or "native").strip().lower()


def machine() -> str:
    """The architecture Python runs on: 'x86_64', 'aarch64', ... (arm64 is reported as aarch64)."""
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def _cpuinfo() -> dict[str, str]:
    """The first processor's /proc/cpuinfo fields (empty where there is none): a copy of the process's one read."""
    return dict(_read_cpuinfo())


@functools.lru_cache(maxsize=1)
def _read_cpuinfo() -> dict[str, str]:
    # read once a process: the attention backend is resolved on every call (two a layer a step), and each read and
    # parse took 69 us here, ~0.13 s of a ~5 s chat turn of the real model on one thread (1,920 calls)
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_features() -> frozenset[str]:
    """The CPU's feature names as /proc/cpuinfo lists them ('flags' on x86, 'Features' on ARM); empty if unknown."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def missing_features(isa: str) -> list[str]:
    """The CPU features (as /proc/cpuinfo names them) this machine lacks to run a build for `isa` (a name in
    ISAS): [] when it can run it. Raises nothing; a wrong architecture is `isa_problem`'s to report."""
    if isa in ("native", "generic") or machine() != _ARCH[isa]:
        return []
    features = cpu_features()
    if not features:  # no /proc/cpuinfo: trust the architecture (NEON is part of every AArch64 CPU)
        return [] if isa == "neon" else ["a readable /proc/cpuinfo"]
    return [name for name in _REQUIRED[isa] if name not in features]


def _runs(isa: str) -> bool:
    return isa in ("native", "generic") or (machine() == _ARCH[isa] and not missing_features(isa))


def runnable_isas() -> list[str]:
    """The explicit ISAs (not "native") whose builds this CPU can run, widest first, "generic" last."""
    return [isa for isa in ISAS[1:] if _runs(isa)]


def isa_problem(isa: str) -> str | None:
    """Why `isa` cannot be built and run here (an unknown name, another architecture's ISA, missing CPU
    features), naming what this CPU runs instead; None when it can."""
    runs = ", ".join(["native", *runnable_isas()])
    if isa not in ISAS:
        return f"{ENV_ISA} must be one of {', '.join(ISAS)}; got {isa!r} (this CPU runs: {runs})"
    if not _runs(isa) and machine() != _ARCH[isa]:
        return f"{ENV_ISA}={isa} is an {_ARCH[isa]} ISA and this CPU is {machine()}; it runs: {runs}"
    if not _runs(isa):
        return f"{ENV_ISA}={isa} needs CPU features this CPU lacks ({', '.join(missing_features(isa))}); it runs: {runs}"
    return None


def cpu_description() -> dict:
    """The machine a timing ran on: model name, vendor, family / model numbers, architecture, logical CPUs, and
    which of the vector features that matter here it has."""
    info = _cpuinfo()
    features = cpu_features()
    return {
        "model": info.get("model name") or info.get("Model") or platform.processor() or "unknown",
        "vendor": info.get("vendor_id") or info.get("CPU implementer") or "unknown",
        "family": info.get("cpu family") or info.get("CPU architecture"),
        "model_id": info.get("model") or info.get("CPU part"),
        "arch": machine(),
        "logical_cpus": os.cpu_count(),
        "vector_features": [name for name in _SHOWN_FEATURES if name in features],
    }


def cache_key() -> str:
    """What identifies this CPU in a built library's cache key: architecture, model name and feature list."""
    info = _cpuinfo()
    return "\n".join([machine(), info.get("model name", ""), " ".join(sorted(cpu_features()))])
