"""The "cpu" C kernel built for every ISA this machine can run (avx512, avx2 and generic on an AVX-512 x86-64;
neon and generic on AArch64), each checked against the independent float64 per-token reference, plus the ISA
switch itself (PAGED_LAB_CPU_ISA, bench --isa) and what the built libraries say they were built for.

The cases aim at each ISA's tile edges: head_dims that fill whole P.V tiles, leave a one-vector remainder or are
not a multiple of the vector width at all (the plain loop); query groups of 1, 3, 4, 6 and 8 rows (4-row tiles
and single rows); lengths that end mid-block (a q.K tile's token remainder), sliding windows and prefill rows.
"""

import ctypes
import json
import subprocess
import sys

import pytest
import torch

import core.kernels.cpu_backend as cpu_backend
import core.kernels.cpu_isa as cpu_isa
from core.errors import BackendUnavailableError
from core.kernels.attention import (
    available_backends,
    paged_attention,
    paged_prefill_attention,
    resolve_backend,
)
from tests.conftest import ROOT
from tests.kernels.reference_attention import make_problem, reference_paged, release_outside_window

RUNNABLE = cpu_isa.runnable_isas()
BUILT = [isa for isa in RUNNABLE if cpu_backend.cpu_kernel_available(isa)]  # builds each once per machine
needs_kernel = pytest.mark.skipif(not BUILT, reason=f"no C kernel here: {cpu_backend.cpu_kernel_error()}")
ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
# floats per vector register and registers of each ISA: the numbers the tiles are sized from (paged_rows.c)
REGISTERS = {"avx512": (16, 32), "avx2": (8, 16), "neon": (4, 32), "generic": (4, 16)}

# (head_dim, block_size, heads, kv_heads, dtype): 128 fills whole tiles everywhere; 48 / 80 / 72 leave P.V
# remainders of one or more vectors; 40 is tiled on 8- and 4-float builds and plain on AVX-512; 36 is plain
# except on 4-float builds; 20 is plain everywhere but generic and neon.
CASES = [
    (128, 16, 32, 8, torch.float32),
    (128, 16, 32, 8, torch.bfloat16),
    (128, 16, 32, 8, torch.float16),
    (48, 8, 12, 2, torch.float32),
    (80, 32, 24, 8, torch.bfloat16),
    (72, 16, 8, 8, torch.float32),
    (40, 16, 6, 1, torch.bfloat16),
    (36, 8, 16, 2, torch.float32),
    (64, 16, 24, 3, torch.float16),
    (20, 16, 4, 1, torch.bfloat16),
    (256, 16, 8, 1, torch.float32),
]
LENS = [1, 2, 15, 16, 17, 30, 47]


def _case_id(case):
    head_dim, block_size, heads, kv_heads, dtype = case
    return f"d{head_dim}-bs{block_size}-h{heads}/{kv_heads}-{str(dtype).removeprefix('torch.')}"


def test_isa_names_and_what_this_cpu_runs():
    assert cpu_isa.ISAS == ("native", "avx512", "avx2", "neon", "generic")
    assert RUNNABLE and RUNNABLE[-1] == "generic"
    if cpu_isa.machine() == "x86_64":
        features = cpu_isa.cpu_features()
        assert ("avx2" in RUNNABLE) == ("avx2" in features and "fma" in features)
        assert ("avx512" in RUNNABLE) == ({"avx512f", "avx512bw", "avx512vl"} <= features)
        assert "neon" not in RUNNABLE
    if cpu_isa.machine() == "aarch64":
        assert "neon" in RUNNABLE and "avx2" not in RUNNABLE


@needs_kernel
def test_every_runnable_isa_builds_and_reports_its_own_tiles():
    assert BUILT == RUNNABLE, {isa: cpu_backend.cpu_kernel_error(isa) for isa in RUNNABLE}
    libraries = set()
    for isa in BUILT:
        info = cpu_backend.kernel_info(isa)
        assert info["requested"] == isa and info["isa"] == isa, info
        floats, registers = REGISTERS[isa]
        assert info["vector_floats"] == floats
        rows, qk, pv = info["rows_per_tile"], info["qk_tokens_per_tile"], info["pv_vectors_per_tile"]
        assert rows * qk + qk + 1 <= registers and rows * pv + pv + 1 <= registers, info  # no spill by count
        libraries.add(info["library"])
    assert len(libraries) == len(BUILT)  # one library per ISA, cached side by side
    native = cpu_backend.kernel_info("native")
    assert native["isa"] in BUILT and native["requested"] == "native"


@needs_kernel
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_isa_build_matches_the_float64_reference(case, monkeypatch):
    head_dim, block_size, heads, kv_heads, dtype = case
    problem = make_problem(
        len(LENS), heads, kv_heads, head_dim, block_size, max(LENS), dtype, seed=7, lens=LENS
    )
    expected = reference_paged(**problem)
    for isa in BUILT:
        monkeypatch.setenv(cpu_isa.ENV_ISA, isa)  # the switch paged_attention's "cpu" backend reads
        got = paged_attention(**problem, backend="cpu")
        assert got.dtype == dtype and not torch.isnan(got).any(), isa
        err = (got.double() - expected).abs().max().item()
        assert err <= ATOL[dtype], f"{isa}: max abs error {err:.3g} > {ATOL[dtype]}"


@needs_kernel
@pytest.mark.parametrize("window", [1, 5, 17, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_isa_build_with_a_sliding_window(dtype, window, monkeypatch):
    problem = make_problem(len(LENS), 32, 8, 128, 16, max(LENS), dtype, seed=window, lens=LENS)
    release_outside_window(problem, window)  # released blocks are -1 and NaN: reading one shows
    expected = reference_paged(**problem, sliding_window=window)
    for isa in BUILT:
        monkeypatch.setenv(cpu_isa.ENV_ISA, isa)
        got = paged_attention(**problem, backend="cpu", sliding_window=window)
        err = (got.double() - expected).abs().max().item()
        assert err <= ATOL[dtype], f"{isa}, window {window}: max abs error {err:.3g}"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_isa_build_for_prefill_rows(dtype, monkeypatch):
    """Chunks of 1-9 new tokens x 4 query heads: up to 36 rows per KV head, several 4-row tiles and padding rows."""
    problem = make_problem(5, 16, 4, 64, 16, 40, dtype, seed=3)
    query = torch.randn(5, 9, 16, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    query_lens = torch.minimum(torch.tensor([9, 4, 0, 1, 7]), problem["context_lens"].long()).to(torch.int32)
    cache = (problem["key_cache"], problem["value_cache"], problem["block_tables"], problem["context_lens"])
    expected = reference_paged(query, *cache, query_lens=query_lens)
    for isa in BUILT:
        monkeypatch.setenv(cpu_isa.ENV_ISA, isa)
        got = paged_prefill_attention(query, *cache, query_lens, backend="cpu")
        err = (got.double() - expected).abs().max().item()
        assert not torch.isnan(got).any() and err <= ATOL[dtype], f"{isa}: max abs error {err:.3g}"


@needs_kernel
def test_bfloat16_output_is_the_float32_result_rounded_as_torch_rounds():
    """The kernel writes bfloat16 rows itself: bit for bit torch's rounding of the float32 result that the
    library's float32 entry point (`paged_rows`, the one the cross-architecture driver calls) writes."""
    problem = make_problem(len(LENS), 32, 8, 128, 16, max(LENS), torch.bfloat16, seed=11, lens=LENS)
    query = problem["query"]
    seqs, heads, dim = query.shape
    rows = query.view(seqs, 8, heads // 8, dim)
    table = problem["block_tables"].to(torch.int64).contiguous()
    pos = (problem["context_lens"].to(torch.int64) - 1)[:, None].expand(seqs, heads // 8).contiguous()
    kc, vc = problem["key_cache"], problem["value_cache"]
    scale = dim**-0.5
    for isa in BUILT:
        got = cpu_backend.cpu_paged_rows(rows, kc, vc, table, None, pos, scale, isa=isa)
        fn = cpu_backend._load(isa)["lib"].paged_rows
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn.argtypes = (
            [ptr, i64, i64, i64]
            + [ptr, i64, i64, i64] * 2
            + [ptr, i64, ptr, ptr]
            + [i64] * 5
            + [ctypes.c_float, ctypes.c_int, ctypes.c_int, i64, i64]
        )
        wide = torch.empty(rows.shape, dtype=torch.float32)
        status = fn(
            rows.data_ptr(),
            *rows.stride()[:3],
            kc.data_ptr(),
            *kc.stride()[:3],
            vc.data_ptr(),
            *vc.stride()[:3],
            table.data_ptr(),
            table.stride(0),
            pos.data_ptr(),
            wide.data_ptr(),
            seqs,
            8,
            heads // 8,
            dim,
            kc.shape[1],
            scale,
            cpu_backend.DTYPE_CODES[torch.bfloat16],
            2,
            1,
            cpu_backend.FULL_WINDOW,
        )
        assert status == 0 and got.dtype == torch.bfloat16, isa
        assert torch.equal(got, wide.to(torch.bfloat16)), isa


def test_an_unknown_isa_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(cpu_isa.ENV_ISA, "avx1024")
    error = cpu_backend.cpu_kernel_error()
    assert "must be one of native, avx512, avx2, neon, generic" in error and "'avx1024'" in error
    problem = make_problem(2, 4, 1, 32, 8, 9, torch.float32, seed=1)
    with pytest.raises(BackendUnavailableError, match="avx1024"):
        paged_attention(**problem, backend="cpu")
    with pytest.raises(BackendUnavailableError, match="PAGED_LAB_CPU_ISA"):
        resolve_backend("auto", "cpu")  # an explicit choice that cannot run is not silently replaced
    monkeypatch.setenv(cpu_isa.ENV_ISA, " AVX2 ")
    assert cpu_isa.selected_isa() == "avx2"


def test_another_architectures_isa_is_refused(monkeypatch):
    foreign = "neon" if cpu_isa.machine() == "x86_64" else "avx2"
    problem = cpu_isa.isa_problem(foreign)
    assert problem is not None and cpu_isa.machine() in problem and "it runs: native" in problem
    monkeypatch.setenv(cpu_isa.ENV_ISA, foreign)
    assert not cpu_backend.cpu_kernel_available()
    assert "cpu" not in available_backends("cpu")


def test_missing_features_are_named(monkeypatch):
    """An x86-64 CPU with AVX2 but not AVX-512 (as the issue's EPYC): avx512 is refused, naming the features."""
    v3 = ["avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave", "sse2"]
    monkeypatch.setattr(cpu_isa, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_isa, "cpu_features", lambda: frozenset([*v3, "avx512f"]))
    assert cpu_isa.runnable_isas() == ["avx2", "generic"]
    problem = cpu_isa.isa_problem("avx512")
    assert "avx512bw, avx512cd, avx512dq, avx512vl" in problem and "it runs: native, avx2, generic" in problem
    monkeypatch.setattr(cpu_isa, "cpu_features", lambda: frozenset(v3) - {"fma"})
    assert cpu_isa.runnable_isas() == ["generic"] and "(fma)" in cpu_isa.isa_problem("avx2")


@needs_kernel
def test_bench_prints_the_isa_it_built_for():
    isa = BUILT[1] if len(BUILT) > 1 else BUILT[0]  # not the widest: the switch must really change the build
    command = [sys.executable, "-m", "bench.attention", "--isa", isa, "--batches", "2", "--contexts", "32"]
    command += ["--dtypes", "float32", "--repeats", "1", "--warmup", "0", "--backends", "cpu"]
    # --no-vllm: vLLM's kernel baseline (vLLM's own interpreter, ~20 s) is tests/vllm/test_kernel_baseline.py's
    command += ["--no-vllm"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["cpu_kernel"]["requested"] == isa and report["cpu_kernel"]["isa"] == isa
    assert report["cpu_kernel"]["vector_floats"] == REGISTERS[isa][0]
    assert report["cpu"]["model"] and report["cpu"]["arch"] == cpu_isa.machine()
    assert report["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert [r["backend"] for r in report["results"]] == ["cpu"] and report["results"][0]["max_abs_err"] < 1e-4
    foreign = "neon" if cpu_isa.machine() == "x86_64" else "avx2"
    proc = subprocess.run(
        [*command[:3], "--isa", foreign], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and f"{cpu_isa.ENV_ISA}={foreign}" in proc.stderr
