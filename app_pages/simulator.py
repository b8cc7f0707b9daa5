"""Serving simulator: replay a workload through the real block manager and through Orca's contiguous allocators."""

import json
import math

import streamlit as st

from core.errors import LabError
from core.jobs.tasks import compare_policies, measure_simulated_attention
from core.limits import Limits
from core.planning.hardware import GPUS
from core.planning.models import MODELS
from core.serving.experiment import SimulatorParams, model_kv_groups
from core.serving.memory_policies import POLICY_NAMES
from core.serving.simulator import PAPER_KV_TOKENS
from core.serving.workload import load_trace
from core.uploads import read_upload
from ui.charts import cached_chart
from ui.jobs import app_limits, run_job
from ui.simulator_figures import (
    attention_latency_figure,
    block_heatmap_figure,
    free_memory_figure,
    hybrid_block_heatmap_figure,
    label,
    memory_breakdown_figure,
    running_waiting_figure,
    steps_table,
    summary_bars_figure,
)

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


@st.cache_data(show_spinner=False, max_entries=8)
def _parse_trace(data: bytes, max_len: int, max_len_source: str, limits: Limits):
    return tuple(load_trace(data, max_len=max_len, max_len_source=max_len_source, limits=limits))


st.title("Serving simulator")
st.markdown(
    "Replays a serving workload through an iteration-level scheduler, once with the real paged block manager and "
    "once per contiguous Orca allocator, and shows step by step where the KV memory goes: this is why paging "
    "batches 3-4x more requests on the same GPU (the paper's Figures 2 and 13)."
)

with st.expander("Workload, model, policies and scheduler settings", expanded=False), st.form("simulator"):
    c1, c2, c3 = st.columns(3)
    with c1:
        st.markdown("**Workload**")
        dataset = st.selectbox(
            "Workload", list(DATASET_LABELS), format_func=DATASET_LABELS.get, key="dataset"
        )
        upload = st.file_uploader(
            "Trace (arrival_time, prompt_len, output_len[, n, prefix_group, prefix_len])",
            type=["csv", "jsonl", "json"],
        )
        num_requests = st.number_input("Requests", 1, 10_000, 1_000, step=100, key="num_requests")
        all_at_once = st.checkbox("All requests at t = 0", False, key="all_at_once")
        rate = st.number_input("Arrival rate (requests/s, Poisson)", 0.01, 1_000.0, 2.0, step=0.5, key="rate")
        seed = st.number_input("Seed", 0, 2**31 - 1, 0, key="seed")
        n = st.number_input("Parallel samples per prompt (n)", 1, 16, 1, key="n")
        prefix_len = st.number_input("Shared system prompt (tokens)", 0, 1024, 0, step=16, key="prefix_len")
        prefix_fraction = st.slider("Requests with the shared prompt", 0.0, 1.0, 0.0, key="prefix_fraction")
        fixed_prompt = st.number_input("Fixed prompt length (tokens)", 1, 2047, 512, key="fixed_prompt")
        fixed_output = st.number_input("Fixed output length (tokens)", 1, 2047, 128, key="fixed_output")
    with c2:
        st.markdown("**Model, GPU and KV capacity**")
        model = st.selectbox("Model", list(MODELS), format_func=lambda m: MODELS[m].name, key="model")
        gpu = st.selectbox("GPU", list(GPUS), format_func=lambda g: GPUS[g].name, key="gpu")
        capacity_source = st.radio(
            "KV capacity", list(CAPACITY_LABELS), format_func=CAPACITY_LABELS.get, key="capacity"
        )
        raw_capacity = st.number_input(
            "Raw capacity (token slots)", 16, 10_000_000, PAPER_KV_TOKENS, step=1024, key="raw_capacity"
        )
        overhead_ms = st.number_input("Per-step overhead (ms)", 0.0, 200.0, 15.0, step=1.0, key="overhead_ms")
        st.caption(
            "Step time = overhead + max(weights + KV bytes / (80% of bandwidth), FLOPs / (50% of peak)). "
            "The 15 ms overhead (scheduling, sampling, launches) is what made the paper's vLLM run memory-bound."
        )
    with c3:
        st.markdown("**Policies and scheduler**")
        policies = st.multiselect(
            "Policies", list(POLICY_NAMES), default=list(POLICY_NAMES), format_func=label, key="policies"
        )
        block_size = st.selectbox(
            "Block size (tokens)", [1, 2, 4, 8, 16, 32, 64, 128], index=4, key="block_size"
        )
        prefix_caching = st.checkbox("Prefix caching (paged)", False, key="prefix_caching")
        hybrid = st.checkbox(
            "Hybrid KV cache manager (per-group blocks)",
            False,
            key="hybrid",
            help="Paged policy only; for models mixing full and sliding-window layers (e.g. Gemma 2, gpt-oss).",
        )
        max_num_seqs = st.number_input("max_num_seqs", 1, 4096, 256, key="max_num_seqs")
        max_tokens = st.number_input("max_num_batched_tokens", 1, 65_536, 2048, step=256, key="max_tokens")
        preemption = st.radio("Preemption", ["recompute", "swap"], horizontal=True, key="preemption")
        swap_gib = st.number_input("Swap space (GiB)", 0.0, 512.0, 4.0, key="swap_gib")
        measure = st.checkbox("Measure attention latency with the real kernels", False, key="measure")
        budget_s = st.number_input("Measurement time budget (s)", 0.5, 30.0, 2.0, key="budget_s")
    st.form_submit_button("Run simulation", type="primary")


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
    params = SimulatorParams(
        dataset="sharegpt" if dataset == "trace" else dataset,
        num_requests=int(num_requests),
        rate=math.inf if all_at_once else float(rate),
        seed=int(seed),
        n=int(n),
        prefix_len=int(prefix_len),
        prefix_fraction=float(prefix_fraction),
        prompt_len=int(fixed_prompt),
        output_len=int(fixed_output),
        model=model,
        gpu=gpu,
        capacity_source=capacity_source,
        raw_capacity_tokens=int(raw_capacity),
        policies=tuple(policies),
        block_size=int(block_size),
        enable_prefix_caching=bool(prefix_caching),
        max_num_seqs=int(max_num_seqs),
        max_num_batched_tokens=int(max_tokens),
        preemption_mode=preemption,
        swap_space_gib=float(swap_gib),
        overhead_ms=float(overhead_ms),
        kv_groups=model_kv_groups(model) if hybrid else None,
    )
    if hybrid and params.kv_groups is None:
        st.info(f"{MODELS[model].name} has one KV cache group kind: the hybrid manager changes nothing.")
    elif hybrid:
        kinds: dict[tuple, list[int]] = {}
        for kind, layers, window in params.kv_groups:
            kinds.setdefault((kind, window), []).append(layers)
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
st.caption(
    f"{requests_total:,} requests, KV capacity {capacity:,} token slots, block size {params.block_size}. "
    "Shares and batch sizes are averaged over the steady state (steps between 10% and 100% of the last arrival)."
)

cols = st.columns(len(results))
for col, (name, summary) in zip(cols, summaries.items(), strict=True):
    col.metric(f"{label(name)}: token states", f"{summary['token_states_pct']:.1f}%")
    col.metric("Batched requests (avg)", f"{summary['avg_batched_requests']:,.2f}")
    col.metric("Throughput", f"{summary.get('throughput_tokens_per_s', 0):,.0f} tok/s")
    col.metric("Preemptions", f"{summary['preemptions']:,}")

cached_chart(st, summary_bars_figure, summaries)
steps = {name: r.steps for name, r in results.items()}
cached_chart(st, memory_breakdown_figure, steps, capacity)
left, right = st.columns(2)
cached_chart(left, free_memory_figure, steps, capacity)
cached_chart(right, running_waiting_figure, steps)

if "paged" in results and results["paged"].snapshots:
    snaps = results["paged"].snapshots
    st.subheader("Inside the paged cache")
    middle = snaps[len(snaps) // 2].step
    chosen = st.select_slider(
        "Step (sampled evenly over the run)",
        options=[s.step for s in snaps],
        value=middle,
        key="heatmap_step",
    )
    snap = next(s for s in snaps if s.step == chosen)
    if snap.hybrid_pool is not None:
        cached_chart(st, hybrid_block_heatmap_figure, snap, params.block_size)
        st.caption(
            "One pool, one band per KV cache group kind: each cell is a block the group holds (of "
            f"{params.block_size} tokens x {snap.hybrid_pool.group_size} layers, a smaller group padded as vLLM does), in "
            "that group's block-id order; colour = the owning request (as in the paged heatmap), ○ = partly "
            "filled. A window group keeps only the blocks its window still reads: the ones behind it went back "
            "to the free band. Each group numbers its own blocks here (vLLM draws all groups' ids from one pool)."
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
