"""vLLM's own CPU paged-attention kernel, timed on a problem the lab hands over. Run by vLLM's interpreter
(`.venv-vllm/bin/python bench/vllm_kernel_worker.py THREADS`), never imported by the project: vLLM
cannot be imported into the project's environment. It imports nothing from the project.

The problem file (torch.save) holds the contiguous decode problem the lab's bench measured: query [batch, heads,
head_dim], key and value [batch, context, kv_heads, head_dim] (zero past each length), context_lens [batch] and
block_size. The worker lays K/V into vLLM's CPU KV cache the way vLLM's CPU attention backend does
(vllm/v1/attention/backends/cpu_attn.py, vLLM 0.32): one [num_blocks, kv_heads, block_size, 2 * head_dim] tensor
viewed as [num_blocks, kv_heads, 2 * block_size, head_dim] and split into key and value halves, written by
`torch.ops._C.cpu_attn_reshape_and_cache` (which packs the blocks for the ISA the backend picks), with blocks
handed out in a random order; it builds the scheduler metadata once (`torch.ops._C.get_scheduler_metadata`, per
step in vLLM, shared by every layer) and then times `torch.ops._C.cpu_attention_with_kv_cache`, the per-layer call.

Protocol on stdin / stdout, one JSON object a line: at start it loads vLLM's kernels and prints {"vllm": version,
"torch": version, "threads": n}; "load PATH" lays out the problem in PATH and answers {"ready": true, "isa": the
ISA hint}; each "run" runs the kernel once and answers {"ms": wall time of the call, "cpu_ms": CPU time the worker
process used during it}; "output PATH" writes the output tensor to PATH and answers {"saved": PATH}; "quit" (or
end of input) exits. A failed command answers {"error": message} and the worker goes on.
"""

import json
import sys
import time

import torch


def _isa(dtype: torch.dtype, block_size: int, head_dim: int) -> str:
    """The ISA hint vLLM 0.32's `_get_attn_isa` picks on an x86 CPU for an "auto" KV cache."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return _get_attn_isa(dtype, block_size, head_dim, "auto")


def start(threads: int) -> dict:
    torch.set_num_threads(threads)
    # On a CPU with AMX (the "amx" ISA vLLM picks for bf16), Linux grants a process the AMX tile state only when it
    # asks (arch_prctl ARCH_REQ_XCOMP_PERM); a kernel using the tiles without it dies of SIGILL. PyTorch asks here,
    # as oneDNN does before its own AMX kernels.
    if torch.cpu._is_amx_tile_supported() and not torch._C._cpu._init_amx():
        raise RuntimeError("the CPU has AMX tiles but Linux refused this process their state")
    import vllm
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # loads vLLM's _C library, as its CPU worker does
    return {"vllm": vllm.__version__, "torch": torch.__version__, "threads": torch.get_num_threads()}


def load(path: str) -> tuple[dict, dict]:
    """The kernel's arguments for the problem in `path`, and {"ready": True, "isa": hint}."""
    p = torch.load(path, mmap=True)
    query, key, value = p["query"], p["key"], p["value"]
    context_lens = p["context_lens"].to(torch.int32)
    block_size = int(p["block_size"])
    batch, context, kv_heads, head_dim = key.shape
    num_heads = query.shape[1]
    dtype = query.dtype
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    block_table = order.view(batch, blocks_per_seq).contiguous()
    kv_cache = torch.zeros(num_blocks, kv_heads, block_size, 2 * head_dim, dtype=dtype)
    key_cache, value_cache = kv_cache.view(num_blocks, kv_heads, 2 * block_size, head_dim).chunk(2, dim=2)
    isa = _isa(dtype, block_size, head_dim)
    for b in range(batch):
        n = int(context_lens[b])
        positions = torch.arange(n, dtype=torch.int64)
        slots = block_table[b, positions // block_size].to(torch.int64) * block_size + positions % block_size
        torch.ops._C.cpu_attn_reshape_and_cache(
            key[b, :n].contiguous(),
            value[b, :n].contiguous(),
            key_cache,
            value_cache,
            slots,
            isa,
            1.0,
            1.0,
            "auto",
        )
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32)
    metadata = torch.ops._C.get_scheduler_metadata(
        batch,
        num_heads,
        kv_heads,
        head_dim,
        context_lens,
        dtype,
        query_start_loc,
        True,
        -1,
        isa,
        False,
        None,
        "auto",
    )
    query = query.contiguous()
    output = torch.empty_like(query)
    scale = head_dim**-0.5
    args = (query, key_cache, value_cache, output, query_start_loc, context_lens, scale, True, None, -1)
    rest = (block_table, 0.0, metadata, None, None, 1.0, 1.0, "auto")
    return {"args": args + rest, "output": output}, {"ready": True, "isa": isa}


def answer(command: str, arg: str, state: dict) -> dict:
    if command == "load":
        state.clear()
        loaded, reply = load(arg)
        state.update(loaded)
        return reply
    if not state:
        return {"error": f"{command!r} before any problem was loaded"}
    if command == "run":
        kernel = torch.ops._C.cpu_attention_with_kv_cache
        began, cpu = time.perf_counter(), time.process_time()
        kernel(*state["args"])
        return {"ms": (time.perf_counter() - began) * 1e3, "cpu_ms": (time.process_time() - cpu) * 1e3}
    if command == "output":
        torch.save(state["output"].clone(), arg)
        return {"saved": arg}
    return {"error": f"unknown command {command!r}: load PATH, run, output PATH or quit"}


def main() -> None:
    print(json.dumps(start(int(sys.argv[1]))), flush=True)
    state: dict = {}
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command in ("quit", ""):
            break
        try:
            reply = answer(command, arg, state)
        except Exception as error:  # the parent reads the message; the worker stays up
            reply = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
