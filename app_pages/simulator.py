"""Serving simulator: replay a workload through the real block manager and through Orca's contiguous allocators."""

import json
import math

import streamlit as st

from core.errors import LabError
from core.limits import Limits
from core.page_models.simulator import SimulatorParams, saturating_load
from core.page_models.tasks import compare_policies, measure_simulated_attention
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.serving.simulator import PAPER_KV_TOKENS
from core.serving.workload import load_trace
from core.uploads import read_upload
from ui.block_grid import MAX_CELLS, grid_shape
from ui.charts import cached_chart
from ui.jobs import app_limits, run_job
from ui.simulator.figures import (
    PAPER_MODEL,
    attention_latency_figure,
    block_heatmap_figure,
    free_memory_figure,
    label,
    memory_breakdown_figure,
    running_waiting_figure,
    steps_table,
    summary_bars_figure,
    tier_hits_figure,
    verdict_text,
)
from ui.simulator.state import FIELDS, params_from, url_params
from ui.url_widgets import UrlState

DATASET_LABELS = {
    "sharegpt": "ShareGPT-like (mean 161 in / 338 out)",
    "alpaca": "Alpaca-like (mean 19 in / 58 out)",
    "fixed": "Fixed lengths",
    "uniform": "Uniform lengths",
    "trace": "Upload a trace (CSV / JSONL)",
}
CAPACITY_LABELS = {
    "paper": f"Paper: {PAPER_KV_TOKENS:,} slots (OPT-13B, A100-40GB, 12 GiB)",
    "model": "From the model + GPU (vLLM's memory rule)",
    "raw": "Raw number of token slots",
}


state = UrlState("_simulator", FIELDS)


@st.cache_data(show_spinner=False, max_entries=8)
def _parse_trace(data: bytes, max_len: int, max_len_source: str, limits: Limits):
    return tuple(load_trace(data, max_len=max_len, max_len_source=max_len_source, limits=limits))


st.title("Serving simulator")
st.markdown(
    "Replays a serving workload through an iteration-level scheduler, once with the real paged block manager and "
    "once per contiguous Orca allocator, and shows where the KV memory goes: this is why paging batches 3-4x more "
    "requests on the same GPU (the paper's Figures 2 and 13). Every setting is in the URL: copy it to share the run."
)
answer = st.container()  # the verdict and the main chart, drawn once the run is done, above the settings

state.sync_from_url()
with answer:  # at the top of the answer, which is computed with the defaults put in their place
    for message in state.pop_errors():  # shown once; the URL is rewritten with valid values below
        st.error(message)
w = state.widget
with st.expander("Workload, model, policies and scheduler settings", expanded=False), st.form("simulator"):
    c1, c2, c3 = st.columns(3)
    with c1:
        st.markdown("**Workload**")
        dataset = w(st.selectbox, "Workload", "dataset", format_func=DATASET_LABELS.get)
        upload = st.file_uploader(
            "Trace (arrival_time, prompt_len, output_len[, n, prefix_group, prefix_len])",
            type=["csv", "jsonl", "json"],
        )
        w(st.number_input, "Requests", "num_requests")
        w(st.checkbox, "All requests at t = 0", "all_at_once")
        w(st.number_input, "Arrival rate (requests/s, Poisson)", "rate")
        w(st.number_input, "Seed", "seed")
        w(st.number_input, "Parallel samples per prompt (n)", "n")
        w(st.number_input, "Shared system prompt (tokens)", "prefix_len")
        w(st.slider, "Requests with the shared prompt", "prefix_fraction")
        w(st.number_input, "Fixed prompt length (tokens)", "fixed_prompt")
        w(st.number_input, "Fixed output length (tokens)", "fixed_output")
    with c2:
        st.markdown("**Model, GPU and KV capacity**")
        model = w(st.selectbox, "Model", "model", format_func=lambda m: MODELS[m].name)
        w(st.selectbox, "GPU", "gpu", format_func=lambda g: GPUS[g].name)
        capacity_source = w(st.radio, "KV capacity", "capacity", format_func=CAPACITY_LABELS.get)
        saturate = w(
            st.checkbox,
            "Size the load to the GPU's memory (model + GPU capacity)",
            "saturate",
            help="A burst of requests asking for 1.2x the pool's tokens, with max_num_seqs raised so that as many "
            "can run as the pool holds: replaces the requests, arrival and scheduler limits set here.",
        )
        w(st.number_input, "Raw capacity (token slots)", "raw_capacity")
        w(st.number_input, "Per-step overhead (ms)", "overhead_ms")
        st.caption(
            "Step time = overhead + max(weights + KV bytes / (80% of bandwidth), FLOPs / (50% of peak)). "
            "The 15 ms overhead (scheduling, sampling, launches) is what made the paper's vLLM run memory-bound."
        )
    with c3:
        st.markdown("**Policies and scheduler**")
        w(st.multiselect, "Policies", "policies", format_func=label)
        w(st.selectbox, "Block size (tokens)", "block_size")
        w(st.checkbox, "Prefix caching (paged)", "prefix_caching")
        hybrid = w(
            st.checkbox,
            "Hybrid KV cache manager (per-group blocks)",
            "hybrid",
            help="Paged policy only; for models mixing full and sliding-window layers (e.g. Gemma 2, gpt-oss).",
        )
        w(
            st.number_input,
            "Host KV tier (GiB)",
            "kv_offload_gib",
            help="vLLM's native CPU offloading (--kv-offloading-size) behind the paged pool, 0 = none; needs "
            "prefix caching. Every computed block is copied to host memory; a prefix that left HBM is loaded back "
            "over the host link (50 GB/s) instead of recomputed.",
        )
        w(st.selectbox, "Host tier eviction", "offload_policy", format_func=str.upper)
        w(st.number_input, "max_num_seqs", "max_num_seqs")
        w(st.number_input, "max_num_batched_tokens", "max_tokens")
        w(st.radio, "Preemption", "preemption", horizontal=True)
        w(st.number_input, "Swap space (GiB)", "swap_gib")
        measure = w(st.checkbox, "Measure attention latency with the real kernels", "measure")
        budget_s = w(st.number_input, "Measurement time budget (s)", "budget_s")
    st.form_submit_button("Run simulation", type="primary")
state.write_url(url_params(dict(state.values)))  # before anything can fail: a link reproduces the inputs

trace = None
try:
    if dataset == "trace":
        if upload is None:
            st.info(
                "Upload a CSV or JSONL trace to simulate it; showing the ShareGPT-like default meanwhile."
            )
            dataset = "sharegpt"
        else:
            # the size is checked before the file is read; a bad file is not used at all (the page stops)
            limits = app_limits()
            max_len = min(SimulatorParams.max_seq_len, MODELS[model].max_position_embeddings)
            source = (
                f"the smaller of the simulator's max_seq_len {SimulatorParams.max_seq_len:,} and "
                f"{MODELS[model].name}'s max_position_embeddings {MODELS[model].max_position_embeddings:,}"
            )
            trace = _parse_trace(read_upload(upload, "the trace", limits), max_len, source, limits)
    params = params_from(dict(state.values))
    load = None
    if capacity_source == "model" and saturate and trace is None:
        load = saturating_load(params)
        if load.saturates:  # else a run of MAX_SATURATING_SEQS requests would show nothing more: the set load
            params = load.apply(params)
    if hybrid and params.kv_groups is None:
        st.info(f"{MODELS[model].name} has one KV cache group kind: the hybrid manager changes nothing.")
    elif hybrid:
        kinds: dict[tuple, list[int]] = {}
        for group in params.kv_groups:
            kinds.setdefault((group.kind, group.window), []).append(group.num_layers)
        st.caption(
            "Hybrid KV cache manager: "
            + "; ".join(
                f"{len(sizes)} {kind.replace('_', '-').replace('full', 'full-attention')} group{'s' * (len(sizes) > 1)}"
                + (f" (window {window:,} tokens)" if window else "")
                + f" of {', '.join(map(str, sizes))} layers"
                for (kind, window), sizes in kinds.items()
            )
            + ". Sliding-window groups stay bounded at their window while full groups grow with the sequence."
        )
    # in the worker pool: other sessions' pages keep rendering while this simulates
    results, summaries = run_job(compare_policies, params, trace, label="Simulating")
except LabError as err:
    st.error(f"Cannot simulate: {err}")
    st.stop()

capacity = next(iter(results.values())).config.kv_capacity_tokens
requests_total = len(trace) if trace is not None else params.num_requests
window = (
    "the run until half the requests have finished (before the drain)"
    if params.rate == math.inf and trace is None
    else "the steady state (steps between 10% and 100% of the last arrival)"
)
with answer:
    st.markdown(verdict_text(summaries))
    st.caption(
        f"{requests_total:,} requests, KV capacity {capacity:,} token slots, block size {params.block_size}. "
        f"Shares and batch sizes are averaged over {window}."
    )
    if load is not None:
        gpu_name = GPUS[params.gpu].name
        if load.saturates:
            st.info(
                f"Load sized to {gpu_name}'s memory: {load.num_requests:,} requests at t = 0, max_num_seqs "
                f"{load.max_num_seqs:,}, max_num_batched_tokens {load.max_num_batched_tokens:,}. At their busiest "
                f"step they would hold {load.peak_tokens:,} KV tokens, 1.2x the pool's {load.capacity_tokens:,}. "
                "Untick 'Size the load to the GPU's memory' in the settings to run your own load."
            )
        else:
            st.warning(
                f"{gpu_name}'s pool of {load.capacity_tokens:,} KV tokens is more than this workload fills with "
                f"{load.max_num_seqs:,} requests running at once (at most {load.peak_tokens:,} tokens; the page "
                "runs no more, to stay within a minute): memory does not bind, and the set load runs. Choose "
                "longer requests (Fixed lengths, e.g. 1,024 prompt + 1,024 output tokens) or a smaller GPU to "
                "see the policies differ."
            )
    cached_chart(st, summary_bars_figure, summaries, show_paper=params.model == PAPER_MODEL)

cols = st.columns(len(results))
for col, (name, summary) in zip(cols, summaries.items(), strict=True):
    col.metric(f"{label(name)}: token states", f"{summary['token_states_pct']:.1f}%")
    col.metric("Batched requests (avg)", f"{summary['avg_batched_requests']:,.2f}")
    col.metric("Free KV memory (avg)", f"{summary['free_pct']:.1f}%")
    col.metric("Throughput", f"{summary.get('throughput_tokens_per_s', 0):,.0f} tok/s")
    col.metric("Preemptions", f"{summary['preemptions']:,}")

steps = {name: r.steps for name, r in results.items()}
cached_chart(st, memory_breakdown_figure, steps, capacity)
left, right = st.columns(2)
cached_chart(left, free_memory_figure, steps, capacity)
cached_chart(right, running_waiting_figure, steps)

if "paged" in results and params.kv_offload_gib:
    st.subheader("Two KV tiers: HBM and host memory")
    paged_requests = results["paged"].requests
    host_tokens = int(paged_requests["host_hit_tokens"].sum())
    hit_tokens = int(paged_requests["prefix_hit_tokens"].sum())
    offload = params.config().offload
    st.markdown(
        f"The paged pool's prompts, by where their KV came from: {hit_tokens - host_tokens:,} tokens hit in HBM, "
        f"{host_tokens:,} were loaded from the {params.kv_offload_gib:g} GiB host tier "
        f"({offload.host_capacity_tokens:,} tokens, {params.offload_policy.upper()}) instead of prefilled, and "
        f"{int(paged_requests['prompt_len'].sum()) - hit_tokens:,} were computed."
    )
    cached_chart(st, tier_hits_figure, paged_requests)

if "paged" in results and results["paged"].snapshots:
    snaps = results["paged"].snapshots
    st.subheader("Inside the paged cache")
    options = [s.step for s in snaps]
    if st.session_state.get("heatmap_step") not in options:  # auto, or a step this run did not sample
        st.session_state["heatmap_step"] = options[len(options) // 2]
    chosen = st.select_slider("Step (sampled evenly over the run)", options=options, key="heatmap_step")
    state.values["heatmap_step"] = chosen
    state.write_url(url_params(dict(state.values)))  # the chosen step is part of the link
    snap = next(s for s in snaps if s.step == chosen)
    pool_blocks = len(snap.owner_request)
    if pool_blocks > MAX_CELLS:
        st.caption(
            f"{pool_blocks:,} blocks do not fit one cell each: each cell is a run of "
            f"{grid_shape(pool_blocks).blocks_per_cell:,} consecutive blocks, coloured by the share of them in use; "
            "hover a cell for its blocks and their counts (used, free, partly filled, shared)."
        )
    if params.kv_groups is not None:
        cached_chart(st, block_heatmap_figure, snap, params.block_size, kv_groups=params.kv_groups)
        layers = max(g.num_layers for g in params.kv_groups)
        st.caption(
            "One pool for every KV cache group, as vLLM draws them: one cell per physical block (of "
            f"{params.block_size} tokens x {layers} layers, a smaller group padded as vLLM does), in block-id "
            "order; colour = the request whose sequence holds it, the hover names the block's group; ○ = partly "
            "filled, ◆ = shared (parallel samples, prefix-cache hits). A window group keeps only the blocks its "
            "window still reads: the ones behind it went back to the pool, to be reused by any group."
        )
    else:
        cached_chart(st, block_heatmap_figure, snap, params.block_size)
        st.caption(
            "One cell per physical block, in block-id order. Colour = the request whose sequence holds it (a "
            "request's blocks are scattered: no contiguity is needed); light grey = free; darker grey = free but "
            "still prefix-cached; ◆ = shared by several sequences (parallel samples or a cached prefix); ○ = the "
            "partly filled last block of a sequence, the only internal fragmentation paging has. Try n = 4 "
            "samples or a shared system prompt with prefix caching to see sharing."
        )
    if params.kv_groups is not None:
        st.caption(
            "Attention latency is measured on one pool's block tables: untick the hybrid manager to time it."
        )
    elif measure:
        try:
            table = run_job(
                measure_simulated_attention, params, trace, float(budget_s), label="Timing attention"
            )
            cached_chart(st, attention_latency_figure, table)
            st.caption(
                f"Measured on this machine, {len(table):,} sampled steps, 8 KV heads x 64 dims fp32 "
                "(scaled down to fit the memory budget), median of 3 runs each."
            )
        except LabError as err:
            st.error(f"Cannot measure attention: {err}")
    else:
        st.caption("Tick 'Measure attention latency' and run to time the real kernels on these batches.")

d1, d2 = st.columns(2)
d1.download_button(
    "Per-step table (CSV)",
    lambda: steps_table(results).to_csv(index=False),  # built only when clicked: ~10^5 rows
    "simulation_steps.csv",
    "text/csv",
)
payload = {
    "params": {
        k: (v if not isinstance(v, float) or math.isfinite(v) else "inf") for k, v in params.__dict__.items()
    },
    "policies": summaries,
}
d2.download_button(
    "Summary (JSON)",
    json.dumps(payload, indent=2, default=str),
    "simulation_summary.json",
    "application/json",
)
