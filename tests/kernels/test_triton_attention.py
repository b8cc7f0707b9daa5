"""The Triton paged attention kernel against the float64 per-token reference.

Without a GPU the kernel runs under TRITON_INTERPRET=1, which must be set before `core.kernels.triton_backend` is
imported: the check runs in a fresh Python process so this pytest process (and any GPU test) is unaffected.
The interpreter costs a few ms per program step, so that grid is tiny. With CUDA, the full vLLM-like grid runs
on the GPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip(
    "triton", reason="triton does not import here; the Triton backend cannot be tested"
)

ROOT = Path(__file__).resolve().parents[2]

INTERPRETED_CHECK = r"""
import json, sys
import torch
from core.kernels.attention import paged_attention, paged_prefill_attention
from tests.kernels.reference_attention import make_problem, reference_paged, release_outside_window

results = []
cases = [  # (num_seqs, heads, kv_heads, head_dim, block_size, max_len, dtype)
    (3, 4, 2, 64, 8, 21, torch.float32),
    (3, 4, 1, 80, 16, 33, torch.bfloat16),
    (2, 2, 2, 96, 8, 17, torch.float16),
    (2, 32, 1, 64, 16, 20, torch.float32),  # 32 rows per KV head: two row tiles
]
for seed, (seqs, heads, kv, dim, bs, max_len, dtype) in enumerate(cases):
    p = make_problem(seqs, heads, kv, dim, bs, max_len, dtype, seed=seed)
    out = torch.full_like(p["query"], float("nan"))
    got = paged_attention(**p, backend="triton", out=out)
    err = (got.double() - reference_paged(**p)).abs().max().item()
    results.append({"case": f"decode d{dim} bs{bs} h{heads}/{kv} {dtype}", "err": err, "dtype": str(dtype),
                    "nan": bool(torch.isnan(out).any()), "same_buffer": got.data_ptr() == out.data_ptr()})
p = make_problem(3, 4, 2, 32, 8, 20, torch.float32, seed=7)
query = torch.randn(3, 5, 4, 32, generator=torch.Generator().manual_seed(0))
qlens = torch.minimum(torch.tensor([5, 2, 0]), p["context_lens"].long()).to(torch.int32)
args = (query, p["key_cache"], p["value_cache"], p["block_tables"], p["context_lens"])
got = paged_prefill_attention(*args, qlens, backend="triton")
err = (got.double() - reference_paged(*args, query_lens=qlens)).abs().max().item()
results.append({"case": "prefill d32 bs8 h4/2", "err": err, "dtype": "torch.float32",
                "nan": bool(torch.isnan(got).any()), "same_buffer": True})
for window in (5, 12):  # sliding window: released blocks are -1 and NaN, never read
    p = release_outside_window(make_problem(3, 4, 2, 32, 8, 30, torch.float32, seed=window), window)
    got = paged_attention(**p, backend="triton", sliding_window=window)
    err = (got.double() - reference_paged(**p, sliding_window=window)).abs().max().item()
    results.append({"case": f"decode window {window}", "err": err, "dtype": "torch.float32",
                    "nan": bool(torch.isnan(got).any()), "same_buffer": True})
p = make_problem(3, 4, 2, 32, 8, 20, torch.float32, seed=8)
qlens = torch.minimum(torch.tensor([5, 2, 0]), p["context_lens"].long()).to(torch.int32)
release_outside_window(p, 6, qlens)
args = (query, p["key_cache"], p["value_cache"], p["block_tables"], p["context_lens"])
got = paged_prefill_attention(*args, qlens, backend="triton", sliding_window=6)
err = (got.double() - reference_paged(*args, query_lens=qlens, sliding_window=6)).abs().max().item()
results.append({"case": "prefill window 6", "err": err, "dtype": "torch.float32",
                "nan": bool(torch.isnan(got).any()), "same_buffer": True})
print(json.dumps(results))
"""

ATOL = {"torch.float32": 1e-5, "torch.bfloat16": 1e-2, "torch.float16": 1e-2}


def test_triton_kernel_under_interpreter_matches_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", INTERPRETED_CHECK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 8
    for result in results:
        assert not result["nan"], f"{result['case']}: NaN leaked into the output"
        assert result["same_buffer"], f"{result['case']}: out= was not written in place"
        assert result["err"] <= ATOL[result["dtype"]], f"{result['case']}: max abs error {result['err']:.3g}"


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the interpreted test covers CPU)"
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_triton_kernel_on_gpu_full_grid(dtype):
    from core.kernels.attention import paged_attention
    from tests.kernels.reference_attention import make_problem, reference_paged, release_outside_window
    from tests.kernels.test_attention import ATOL as GRID_ATOL
    from tests.kernels.test_attention import BLOCK_SIZES, HEAD_CONFIGS, HEAD_DIMS, MAX_LEN, NUM_SEQS

    for head_dim in HEAD_DIMS:
        for block_size in BLOCK_SIZES:
            for heads, kv_heads in HEAD_CONFIGS:
                p = make_problem(
                    NUM_SEQS, heads, kv_heads, head_dim, block_size, MAX_LEN, dtype, seed=head_dim
                )
                expected = reference_paged(**p)
                gpu = {k: v.cuda() for k, v in p.items()}
                got = paged_attention(**gpu, backend="auto").cpu()
                err = (got.double() - expected).abs().max().item()
                assert err <= GRID_ATOL[dtype], f"d{head_dim} bs{block_size} h{heads}/{kv_heads}: {err:.3g}"
                release_outside_window(p, 20)  # the same problem with a 20-token sliding window
                expected = reference_paged(**p, sliding_window=20)
                gpu = {k: v.cuda() for k, v in p.items()}
                got = paged_attention(**gpu, backend="auto", sliding_window=20).cpu()
                err = (got.double() - expected).abs().max().item()
                assert err <= GRID_ATOL[dtype], f"window 20, d{head_dim} bs{block_size}: {err:.3g}"
