"""The NEON build of the C kernel, checked on an x86-64 machine: cross-compiled (aarch64-linux-gnu-gcc) with the
neon flags, run under qemu-user through tests/kernels/paged_rows_driver.c, compared with the float64 reference.

Where the cross compiler or qemu-aarch64 is missing (`apt-get install gcc-aarch64-linux-gnu qemu-user`), or the
machine is AArch64 itself (test_cpu_isa.py then runs the native neon build), the tests are skipped.
"""

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

import core.kernels.cpu_backend as cpu_backend
from core.kernels.cpu_isa import FLAG_SETS, machine
from tests.kernels.reference_attention import make_problem, reference_paged, release_outside_window

CROSS_CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
DRIVER = Path(__file__).with_name("paged_rows_driver.c")
pytestmark = pytest.mark.skipif(
    machine() == "aarch64" or not (CROSS_CC and QEMU),
    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 on a non-AArch64 machine",
)
ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@pytest.fixture(scope="module")
def neon_driver(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("neon") / "paged_rows_neon"
    flags = [f for f in cpu_backend.BASE_FLAGS if f not in ("-shared", "-fPIC")] + list(FLAG_SETS["neon"][-1])
    kernel = f'-DKERNEL="{cpu_backend.SOURCE_PATH}"'
    proc = subprocess.run(
        [CROSS_CC, *flags, "-static", kernel, str(DRIVER), "-o", str(exe), "-lm"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exe


def _run(exe: Path, problem: dict, window: int | None) -> tuple[torch.Tensor, str]:
    """The driver's output for a decode `problem` (query heads grouped into rows per KV head) and its ISA."""
    query, key_cache = problem["query"], problem["key_cache"]
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    table = problem["block_tables"].to(torch.int64).contiguous()  # [S, max_blocks]
    row_pos = (problem["context_lens"].long() - 1)[:, None].expand(num_seqs, group).contiguous()  # [S, R]
    header = (num_seqs, num_kv_heads, group, head_dim, block_size, CODES[query.dtype], table.shape[1])
    header += (cpu_backend.FULL_WINDOW if window is None else window, num_blocks)
    payload = struct.pack("<9q", *header) + struct.pack("<f", head_dim**-0.5)

    def raw(t: torch.Tensor) -> bytes:
        t = t.contiguous()
        return (t.view(torch.int16) if t.element_size() == 2 else t).numpy().tobytes()

    for tensor in (query, key_cache, problem["value_cache"], table, row_pos):
        payload += raw(tensor)
    proc = subprocess.run([QEMU, str(exe)], input=payload, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = torch.frombuffer(bytearray(proc.stdout), dtype=torch.float32)
    return out.reshape(num_seqs, num_heads, head_dim), proc.stderr.decode().strip()


@pytest.mark.parametrize(
    "case",
    [
        (128, 16, 32, 8, torch.float32, None),
        (128, 16, 32, 8, torch.bfloat16, None),
        (64, 8, 24, 4, torch.float16, None),
        (40, 16, 6, 1, torch.float32, None),
        (36, 32, 16, 2, torch.bfloat16, None),
        (22, 16, 4, 1, torch.float32, None),
        (128, 16, 32, 8, torch.float32, 17),
        (96, 8, 8, 2, torch.bfloat16, 5),
    ],
    ids=lambda c: f"d{c[0]}-bs{c[1]}-h{c[2]}/{c[3]}-{str(c[4]).removeprefix('torch.')}-w{c[5]}",
)
def test_neon_build_matches_the_float64_reference(neon_driver, case):
    head_dim, block_size, heads, kv_heads, dtype, window = case
    problem = make_problem(7, heads, kv_heads, head_dim, block_size, 47, dtype, seed=head_dim)
    if window is not None:
        release_outside_window(problem, window)
    expected = reference_paged(**problem, sliding_window=window)
    got, isa = _run(neon_driver, problem, window)
    assert isa == "neon"
    assert not torch.isnan(got).any()
    err = (got.double() - expected).abs().max().item()
    assert err <= ATOL[dtype], f"neon: max abs error {err:.3g} > {ATOL[dtype]}"
