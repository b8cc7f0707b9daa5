"""vLLM's own CPU paged-attention kernel (the installed wheel's `torch.ops._C.cpu_attention_with_kv_cache`, run by
bench/vllm_kernel.py in vLLM's interpreter), the baseline `bench.attention` times the lab's kernel against: fed the
lab's problem, it computes what contiguous attention computes on the same K/V (so the bench times vLLM's kernel on
the right data, laid out as vLLM's CPU backend lays it out), in both dtypes the two kernels share, with a context
that ends inside a block."""

import pytest
import torch

from core.errors import VLLMUnavailableError
from core.kernels.timing import KernelConfig


@pytest.fixture(scope="module")
def vllm_kernel():
    from bench.vllm_kernel import VLLMKernel
    from tests.vllm_server import _unavailable

    try:
        with VLLMKernel(threads=1) as kernel:
            yield kernel
    except VLLMUnavailableError as error:
        _unavailable(str(error))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllms_kernel_computes_attention_on_the_labs_problem(vllm_kernel, dtype):
    from bench.vllm_kernel import compare

    row = compare(KernelConfig(batch=3, context_len=200, dtype=dtype), vllm_kernel, repeats=2, warmup=1)
    assert row["vllm_isa"] in ("vec", "amx", "vec16") and row["vllm_block_size"] == 32
    assert row["vllm_max_abs_err"] <= row["tolerance"] and row["lab_max_abs_err"] <= row["tolerance"]
    assert row["vllm_ms"] > 0 and row["lab_ms"] > 0 and row["ratio"] > 0
    assert vllm_kernel.info["torch"] == torch.__version__  # the problem file crosses between equal torches
