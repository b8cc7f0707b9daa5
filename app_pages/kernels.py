"""Kernels: paged attention vs the contiguous baseline — overhead with its spread, correctness, latency, bandwidth,
block map. Every input lives in the URL."""

import datetime
import time

import streamlit as st
import torch

from core.common import cdiv
from core.device import default_device, device_label, format_bytes, memory_budget_bytes
from core.errors import LabError
from core.kernels.attention import available_backends
from core.kernels.timing import check_budget, random_block_tables, tolerance
from core.page_models.tasks import kernel_correctness, kernel_sweep
from ui.charts import cached_chart, cached_dataframe, cached_value
from ui.jobs import app_limits, run_job
from ui.kernels.figures import bandwidth_figure, block_map_figure, latency_figure, overhead_figure
from ui.kernels.state import BACKENDS_KEY, FIELDS, config_of, parse_backends, url_params
from ui.url_widgets import UrlState

REPEATS = 11  # timed rounds per point, after core.page_models.tasks.SWEEP_WARMUP untimed ones: as bench/attention.py
MAP_MAX_BLOCKS = 1024  # cells of the block-map picture
PICK = "k_backends_pick"  # the multiselect's key: the URL keeps the list as one comma-separated string
MEASUREMENT = "_kernels_measurement"  # bumped by "Measure again": a new cache key, a fresh sweep

DEVICE = default_device()
BACKENDS = available_backends(DEVICE)
state = UrlState("_kernels", FIELDS)


def sync_inputs() -> list[str]:
    """Seed the widgets from the URL when it changed; the messages about parameters that were not used."""
    messages = []
    if state.sync_from_url():
        backends, messages = parse_backends(state.values[BACKENDS_KEY], BACKENDS)
        st.session_state[PICK] = backends
    elif PICK not in st.session_state:
        st.session_state[PICK] = parse_backends(state.values[BACKENDS_KEY], BACKENDS)[0]
    return state.pop_errors() + messages


def inputs_form() -> None:
    """The form beside the charts: a run starts when it is submitted (each value also goes into the URL)."""
    window_help = (
        "0 = full attention. Each query attends to its last W positions only (Mistral, Gemma, gpt-oss layers); "
        "the paged kernels then read only the blocks inside the window, the contiguous baseline masks the rest."
    )
    rows = [
        [(st.selectbox, "query heads", "heads", None), (st.selectbox, "KV heads", "kv_heads", None)],
        [(st.selectbox, "head_dim", "head_dim", None), (st.selectbox, "block size (tokens)", "block", None)],
        [
            (st.number_input, "batch (sequences)", "batch", None),
            (st.number_input, "context length (tokens)", "ctx", None),
        ],
        [
            (st.selectbox, "dtype", "dtype", None),
            (st.number_input, "sliding window (tokens)", "window", window_help),
        ],
    ]
    with st.form("kernel_config"):
        for row in rows:
            for column, (factory, label, key, help_text) in zip(st.columns(2), row, strict=True):
                with column:
                    state.widget(factory, label, key, help=help_text)
        picked = st.multiselect("paged backends", BACKENDS, key=PICK)
        state.values[BACKENDS_KEY] = ",".join(picked)
        st.form_submit_button("Run check and sweep", type="primary", width="stretch")
    st.caption(
        f"Device `{device_label(DEVICE)}`. Memory budget {format_bytes(memory_budget_bytes())} for the paged "
        "cache plus its contiguous and gathered copies (set `PAGED_LAB_MAX_BYTES` to change)."
    )


def verdict(rows: list[dict], errors: dict[str, float], limit: float, context_len: int) -> str:
    """The answer in one sentence: the overhead of each backend at the chosen size, and whether all are correct."""
    last = [r for r in rows if r["context_len"] == context_len]
    parts = ", ".join(
        f"**{r['backend']} {r['ratio']:.2f}x** (middle half {r['ratio_p25']:.2f}-{r['ratio_p75']:.2f}x)"
        for r in last
    )
    worst = max(errors.values())
    correct = (
        f"every backend matches contiguous attention (max abs error {worst:.1e} <= {limit:.0e})"
        if worst <= limit
        else f"**a backend differs from contiguous attention** (max abs error {worst:.1e} > {limit:.0e})"
    )
    return f"Paged / contiguous latency at {context_len:,} tokens: {parts}; {correct}."


def measured_caption(sweep: dict) -> str:
    settings = sweep["settings"]
    at = datetime.datetime.fromtimestamp(sweep["measured_at"], tz=datetime.UTC)
    minutes = max(0, int((time.time() - sweep["measured_at"]) // 60))
    ago = "just now" if minutes == 0 else f"{minutes:,} min ago"
    return (
        f"Measured at {at:%H:%M:%S} UTC ({ago}; results are shared with every visitor for up to "
        f"{app_limits().cache_ttl_s / 60:,.0f} min): {REPEATS} timed rounds per point after warm-up, "
        f"{settings['threads']} torch threads, malloc tuning {'on' if settings['malloc_tuning'] else 'off'}, "
        f"worker niceness {settings['niceness']}. `python bench/attention.py` times through the same code."
    )


def block_map_sample(batch: int, context_len: int, block_size: int) -> tuple:
    """`block_map_figure`'s arguments for the first of `batch` sequences with the same random block assignment
    as the measured problem: its table, its length, the block size, the pool size and the other sequences'
    blocks."""
    tables, lens = random_block_tables(
        batch, context_len, block_size, generator=torch.Generator().manual_seed(0)
    )
    others = {int(b) for b in tables[1:].flatten().tolist() if b >= 0}
    return tables[0].tolist(), int(lens[0]), block_size, int(tables.max()) + 1, others


# ---- the page -----------------------------------------------------------------------------------------------------
st.title("Kernels: paged vs contiguous attention")
st.markdown(
    "PagedAttention reads K/V through a block table instead of one contiguous tensor; this page checks that it "
    "computes the same numbers as ordinary attention and measures what the indirection costs on this machine, "
    "with the spread of repeated runs (the paper reports 20-26% kernel overhead)."
)
for message in sync_inputs():
    st.error(message)

answer, side = st.columns([3, 2], gap="medium")
with side:
    inputs_form()
values = dict(state.values)
state.write_url(url_params(values))  # before anything can fail: a shared link reproduces the inputs

config = config_of(values)
backends = tuple(st.session_state[PICK])
with answer:
    try:
        config.validate()
        if not backends:
            raise LabError("pick at least one paged backend")
        check_budget(config)  # refuses before anything is allocated
    except LabError as error:
        st.error(f"Cannot run this configuration: {error}")
        st.stop()
    device = str(DEVICE)
    try:
        errors = run_job(kernel_correctness, config, backends, device, label="Checking correctness")
        measurement = st.session_state.get(MEASUREMENT, 0)
        sweep = run_job(kernel_sweep, config, backends, device, REPEATS, measurement, label="Latency sweep")
    except LabError as error:  # in the worker pool, so other sessions' pages keep rendering meanwhile
        st.error(f"The measurement failed to run: {error}")
        st.stop()
    rows, limit = sweep["rows"], tolerance(config.dtype)
    st.markdown(verdict(rows, errors, limit, config.context_len))
    cached_chart(st, overhead_figure, rows)
    if st.button("Measure again", help="a fresh sweep now, instead of the shared result of an earlier run"):
        st.session_state[MEASUREMENT] = measurement + 1
        st.rerun()
    st.caption(measured_caption(sweep))

st.markdown(
    f"**{config.batch:,} sequences x {config.context_len:,} tokens**, {config.num_heads} query / "
    f"{config.num_kv_heads} KV heads x {config.head_dim} dims, {config.dtype}: one decode step reads "
    f"{format_bytes(config.kv_bytes)} of K and V ({config.kv_bytes:,} bytes)"
    + (
        f", the last {config.visible_tokens:,} tokens of each sequence (sliding window)."
        if config.sliding_window
        else "."
    )
)
last = [r for r in rows if r["context_len"] == config.context_len]
if last:
    summary = ", ".join(
        f"{r['backend']} {r['paged_ms']:,.2f} ms ({r['ratio']:.2f}x, {r['achieved_gbps']:,.1f} GB/s)"
        for r in last
    )
    st.markdown(
        f"At {config.context_len:,} tokens: contiguous {last[0]['contiguous_ms']:,.2f} ms "
        f"({last[0]['contiguous_method']}); paged {summary}. Copy bandwidth {sweep['copy_gbps']:,.1f} GB/s."
    )
left, right = st.columns(2)
cached_chart(left, latency_figure, rows)
cached_chart(right, bandwidth_figure, rows, sweep["copy_gbps"], sweep.get("copy"))

# ---- correctness -----------------------------------------------------------------------------------------------
st.subheader("Correctness: paged vs contiguous")
left, right = st.columns([1, 1])
with left:
    for name, err in errors.items():
        passed = err <= limit
        # a verdict, not a change: no arrow; a failure in red
        verdict = {"delta_color": "off" if passed else "red", "delta_arrow": "off"}
        st.metric(f"max abs error, {name}", f"{err:.2e}", "pass" if passed else "FAIL", **verdict)
    st.caption(
        "Random lengths in [1, context] (the last sequence is the longest), block tables in random order with -1 "
        f"padding; the same K/V laid out contiguously go through SDPA. Pass means max abs error <= {limit:.0e}."
    )

# ---- block map -------------------------------------------------------------------------------------------------
blocks_per_seq = cdiv(config.context_len, config.block_size)
map_context = min(config.context_len, MAP_MAX_BLOCKS * config.block_size)
map_blocks_per_seq = cdiv(map_context, config.block_size)
map_batch = max(1, min(config.batch, MAP_MAX_BLOCKS // map_blocks_per_seq))
cached_chart(
    right, block_map_figure, *cached_value(block_map_sample, map_batch, map_context, config.block_size)
)
if map_batch < config.batch or map_context < config.context_len:
    right.caption(
        f"Drawn for {map_batch:,} of {config.batch:,} sequences and {map_context:,} of {config.context_len:,} "
        f"tokens ({blocks_per_seq:,} blocks per sequence) to keep the picture small; the measured problem uses "
        "the same random block assignment at full size."
    )
else:
    right.caption(
        "Each sequence's blocks are assigned in random order, as a long-running block manager would."
    )

with st.expander("Result rows (the bench JSON format)"):
    cached_dataframe(st, rows)
    check = [
        {
            "backend": name,
            "max |paged - contiguous|": f"{err:.2e}",
            "tolerance": f"{limit:.0e}",
            "result": "pass" if err <= limit else "FAIL",
        }
        for name, err in errors.items()
    ]
    cached_dataframe(st, check)
