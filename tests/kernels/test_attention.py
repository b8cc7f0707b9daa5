"""Paged attention (torch, cpu and gather backends) against an independent float64 per-token reference.

Grid in the spirit of vLLM's kernel tests: head_dim x block_size x (heads, kv_heads) x dtype, 7 sequences with
random lengths (the last is the longest), random non-sequential block tables with -1 / out-of-range padding,
and NaN in every slot no sequence owns. The default run takes a covering subset (every value of every axis);
`pytest -m slow` runs the full product.
"""

import itertools
from pathlib import Path

import pytest
import torch

import core.kernels.attention as attention
import core.kernels.cpu_backend as cpu_attention
import core.kernels.torch_backend as torch_backend
from core.errors import BackendUnavailableError, InvalidArgumentError, LabError
from core.kernels.attention import (
    available_backends,
    contiguous_attention,
    gather_contiguous,
    paged_attention,
    paged_prefill_attention,
    resolve_backend,
    torch_paged_rows,
)
from tests.kernels.reference_attention import make_problem, reference_paged, release_outside_window

CPU_KERNEL = cpu_attention.cpu_kernel_available()  # builds the C kernel once per machine (~1 s)
needs_cpu_kernel = pytest.mark.skipif(
    not CPU_KERNEL, reason=f"the 'cpu' C kernel is unavailable here: {cpu_attention.cpu_kernel_error()}"
)
# Backends that run on CPU tensors in this process: the C kernel only where a C compiler built it.
CPU_BACKENDS = ("torch", "gather") + (("cpu",) if CPU_KERNEL else ())

HEAD_DIMS = (64, 80, 96, 112, 128, 256)
BLOCK_SIZES = (8, 16, 32)
HEAD_CONFIGS = ((40, 40), (64, 8), (32, 1))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
NUM_SEQS = 7
MAX_LEN = 77  # several blocks at every block size, a partial last block

FULL_GRID = list(itertools.product(HEAD_DIMS, BLOCK_SIZES, HEAD_CONFIGS, DTYPES))
# 18 cases: each (heads, dtype) pair twice, head_dim and block_size cycling, so every value of every axis appears.
PAIRS = list(itertools.product(HEAD_CONFIGS, DTYPES))
CI_GRID = [(HEAD_DIMS[k % 6], BLOCK_SIZES[k % 3], *PAIRS[k // 2]) for k in range(18)]


def _case_id(case):
    head_dim, block_size, (heads, kv_heads), dtype = case
    return f"d{head_dim}-bs{block_size}-h{heads}/{kv_heads}-{str(dtype).removeprefix('torch.')}"


def test_ci_grid_covers_every_axis_value():
    for axis, values in enumerate((HEAD_DIMS, BLOCK_SIZES, HEAD_CONFIGS, DTYPES)):
        assert {case[axis] for case in CI_GRID} == set(values)


def _check_case(case, monkeypatch, seed):
    head_dim, block_size, (heads, kv_heads), dtype = case
    problem = make_problem(NUM_SEQS, heads, kv_heads, head_dim, block_size, MAX_LEN, dtype, seed=seed)
    expected = reference_paged(**problem)
    atol = ATOL[dtype]
    for backend in CPU_BACKENDS:
        got = paged_attention(**problem, backend=backend)
        assert got.dtype == dtype and got.shape == (NUM_SEQS, heads, head_dim)
        err = (got.double() - expected).abs().max().item()
        assert err <= atol, f"{backend}: max abs error {err:.3g} > {atol}"
    # Many chunks, so the online-softmax merge (equation 4) runs at many block boundaries: the smallest chunks
    # the backend uses (MIN_CHUNK_TOKENS), and in float32 one block per chunk.
    monkeypatch.setattr(torch_backend, "CHUNK_TARGET_BYTES", 1)
    got = paged_attention(**problem, backend="torch")
    err = (got.double() - expected).abs().max().item()
    assert err <= atol, f"torch, smallest chunks: max abs error {err:.3g} > {atol}"
    if dtype == torch.float32:
        lens = problem["context_lens"].long()
        rows = problem["query"].view(NUM_SEQS, kv_heads, heads // kv_heads, head_dim)
        row_pos = (lens - 1)[:, None].expand(NUM_SEQS, heads // kv_heads)
        cache = (problem["key_cache"], problem["value_cache"], problem["block_tables"])
        got = torch_paged_rows(rows, *cache, lens, row_pos, head_dim**-0.5, chunk=1)
        err = (got.reshape(NUM_SEQS, heads, head_dim).double() - expected).abs().max().item()
        assert err <= atol, f"torch, 1-block chunks: max abs error {err:.3g} > {atol}"


@pytest.mark.parametrize("case", CI_GRID, ids=_case_id)
def test_paged_attention_matches_reference(case, monkeypatch):
    _check_case(case, monkeypatch, seed=CI_GRID.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL_GRID, ids=_case_id)
def test_paged_attention_full_grid(case, monkeypatch):
    _check_case(case, monkeypatch, seed=FULL_GRID.index(case))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_explicit_math_path_matches_reference(dtype, monkeypatch):
    """The device-independent float32 path (used off CPU) with small chunks, not ATen's CPU flash kernel."""
    monkeypatch.setattr(torch_backend, "CPU_FLASH", None)
    monkeypatch.setattr(torch_backend, "CHUNK_TARGET_BYTES", 3 * 16 * 16 * 4 * 96 * 4)  # ~3 blocks per chunk
    problem = make_problem(NUM_SEQS, 16, 4, 96, 16, 100, dtype, seed=11)
    err = (paged_attention(**problem, backend="torch").double() - reference_paged(**problem)).abs().max()
    assert err <= ATOL[dtype]


def test_nan_poisoned_padding_and_output_do_not_leak():
    """Outputs pre-filled with NaN, NaN in every unowned slot and block, -1 and out-of-range table padding."""
    problem = make_problem(NUM_SEQS, 8, 2, 64, 16, 90, torch.float32, seed=5)
    cache = problem["key_cache"]
    assert torch.isnan(cache).any(), "the problem must really be poisoned"
    assert (problem["block_tables"] == -1).any() and (problem["block_tables"] >= cache.shape[0]).any()
    expected = reference_paged(**problem)
    for backend in CPU_BACKENDS:
        out = torch.full_like(problem["query"], float("nan"))
        got = paged_attention(**problem, backend=backend, out=out)
        assert got.data_ptr() == out.data_ptr()
        assert not torch.isnan(out).any()
        assert (out.double() - expected).abs().max() <= 1e-5
    # The same problem without poison gives the same numbers: padding content has no influence. Held to float32
    # rounding, not bit for bit: the torch backend goes through BLAS, which may pick another blocking (or, on MKL,
    # another path for another buffer alignment) between two calls.
    clean = make_problem(NUM_SEQS, 8, 2, 64, 16, 90, torch.float32, seed=5, poison=False)
    for backend in CPU_BACKENDS:
        torch.testing.assert_close(
            paged_attention(**clean, backend=backend),
            paged_attention(**problem, backend=backend),
            rtol=1e-6,
            atol=1e-6,
        )


def test_single_token_and_block_boundary_lengths():
    lens = [1, 15, 16, 17, 32, 33, 48]
    problem = make_problem(7, 4, 2, 64, 16, 48, torch.float32, seed=9, lens=lens)
    err = (paged_attention(**problem, backend="torch").double() - reference_paged(**problem)).abs().max()
    assert err <= 1e-5
    # A context of one token returns that token's value for every head of the group.
    value = problem["value_cache"][problem["block_tables"][0, 0], 0]  # [kv_heads, dim]
    got = paged_attention(**problem, backend="torch")[0]  # [heads, dim]
    assert torch.allclose(got, value.repeat_interleave(2, dim=0))


def test_int64_block_tables_and_explicit_scale():
    problem = make_problem(NUM_SEQS, 8, 8, 64, 8, 40, torch.float32, seed=4)
    expected = reference_paged(**problem, scale=0.3)
    problem["block_tables"] = problem["block_tables"].long()
    problem["context_lens"] = problem["context_lens"].long()
    got = paged_attention(**problem, scale=0.3, backend="torch")
    assert (got.double() - expected).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------------------- prefill
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["default-chunks", "1-block-chunks"])
def test_prefill_matches_reference(dtype, chunk_bytes, monkeypatch):
    if chunk_bytes is not None:
        monkeypatch.setattr(torch_backend, "CHUNK_TARGET_BYTES", chunk_bytes)
    problem = make_problem(5, 8, 2, 64, 8, 40, dtype, seed=3)
    gen = torch.Generator().manual_seed(1)
    max_q = 9
    query = torch.randn(5, max_q, 8, 64, generator=gen).to(dtype)
    # a fresh prompt (whole context), a mid-sequence chunk, an idle sequence, a single token, a prefix-cache hit
    query_lens = torch.minimum(torch.tensor([9, 4, 0, 1, 7]), problem["context_lens"].long()).to(torch.int32)
    args = (
        query,
        problem["key_cache"],
        problem["value_cache"],
        problem["block_tables"],
        problem["context_lens"],
    )
    expected = reference_paged(*args, query_lens=query_lens)
    for backend in CPU_BACKENDS:
        got = paged_prefill_attention(*args, query_lens, backend=backend)
        assert got.shape == query.shape and got.dtype == dtype
        assert not torch.isnan(got).any()
        assert (got.double() - expected).abs().max() <= ATOL[dtype]
        # padding query rows are exactly zero
        rows = torch.arange(max_q)[None, :] >= query_lens[:, None]
        assert (got[rows] == 0).all()


def test_prefill_of_one_token_equals_decode():
    problem = make_problem(NUM_SEQS, 16, 4, 80, 16, 70, torch.float32, seed=8)
    decode = paged_attention(**problem, backend="torch")
    prefill = paged_prefill_attention(
        problem["query"][:, None],
        problem["key_cache"],
        problem["value_cache"],
        problem["block_tables"],
        problem["context_lens"],
        torch.ones(NUM_SEQS, dtype=torch.int32),
        backend="torch",
    )
    assert torch.allclose(prefill[:, 0], decode, atol=1e-6)


def test_prefill_rejects_query_lens_longer_than_context():
    problem = make_problem(2, 4, 4, 32, 8, 10, torch.float32, seed=0, lens=[3, 10])
    query = torch.randn(2, 5, 4, 32)
    with pytest.raises(InvalidArgumentError, match="query_lens"):
        paged_prefill_attention(
            query,
            problem["key_cache"],
            problem["value_cache"],
            problem["block_tables"],
            problem["context_lens"],
            torch.tensor([4, 2], dtype=torch.int32),
        )


# ---------------------------------------------------------------------------------------------- contiguous
@pytest.mark.parametrize("method", ["sdpa", "matmul"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_contiguous_attention_matches_reference(method, dtype):
    problem = make_problem(NUM_SEQS, 32, 8, 128, 16, 64, dtype, seed=2)
    key, value = gather_contiguous(
        problem["key_cache"], problem["value_cache"], problem["block_tables"], problem["context_lens"]
    )
    assert key.shape == (NUM_SEQS, 64, 8, 128)
    got = contiguous_attention(problem["query"], key, value, problem["context_lens"], method=method)
    err = (got.double() - reference_paged(**problem)).abs().max().item()
    assert err <= ATOL[dtype]


def test_contiguous_attention_rejects_bad_arguments():
    query, key = torch.randn(2, 8, 64), torch.randn(2, 10, 2, 64)
    lens = torch.tensor([3, 10], dtype=torch.int32)
    with pytest.raises(InvalidArgumentError, match="method"):
        contiguous_attention(query, key, key, lens, method="flash")
    with pytest.raises(InvalidArgumentError, match="max_len"):
        contiguous_attention(query, key, key, torch.tensor([3, 11], dtype=torch.int32))
    with pytest.raises(InvalidArgumentError, match="multiple"):
        contiguous_attention(torch.randn(2, 7, 64), key, key, lens)


# -------------------------------------------------------------------------------------------------- errors
def _small():
    return make_problem(3, 4, 2, 32, 8, 20, torch.float32, seed=0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda p: p.update(query=p["query"][None]), "3-D"),
        (lambda p: p.update(query=p["query"][..., :16]), "head_dim"),
        (lambda p: p.update(query=torch.randn(3, 5, 32)), "multiple of num_kv_heads"),
        (lambda p: p.update(query=p["query"].half()), "one dtype"),
        (lambda p: p.update(query=p["query"].double(), key_cache=p["key_cache"].double()), "dtype"),
        (lambda p: p.update(block_tables=p["block_tables"].float()), "block_tables has dtype"),
        (lambda p: p.update(context_lens=p["context_lens"][:2]), "sequences"),
        (lambda p: p.update(value_cache=p["value_cache"][:, :4]), "same shape"),
        (
            lambda p: p.update(context_lens=torch.tensor([3, 0, 20], dtype=torch.int32)),
            "context_lens must be in",
        ),
        (lambda p: p.update(context_lens=torch.tensor([3, 5, 41], dtype=torch.int32)), r"\[1, 5 x 8 = 40\]"),
        (lambda p: p["block_tables"].__setitem__((0, 0), 999), "block ids in use"),
        (lambda p: p["block_tables"].__setitem__((0, 0), -1), "block ids in use"),
        (
            lambda p: p.update(key_cache=p["key_cache"].transpose(2, 3).contiguous().transpose(2, 3)),
            "stride 1",
        ),
    ],
)
def test_bad_arguments_raise_typed_errors(change, match):
    problem = _small()
    problem["context_lens"] = torch.tensor([3, 5, 20], dtype=torch.int32)
    change(problem)
    with pytest.raises(InvalidArgumentError, match=match):
        paged_attention(**problem, backend="torch")


def test_errors_are_lab_errors_and_name_the_values():
    problem = _small()
    problem["context_lens"] = torch.tensor([3, 5, 99], dtype=torch.int32)
    with pytest.raises(LabError) as info:
        paged_attention(**problem)
    assert "99" in str(info.value) and "40" in str(info.value)


def test_backend_choice():
    assert resolve_backend("auto", "cpu") == ("cpu" if CPU_KERNEL and attention.AUTO_CPU_KERNEL else "torch")
    assert resolve_backend("auto", "meta") == "torch"
    with pytest.raises(InvalidArgumentError, match="backend must be one of"):
        paged_attention(**_small(), backend="cuda-graphs")
    with pytest.raises(InvalidArgumentError):
        paged_attention(**_small(), out=torch.empty(1))


def test_triton_on_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(BackendUnavailableError, match="triton"):
        paged_attention(**_small(), backend="triton")


def test_tensors_on_different_devices_are_refused():
    problem = _small()
    problem["query"] = problem["query"].to("meta")
    with pytest.raises(InvalidArgumentError, match="one device"):
        paged_attention(**problem, backend="torch")


def test_prefill_of_the_whole_prompt_matches_causal_sdpa():
    """A fresh prompt (query_lens == context_lens) is ordinary causal self-attention: compare with torch SDPA."""
    lens = [24, 24]
    problem = make_problem(2, 8, 2, 64, 8, 24, torch.float32, seed=12, lens=lens, poison=True)
    gen = torch.Generator().manual_seed(2)
    query = torch.randn(2, 24, 8, 64, generator=gen)
    got = paged_prefill_attention(
        query,
        problem["key_cache"],
        problem["value_cache"],
        problem["block_tables"],
        problem["context_lens"],
        problem["context_lens"],
        backend="torch",
    )
    key, value = gather_contiguous(
        problem["key_cache"], problem["value_cache"], problem["block_tables"], problem["context_lens"]
    )
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    assert torch.allclose(got, expected, atol=1e-5)


# ------------------------------------------------------------------------------------- the "cpu" C kernel
@needs_cpu_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lens", [[1, 15, 16, 17, 32, 33, 48], [48]], ids=["boundaries", "one-sequence"])
@pytest.mark.parametrize(
    "heads", [(32, 8, 128), (12, 2, 48), (6, 1, 40)], ids=["group4-d128", "group6-d48", "group6-d40-plain"]
)
def test_cpu_kernel_lengths_and_work_split(dtype, lens, heads):
    """Block-boundary lengths; one sequence (its KV heads split over several work items); groups of 6 query
    rows (a 4-row register tile plus 2 single rows); head_dim 40, not a multiple of 16 (the plain loop on
    AVX-512 builds; tests/kernels/test_cpu_isa.py runs every ISA build)."""
    num_heads, num_kv_heads, head_dim = heads
    problem = make_problem(len(lens), num_heads, num_kv_heads, head_dim, 16, 48, dtype, seed=13, lens=lens)
    assert cpu_attention.head_split(1, 8, 2) == 8 and cpu_attention.head_split(16, 8, 2) == 1
    err = (paged_attention(**problem, backend="cpu").double() - reference_paged(**problem)).abs().max()
    assert err <= ATOL[dtype]


@needs_cpu_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_kernel_out_argument_and_scale(dtype):
    problem = make_problem(NUM_SEQS, 8, 2, 96, 8, 40, dtype, seed=4)
    expected = reference_paged(**problem, scale=0.3)
    problem["block_tables"] = problem["block_tables"].long()
    out = torch.full_like(problem["query"], float("nan"))
    got = paged_attention(**problem, scale=0.3, backend="cpu", out=out)
    assert got.data_ptr() == out.data_ptr() and (out.double() - expected).abs().max() <= ATOL[dtype]


def test_cpu_kernel_missing_compiler_is_reported_and_auto_falls_back(monkeypatch):
    monkeypatch.setenv(cpu_attention.ENV_COMPILER, "none")
    monkeypatch.setattr(cpu_attention, "_state", {})
    assert not cpu_attention.cpu_kernel_available()
    assert "no C compiler" in cpu_attention.cpu_kernel_error()
    assert "cpu" not in available_backends("cpu")
    assert resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(BackendUnavailableError, match="no C compiler"):
        paged_attention(**_small(), backend="cpu")


@needs_cpu_kernel
def test_cpu_kernel_is_built_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiler = cpu_attention._find_compiler()
    built, flags = cpu_attention._build(compiler)
    assert built.parent == tmp_path / "paged_attention_lab" and built.exists()
    assert flags[: len(cpu_attention.BASE_FLAGS)] == cpu_attention.BASE_FLAGS
    mtime = built.stat().st_mtime_ns
    assert cpu_attention._build(compiler) == (built, flags) and built.stat().st_mtime_ns == mtime


def test_cpu_backend_refuses_other_devices():
    with pytest.raises(BackendUnavailableError, match="CPU tensors"):
        resolve_backend("cpu", "meta")


def test_cpu_kernel_build_failure_keeps_the_full_compiler_log(monkeypatch, tmp_path):
    broken = tmp_path / "broken-cc"
    broken.write_text(
        '#!/bin/sh\necho "broken-cc 1.0"\necho "line 1 of the diagnostics" >&2\necho "error: deliberately broken" >&2\nexit 1\n'
    )
    broken.chmod(0o755)
    monkeypatch.setenv(cpu_attention.ENV_COMPILER, str(broken))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_attention, "_state", {})
    error = cpu_attention.cpu_kernel_error()
    assert "error: deliberately broken" in error and "full log is in" in error
    log = Path(error.split("full log is in ")[1].rstrip(")"))
    text = log.read_text()
    assert log.parent == tmp_path / "cache" / "paged_attention_lab"
    assert (
        text.count("line 1 of the diagnostics") == 2
    )  # both attempts (with and without -march=native), in full
    assert "-march=native" in text and "exit status 1" in text
    with pytest.raises(BackendUnavailableError, match="full log"):
        paged_attention(**_small(), backend="cpu")


# --------------------------------------------------------------------------------------------- sliding window
def _check_window_case(case, seed):
    head_dim, block_size, (heads, kv_heads), dtype = case
    window = (1, 5, 17, 40, 200)[seed % 5]  # one token, inside a block, across blocks, most of it, all of it
    problem = make_problem(NUM_SEQS, heads, kv_heads, head_dim, block_size, MAX_LEN, dtype, seed=seed)
    release_outside_window(problem, window)
    expected = reference_paged(**problem, sliding_window=window)
    for backend in CPU_BACKENDS:
        got = paged_attention(**problem, backend=backend, sliding_window=window)
        err = (got.double() - expected).abs().max().item()
        assert err <= ATOL[dtype], f"{backend}, window {window}: max abs error {err:.3g}"


@pytest.mark.parametrize("case", CI_GRID, ids=_case_id)
def test_sliding_window_decode_matches_reference(case):
    _check_window_case(case, seed=CI_GRID.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL_GRID, ids=_case_id)
def test_sliding_window_decode_full_grid(case):
    _check_window_case(case, seed=FULL_GRID.index(case))


@pytest.mark.parametrize("window", [1, 3, 8, 21])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sliding_window_prefill_matches_reference(dtype, window, monkeypatch):
    monkeypatch.setattr(torch_backend, "CHUNK_TARGET_BYTES", 1)  # many chunks: the merge runs with windows
    problem = make_problem(5, 8, 2, 64, 8, 40, dtype, seed=window)
    query = torch.randn(5, 9, 8, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    query_lens = torch.minimum(torch.tensor([9, 4, 0, 1, 7]), problem["context_lens"].long()).to(torch.int32)
    release_outside_window(problem, window, query_lens)
    args = (
        query,
        problem["key_cache"],
        problem["value_cache"],
        problem["block_tables"],
        problem["context_lens"],
    )
    expected = reference_paged(*args, query_lens=query_lens, sliding_window=window)
    for backend in CPU_BACKENDS:
        got = paged_prefill_attention(*args, query_lens, backend=backend, sliding_window=window)
        err = (got.double() - expected).abs().max().item()
        assert not torch.isnan(got).any() and err <= ATOL[dtype], f"{backend}: max abs error {err:.3g}"


def test_sliding_window_contiguous_matches_paged_and_is_validated():
    problem = make_problem(NUM_SEQS, 8, 2, 64, 16, MAX_LEN, torch.float32, seed=2, poison=False)
    key, value = gather_contiguous(
        problem["key_cache"], problem["value_cache"], problem["block_tables"], problem["context_lens"]
    )
    expected = reference_paged(**problem, sliding_window=20)
    for method in ("sdpa", "matmul"):
        got = contiguous_attention(
            problem["query"], key, value, problem["context_lens"], method=method, sliding_window=20
        )
        assert (got.double() - expected).abs().max() <= 1e-5
    with pytest.raises(InvalidArgumentError, match="sliding_window"):
        paged_attention(**problem, sliding_window=0)
    release_outside_window(problem, 20)
    with pytest.raises(InvalidArgumentError, match="block ids in use"):
        paged_attention(**problem)  # without the window, the released (-1) entries would be read
