"""The timing helpers behind bench/attention.py and the Kernels page, and the bench script's JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.errors import InvalidArgumentError, MemoryBudgetError
from core.kernels.timing import (
    KernelConfig,
    check_budget,
    copy_bandwidth_gbps,
    correctness,
    make_problem,
    measure,
    random_block_tables,
    sweep_contexts,
)

ROOT = Path(__file__).resolve().parents[2]
SMALL = KernelConfig(batch=3, context_len=100, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16)


def test_random_block_tables_hand_out_every_block_once_in_random_order():
    tables, lens = random_block_tables(6, 100, 16, ragged=True, generator=torch.Generator().manual_seed(3))
    assert tables.shape == (6, 7) and int(lens[-1]) == 100 and (lens >= 1).all()
    used = tables[tables >= 0]
    assert sorted(used.tolist()) == list(range(used.numel()))  # a pool of exactly the blocks in use
    assert used.tolist() != sorted(used.tolist())  # not sequential
    for row, length in zip(tables, lens, strict=True):
        blocks = -(-int(length) // 16)
        assert (row[:blocks] >= 0).all() and (row[blocks:] == -1).all()


def test_make_problem_contiguous_copy_equals_the_paged_cache():
    p = make_problem(SMALL, ragged=True)
    for s in range(SMALL.batch):
        for t in range(int(p["context_lens"][s])):
            block = p["block_tables"][s, t // 16]
            assert torch.equal(p["key"][s, t], p["key_cache"][block, t % 16])
            assert torch.equal(p["value"][s, t], p["value_cache"][block, t % 16])


def test_budget_refuses_before_allocating(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", str(SMALL.footprint_bytes - 1))
    with pytest.raises(MemoryBudgetError, match="budget") as info:
        make_problem(SMALL)
    assert info.value.requested_bytes == 3 * 2 * 3 * 100 * 2 * 64 * 4
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", str(SMALL.footprint_bytes))
    check_budget(SMALL)
    with pytest.raises(InvalidArgumentError, match="multiple"):
        check_budget(KernelConfig(batch=1, context_len=10, num_heads=6, num_kv_heads=4))


def test_measure_reports_consistent_numbers():
    rows = measure(SMALL, ["torch", "gather"], repeats=5)
    assert [r["backend"] for r in rows] == ["torch", "gather"]
    for r in rows:
        for name in ("paged_ms", "contiguous_ms", "ratio", "achieved_gbps", "contiguous_gbps"):
            assert 0 < r[f"{name}_p25"] <= r[name] <= r[f"{name}_p75"], name
        # a rate's quartiles come from the times' opposite quartiles
        assert r["achieved_gbps"] == pytest.approx(SMALL.kv_bytes / r["paged_ms"] / 1e6, rel=1e-3)
        assert r["achieved_gbps_p25"] == pytest.approx(SMALL.kv_bytes / r["paged_ms_p75"] / 1e6, rel=1e-3)
        # the quartiles are printed to 4 significant digits (each off by up to 5e-4 of itself), so their
        # difference is known to 1e-3 of p75: a narrow spread recomputed from them is that coarse
        rounding = 100 * 1e-3 * r["paged_ms_p75"] / r["paged_ms"]
        assert r["spread_pct"] == pytest.approx(
            100 * (r["paged_ms_p75"] - r["paged_ms_p25"]) / r["paged_ms"], rel=1e-2, abs=rounding
        )
        assert r["repeats"] == 5 and r["malloc_tuning"] and r["threads"] >= 1
        assert isinstance(r["busy"], bool)
        assert r["contiguous_method"] in ("sdpa", "matmul")
        assert r["max_abs_err"] < 1e-4
    assert copy_bandwidth_gbps("cpu", nbytes=8 * 1024**2, repeats=2) > 0


def test_correctness_and_sweep():
    errors = correctness(SMALL, ["torch", "gather"])
    assert set(errors) == {"torch", "gather"} and max(errors.values()) < 1e-5
    assert sweep_contexts(1024, 16) == [128, 256, 512, 1024]
    assert sweep_contexts(20, 16) == [20]
    assert sweep_contexts(10, 16) == [10]


def test_bench_script_prints_the_json_shape():
    # --no-vllm: vLLM's kernel baseline (vLLM's own interpreter, ~20 s) is tests/vllm/test_kernel_baseline.py's
    command = [sys.executable, "bench/attention.py", "--batches", "2", "--contexts", "64", "--repeats", "1"]
    proc = subprocess.run(
        [*command, "--no-vllm"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert {"device", "threads", "copy_gbps", "results", "settings"} <= set(report)
    keys = {"batch", "context_len", "dtype", "backend", "paged_ms", "contiguous_ms", "ratio", "achieved_gbps"}
    keys |= {"paged_ms_p25", "paged_ms_p75", "ratio_p25", "ratio_p75", "busy", "other_cores"}
    assert report["results"] and all(keys <= set(r) for r in report["results"])
    assert {r["dtype"] for r in report["results"]} == {"float32", "bfloat16"}
    assert report["vllm_kernel"] == {"error": "skipped (--no-vllm)"}
