"""Engine: a real model generating through the paged KV cache, with what the block manager did at each step."""

import streamlit as st

from core.engine import SamplingParams
from core.errors import LabError
from core.page_models.tasks import engine_sharing, generate_outputs
from ui.engine_figures import (
    attention_latency_figure,
    copy_on_write_figure,
    engine_block_heatmap,
    free_blocks_figure,
    outputs_table,
    sequence_color_index,
    sharing_figure,
)
from ui.jobs import app_limits, run_job

DEFAULT_PROMPTS = (
    "1 17 42 7 99 3 250 11 64 5 8 301 77 12 45 9 230 18 6 33\n5 9 200 31\n400 2 88 13 61 7 19 140 52 3"
)
SOURCES = {"tiny": "Tiny random Llama (2 layers, built here)", "directory": "Local model directory"}


st.title("Engine")
st.markdown(
    "A real Llama-family model generating through the paged KV cache: its own forward pass writes K/V into "
    "blocks by slot mapping and reads them back with the paged kernels, while the same block manager and "
    "scheduler as the simulator decide each step. Below: the outputs, then what the pool did step by step "
    "(sharing between samples or beams, copy-on-write, preemption) and the measured attention time."
)

try:
    limits = app_limits()
except LabError as err:
    st.error(f"Cannot generate: {err}")
    st.stop()

with st.form("engine"):
    c1, c2, c3 = st.columns(3)
    with c1:
        source = st.radio("Model", list(SOURCES), format_func=SOURCES.get, key="source")
        if limits.model_root:  # a shared host: only directories inside its model root
            choice = st.selectbox(
                f"Model directory in {limits.model_root}",
                limits.model_directories(),
                key="model_dir",
                placeholder="no model directories (with a config.json) there",
            )
            typed = st.text_input("...or a directory inside it (overrides the choice)", "", key="path")
            path = typed.strip() or choice or ""
        else:
            path = st.text_input("Model directory (config.json + safetensors)", "", key="path")
        prompts_text = st.text_area(
            "Prompts, one per line (text with a tokenizer, else token ids)", DEFAULT_PROMPTS, key="prompts"
        )
    with c2:
        max_tokens = st.number_input("New tokens per output (max_tokens)", 1, 512, 24, key="max_tokens")
        temperature = st.number_input("Temperature (0 = greedy)", 0.0, 5.0, 0.8, step=0.1, key="temperature")
        top_p = st.number_input("top_p", 0.01, 1.0, 0.95, step=0.05, key="top_p")
        top_k = st.number_input("top_k (0 = all)", 0, 10_000, 0, key="top_k")
        seed = st.number_input("Seed", 0, 2**31 - 1, 0, key="seed")
    with c3:
        n = st.number_input("Parallel samples (n)", 1, 16, 2, key="n")
        beam_width = st.number_input("Beam width (> 1: beam search, n must be 1)", 1, 16, 1, key="beam_width")
        prefix_caching = st.checkbox("Prefix caching", False, key="prefix_caching")
        pool = st.number_input("Pool size (blocks; 0 = from the memory budget)", 0, 1_000_000, 48, key="pool")
        block_size = st.selectbox("Block size (tokens)", [8, 16, 32], index=1, key="block_size")
    st.form_submit_button("Generate", type="primary")

try:
    params = SamplingParams(
        max_tokens=int(max_tokens),
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=int(top_k),
        n=int(n),
        beam_width=int(beam_width),
        seed=int(seed),
        ignore_eos=source == "tiny",
    )
    if source == "directory":  # refused at once, not after a wait in the queue (the worker checks again)
        path = limits.check_model_directory(path)
    # in the worker pool: the engine is built and runs there, so other sessions' pages keep rendering
    generation = run_job(
        generate_outputs,
        source,
        path if source == "directory" else "",
        int(pool),
        int(block_size),
        bool(prefix_caching),
        prompts_text,
        params,
        label="Generating",
    )
except LabError as err:
    st.error(f"Cannot generate: {err}")
    st.stop()

run = generation.run
steps = run.steps
m1, m2, m3, m4, m5 = st.columns(5)
m1.metric("Tokens generated", f"{int(steps['tokens_generated'].sum()):,}")
m2.metric("Engine steps", f"{len(steps):,}")
m3.metric("Peak blocks in use", f"{int(steps['blocks_in_use'].max()):,} of {run.num_blocks:,}")
m4.metric("Copy-on-write copies", f"{int(steps['cow_copies'].sum()):,}")
m5.metric("Preemptions (recompute)", f"{int(steps['preemptions'].sum()):,}")
st.caption(
    f"Wall time {run.wall_s:,.2f} s; memory saved by sharing, averaged over the steps: "
    f"{100 * run.sharing_saving():.1f}% (1 - blocks in use / blocks the same sequences would hold unshared)."
)

texts = generation.texts
decode = (lambda ids: texts[tuple(ids)]) if texts is not None else None
st.dataframe(
    outputs_table(generation.prompt_token_ids, generation.outputs, decode), hide_index=True, width="stretch"
)

st.subheader("Inside the paged cache")
snapshots = run.snapshots
colors = sequence_color_index(s.blocks for s in snapshots)
chosen = st.select_slider(
    "Step", options=[s.step for s in snapshots], value=snapshots[min(1, len(snapshots) - 1)].step, key="step"
)
snap = next(s for s in snapshots if s.step == chosen)
st.plotly_chart(engine_block_heatmap(snap.blocks, snap.step, colors), width="stretch")
st.caption(
    "One cell per physical block, in block-id order; colour = the sequence holding it (legend: sequence ids), "
    "the number = tokens stored. After the prompt's first token, the n samples (or beams) share its blocks "
    "(×n); the first write into a shared, partly filled last block copies it (copy-on-write)."
)
left, right = st.columns(2)
left.plotly_chart(free_blocks_figure(steps, run.num_blocks), width="stretch")
right.plotly_chart(copy_on_write_figure(steps), width="stretch")
st.plotly_chart(attention_latency_figure(steps), width="stretch")

st.subheader("Memory saved by sharing (the paper's Figure 15)")
st.caption(
    "16 Alpaca-like requests on a tiny random Llama, once per n = 2, 4, 6 (parallel sampling) and beam width 2, 4, "
    "6; saving = 1 - blocks in use / blocks the same sequences would hold without sharing, averaged over the run."
)
if st.checkbox("Measure sharing (about 10 s on 2 CPU cores, then cached for everyone)", key="sharing"):
    try:
        measured = run_job(engine_sharing, label="Measuring sharing")
    except LabError as err:
        st.error(f"Cannot measure sharing: {err}")
    else:
        st.plotly_chart(sharing_figure(measured), width="stretch")
