"""Kernels: paged attention vs the contiguous baseline — correctness, latency, overhead, bandwidth, block map."""

import pandas as pd
import streamlit as st
import torch

from core.common import cdiv
from core.device import default_device, device_label, format_bytes, memory_budget_bytes
from core.errors import LabError
from core.jobs.tasks import kernel_correctness, kernel_sweep
from core.kernels.attention import available_backends
from core.kernels.timing import KernelConfig, check_budget, random_block_tables, tolerance
from ui.charts import cached_chart
from ui.jobs import run_job
from ui.kernel_figures import bandwidth_figure, block_map_figure, latency_figure, overhead_figure

REPEATS = 5
MAP_MAX_BLOCKS = 1024  # cells of the block-map picture

st.title("Kernels: paged vs contiguous attention")
st.markdown(
    "PagedAttention reads K/V through a block table instead of one contiguous tensor; this page checks that it "
    "computes the same numbers as ordinary attention and measures what the indirection costs on this machine "
    "(the paper reports 20-26% kernel overhead)."
)

DEVICE = default_device()
BACKENDS = available_backends(DEVICE)


with st.form("kernel_config"):
    row = st.columns(4)
    num_heads = row[0].selectbox("query heads", [8, 16, 32, 40, 64, 128], index=2)
    num_kv_heads = row[1].selectbox("KV heads", [1, 2, 4, 8, 16, 32, 40, 64, 128], index=3)
    head_dim = row[2].selectbox("head_dim", [64, 80, 96, 112, 128, 256], index=4)
    block_size = row[3].selectbox("block size (tokens)", [8, 16, 32], index=1)
    row = st.columns(4)
    batch = int(row[0].number_input("batch (sequences)", min_value=1, max_value=4096, value=4, step=1))
    context_len = int(
        row[1].number_input("context length (tokens)", min_value=1, max_value=1_048_576, value=1024, step=256)
    )
    dtype = row[2].selectbox("dtype", ["float32", "bfloat16", "float16"])
    backends = row[3].multiselect("paged backends", BACKENDS, default=BACKENDS)
    with st.expander("Sliding window (Mistral, Gemma, gpt-oss layers)"):
        window = int(
            st.number_input(
                "sliding window (tokens; 0 = full attention)",
                min_value=0,
                max_value=1_048_576,
                value=0,
                step=128,
                help="Each query attends to its last W positions only; the paged kernels then read only the "
                "blocks inside the window, the contiguous baseline masks the rest.",
            )
        )
    st.form_submit_button("Run check and sweep", type="primary")

st.caption(
    f"Device `{device_label(DEVICE)}`. Memory budget {format_bytes(memory_budget_bytes())} for the paged cache "
    "plus its contiguous and gathered copies (set `PAGED_LAB_MAX_BYTES` to change)."
)

sliding_window = window or None
config = KernelConfig(
    batch, context_len, num_heads, num_kv_heads, head_dim, block_size, dtype, sliding_window
)
try:
    config.validate()
    if not backends:
        raise LabError("pick at least one paged backend")
    check_budget(config)  # refuses before anything is allocated
except LabError as error:
    st.error(f"Cannot run this configuration: {error}")
    st.stop()

device = str(DEVICE)
backends = tuple(backends)
st.markdown(
    f"**{batch:,} sequences x {context_len:,} tokens**, {num_heads} query / {num_kv_heads} KV heads x "
    f"{head_dim} dims, {dtype}: one decode step reads {format_bytes(config.kv_bytes)} of K and V "
    f"({config.kv_bytes:,} bytes)"
    + (
        f", the last {config.visible_tokens:,} tokens of each sequence (sliding window)."
        if sliding_window
        else "."
    )
)

# ---- correctness -------------------------------------------------------------------------------------------
st.subheader("Correctness: paged vs contiguous")
try:
    errors = run_job(kernel_correctness, config, backends, device, label="Checking correctness")
except LabError as error:
    st.error(f"Correctness check failed to run: {error}")
    st.stop()
limit = tolerance(dtype)
check = pd.DataFrame(
    [
        {
            "backend": name,
            "max |paged - contiguous|": f"{err:.2e}",
            "tolerance": f"{limit:.0e}",
            "result": "pass" if err <= limit else "FAIL",
        }
        for name, err in errors.items()
    ]
)
cols = st.columns(len(errors))
for col, (name, err) in zip(cols, errors.items(), strict=True):
    col.metric(f"max abs error, {name}", f"{err:.2e}", "pass" if err <= limit else "FAIL", delta_color="off")
st.caption(
    "Random lengths in [1, context] (the last sequence is the longest), block tables in random order with -1 "
    f"padding; the same K/V laid out contiguously go through SDPA. Pass means max abs error <= {limit:.0e}."
)

# ---- latency sweep -----------------------------------------------------------------------------------------
st.subheader("Latency sweep")
try:  # in the worker pool, so other sessions' pages keep rendering while this times kernels
    sweep = run_job(kernel_sweep, config, backends, device, REPEATS, label="Latency sweep")
except LabError as error:
    st.error(f"Latency sweep failed to run: {error}")
    st.stop()
copy_gbps, contexts, rows = sweep["copy_gbps"], sweep["contexts"], sweep["rows"]
st.caption(f"{len(contexts)} context lengths, median of {REPEATS} runs each (cached for everyone).")

last = [r for r in rows if r["context_len"] == context_len]
summary = ", ".join(
    f"{r['backend']} {r['paged_ms']:,.2f} ms ({r['ratio']:.2f}x, {r['achieved_gbps']:,.1f} GB/s)"
    for r in last
)
if last:
    st.markdown(
        f"At {context_len:,} tokens: contiguous {last[0]['contiguous_ms']:,.2f} ms "
        f"({last[0]['contiguous_method']}); paged {summary}. Copy bandwidth {copy_gbps:,.1f} GB/s."
    )

left, right = st.columns(2)
cached_chart(left, latency_figure, rows)
cached_chart(right, overhead_figure, rows)
left, right = st.columns(2)
cached_chart(left, bandwidth_figure, rows, copy_gbps)

# ---- block map ---------------------------------------------------------------------------------------------
blocks_per_seq = cdiv(context_len, block_size)
map_context = min(context_len, MAP_MAX_BLOCKS * block_size)
map_blocks_per_seq = cdiv(map_context, block_size)
map_batch = max(1, min(batch, MAP_MAX_BLOCKS // map_blocks_per_seq))
tables, lens = random_block_tables(
    map_batch, map_context, block_size, generator=torch.Generator().manual_seed(0)
)
pool = int(tables.max()) + 1
others = {int(b) for b in tables[1:].flatten().tolist() if b >= 0}
cached_chart(right, block_map_figure, tables[0].tolist(), int(lens[0]), block_size, pool, owned=others)
if map_batch < batch or map_context < context_len:
    right.caption(
        f"Drawn for {map_batch:,} of {batch:,} sequences and {map_context:,} of {context_len:,} tokens "
        f"({blocks_per_seq:,} blocks per sequence) to keep the picture small; the measured problem uses the same "
        "random block assignment at full size."
    )
else:
    right.caption(
        "Each sequence's blocks are assigned in random order, as a long-running block manager would."
    )

with st.expander("Result rows (the bench JSON format)"):
    st.dataframe(pd.DataFrame(rows), hide_index=True)
    st.dataframe(check, hide_index=True)
