"""Capacity planner: what fits on which GPUs, with the formula, two scenarios side by side, all in the URL."""

import json

import streamlit as st

from core.errors import LabError
from core.page_models.planner import (
    CUSTOM,
    clamp_context,
    compute_scenario,
    config_from_bytes,
    config_from_text,
    context_sweep,
    decode_config,
    encode_config,
    gpu_preset_rows,
    make_workload,
    model_from_config,
    model_preset_rows,
    plan_document,
    smallest_deployment,
    what_if_summary,
    workload_max_len,
)
from core.page_models.planner_scenario import cpu_plan
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS, preset_configs
from core.planning.catalog.weights import read_safetensors_index
from core.planning.memory.what_if import memory_breakdown
from core.planning.predict.plan_fields import CPU_FIELDS
from core.uploads import read_upload
from ui.charts import cached_chart, cached_dataframe, cached_value
from ui.input_fields import input_widget
from ui.jobs import app_limits
from ui.planner.figures import (
    concurrency_vs_context_figure,
    fragmentation_figure,
    memory_breakdown_figure,
    paged_vs_contiguous_figure,
)
from ui.planner.state import ALL_FIELDS, FIELDS, PLANNER, SCENARIO_NAMES, WORKLOAD_LABELS, url_params
from ui.planner.view import show_metrics, show_plan, show_verdict
from ui.url_widgets import UrlState

state = UrlState("_planner", ALL_FIELDS)


def workload(
    kind: str, n: int, prompt: int, output: int, seed: int, max_len: int
) -> tuple[tuple[int, int], ...]:
    """The workload's (prompt, output) lengths (shared by every session through `cached_value`: read-only)."""
    values = {"wl": kind, "wl_n": n, "wl_prompt": prompt, "wl_output": output, "wl_seed": seed}
    return tuple(make_workload(values, max_len))


def seed_config_texts() -> None:
    """Show each scenario's URL-carried custom config as pretty JSON in its text area."""
    for prefix in SCENARIO_NAMES:
        blob = state.values[f"{prefix}config"]
        try:
            text = json.dumps(decode_config(blob), indent=2) if blob else ""
        except LabError:
            text = ""
        st.session_state[f"{prefix}config_text"] = text


def on_model_change(prefix: str) -> None:
    """Clamp max_model_len to the new model, reset DP ranks and expert parallel, and replace a GPU count / TP chosen
    for the old model by the smallest deployment of the new one that fits (`smallest_deployment`), saying so; or
    say that none fits."""
    key = f"{prefix}ctx"
    state.set(key, clamp_context(st.session_state[f"{prefix}model"], st.session_state.get(key, 0)))
    for name in ("dp", "ep"):  # a new model starts as one server of tp x pp GPUs (the search below)
        state.set(f"{prefix}{name}", PLANNER[name].default)
    values = {**state.values, f"{prefix}model": st.session_state[f"{prefix}model"], key: state.values[key]}
    notes = []
    try:
        found = smallest_deployment(values, prefix)
    except LabError as error:
        found, notes = None, [f"No deployment checked: {error}"]
    old = (values[f"{prefix}gpus"], values[f"{prefix}tp"])
    if found is None and not notes:
        notes = [
            "No deployment of up to 8 GPUs (tensor parallel 1-8) fits this model with these settings: raise "
            "the GPU count and pipeline parallel, or choose a larger GPU."
        ]
    elif found is not None and found != old:
        state.set(f"{prefix}gpus", found[0])
        state.set(f"{prefix}tp", found[1])
        notes = [
            f"Deployment changed for the new model: {found[0]} GPU{'s' * (found[0] > 1)} at tensor parallel "
            f"{found[1]}, the smallest that fits (was {old[0]} at TP {old[1]})."
        ]
    st.session_state[f"{prefix}deployment_note"] = notes


def custom_config_inputs(p: str) -> None:
    """Upload or paste a config.json; a bad one is reported and leaves the scenario's model as it was."""
    upload = st.file_uploader("Upload config.json", type=["json"], key=f"{p}upload")
    if upload is not None and st.session_state.get(f"{p}upload_seen") != upload.file_id:
        st.session_state[f"{p}upload_seen"] = upload.file_id
        try:
            config = config_from_bytes(read_upload(upload, "the uploaded config.json", app_limits()))
            model_from_config(config)  # a config that describes no model is not used either
            st.session_state[f"{p}config_text"] = json.dumps(config, indent=2)
        except LabError as error:
            st.error(f"Upload not used: {error}")
    st.text_area(
        "config.json (Hugging Face)",
        key=f"{p}config_text",
        height=180,
        help="Paste a model's config.json; the fields the planner reads are kept in the URL.",
    )
    try:
        config = config_from_text(st.session_state.get(f"{p}config_text", ""))
        model_from_config(config)
        state.values[f"{p}config"] = encode_config(config)
    except LabError as error:
        kept = " (not used: the plan keeps the last valid config)" if state.values[f"{p}config"] else ""
        st.error(f"{error}{kept}")


def scenario_inputs(p: str) -> None:
    """One scenario's inputs: each widget's label, key (after the scenario's prefix `p`) and bounds from the
    capacity plan's field (`PLANNER`, `core.planning.predict.plan_fields`)."""

    def field(factory, key: str, **kwargs):
        return input_widget(state.widget, factory, PLANNER[key], prefix=p, **kwargs)

    field(
        st.selectbox,
        "model",
        on_change=on_model_change,
        args=(p,),
        format_func=lambda s: "Custom (paste or upload config.json)" if s == CUSTOM else MODELS[s].name,
    )
    if state.values[f"{p}model"] == CUSTOM:
        custom_config_inputs(p)
    field(
        st.selectbox,
        "gpu",
        format_func=lambda s: (
            "Custom GPU" if s == CUSTOM else f"{GPUS[s].name} ({GPUS[s].memory_gib:,.1f} GiB)"
        ),
    )
    if state.values[f"{p}gpu"] == CUSTOM:
        for column, key in zip(st.columns(3), ("gpu_mem", "gpu_bw", "gpu_tflops"), strict=True):
            with column:
                field(st.number_input, key, **({"placeholder": "unknown"} if key == "gpu_tflops" else {}))
    rows = [
        [(st.number_input, "gpus"), (st.number_input, "tp"), (st.number_input, "pp")],
        [(st.selectbox, "wdtype"), (st.selectbox, "kvdtype"), (st.selectbox, "block")],
        [(st.number_input, "ctx"), (st.slider, "util")],
    ]
    for row in rows:
        for column, (factory, key) in zip(st.columns(len(row)), row, strict=True):
            with column:
                field(factory, key)
    c = st.columns(2)
    with c[0]:
        field(
            st.number_input,
            "act",
            placeholder="auto (estimate)",
            help="Leave empty for the estimate; enter vLLM's logged activation peak for an exact plan.",
        )
    with c[1]:
        field(st.number_input, "seqs")
    field(st.number_input, "offload", help=PLANNER["offload"].help)
    with st.expander("MoE: data-parallel attention, expert parallel"):  # docs/pages/planner.md, "MoE"
        c = st.columns(2)
        with c[0]:
            field(
                st.number_input, "dp", help=PLANNER["dp"].help + ". GPUs must be a multiple of TP × PP × DP."
            )
        with c[1]:
            field(st.toggle, "ep", help=PLANNER["ep"].help)
    hybrid_inputs(p, field)


def hybrid_inputs(p: str, field) -> None:
    """Inputs that matter for hybrid models (sliding-window, chunked, Mamba layers) and exact weights."""
    with st.expander("Hybrid KV cache manager, tokens per step, exact weights"):
        c = st.columns(2)
        with c[0]:
            field(
                st.number_input,
                "mbt",
                help=PLANNER["mbt"].help + " (enter twice the value to count both steps)",
            )
        with c[1]:
            field(
                st.toggle,
                "hybrid",
                help="Off = vLLM's --disable-hybrid-kv-cache-manager: sliding and chunked layers are "
                "cached like full attention (compute stays windowed).",
            )
        upload = st.file_uploader(
            "model.safetensors.index.json (exact weight bytes)", type=["json"], key=f"{p}index_upload"
        )
        if upload is not None and st.session_state.get(f"{p}index_seen") != upload.file_id:
            st.session_state[f"{p}index_seen"] = upload.file_id
            try:
                data = read_upload(upload, "the safetensors index", app_limits())
                state.set(f"{p}ckpt", read_safetensors_index(data))
            except LabError as error:
                st.error(f"Upload not used: {error}")
        checkpoint = state.values.get(f"{p}ckpt")
        if checkpoint:
            st.caption(f"Weights: the checkpoint's {checkpoint:,} B from the uploaded index.")
            if st.button("Use the weight estimate instead", key=f"{p}index_clear"):
                state.set(f"{p}ckpt", None)
                st.rerun()


def workload_inputs() -> None:
    """The workload's widgets, each labelled by its URL field (`ui.planner.state.WORKLOAD_FIELDS`)."""

    def field(factory, key: str, suffix: str = "", **kwargs):
        return state.widget(factory, FIELDS[key].label + suffix, key, **kwargs)

    c = st.columns(5)
    with c[0]:
        kind = field(st.selectbox, "wl", format_func=WORKLOAD_LABELS.get)
    fixed = kind in ("sharegpt", "alpaca")
    suffix = " (max)" if kind == "uniform" else ""
    with c[1]:
        field(st.number_input, "wl_n")
    with c[2]:
        field(st.number_input, "wl_prompt", suffix, disabled=fixed)
    with c[3]:
        field(st.number_input, "wl_output", suffix, disabled=fixed)
    with c[4]:
        field(st.number_input, "wl_seed")


st.title("Capacity planner")
st.markdown(
    "How many KV-cache tokens, blocks and concurrent requests a model gets on given GPUs, computed with vLLM's "
    "memory rules and shown with the formula, so you can answer *what fits?* before renting hardware. "
    "Every input is in the URL: copy it to share the what-if."
)
answer = st.container()  # the verdicts, the main chart and the key figures, above the inputs
with answer:
    running = st.empty()
    running.info("Computing the plan…", icon=":material/hourglass_top:")

if state.sync_from_url():
    seed_config_texts()
with answer:  # at the top of the answer, which is computed with the defaults put in their place
    for message in state.pop_errors():  # shown once; the URL is rewritten with valid values below
        st.error(message)

st.subheader("Inputs")
compare = state.widget(st.toggle, FIELDS["compare"].label, "compare")
prefixes = ["a_", "b_"] if compare else ["a_"]
for column, prefix in zip(st.columns(2) if compare else [st.container()], prefixes, strict=True):
    with column, st.container(border=True):
        st.markdown(f"**{SCENARIO_NAMES[prefix]}**")
        for note in st.session_state.pop(f"{prefix}deployment_note", []):
            st.info(note)
        scenario_inputs(prefix)

st.markdown("**Workload**")
workload_inputs()
st.caption(
    "ShareGPT / Alpaca lengths follow the PagedAttention paper's means (Figure 11), clipped so each request fits "
    "the shorter max_model_len of the scenarios shown. The what-if assumes a saturated server: as many requests "
    "run as memory (and max_num_seqs) allow."
)

values = dict(state.values)
encoded = url_params(values)  # written before any computation can fail: a shared link reproduces the inputs
state.write_url(encoded)

requests, workload_error = None, None
try:
    requests = cached_value(
        workload,
        values["wl"],
        values["wl_n"],
        values["wl_prompt"],
        values["wl_output"],
        values["wl_seed"],
        workload_max_len(values, prefixes),
    )
except LabError as error:
    workload_error = str(error)
    st.error(f"Workload: {error}")

results = {}
errors = {}
for prefix in prefixes:
    try:
        results[prefix] = compute_scenario(values, prefix, requests, workload_error)
    except LabError as error:
        errors[prefix] = str(error)
running.empty()
with answer:
    for prefix, error in errors.items():
        st.error(f"{SCENARIO_NAMES[prefix]}: {error}")
    if not results:
        st.info("Fix the inputs below to see a plan.")
        st.stop()
    named = {SCENARIO_NAMES[p]: r for p, r in results.items()}
    for column, (prefix, result) in zip(st.columns(len(results)), results.items(), strict=True):
        with column:
            show_verdict(prefix, result)
    cached_chart(
        st,
        memory_breakdown_figure,
        {n: memory_breakdown(r.plan, r.what_if) for n, r in named.items()},
        {n: r.plan.gpu_memory_bytes for n, r in named.items()},
        {n: r.plan.activation_estimated for n, r in named.items()},
    )
    st.caption(
        "Memory per GPU. KV used = blocks held by the workload's requests at their average paged concurrency "
        "(capped at max_num_seqs); the rest of the KV budget is free. The black mark is the memory the GPU's "
        "driver reports."
    )
    for prefix, result in results.items():
        if len(results) > 1:
            st.markdown(f"**{SCENARIO_NAMES[prefix]}**" + (" (deltas against A)" if prefix == "b_" else ""))
        show_metrics(result, results.get("a_") if prefix == "b_" else None)

st.divider()
st.subheader("The plan in detail")
for column, prefix in zip(st.columns(len(results)), results, strict=True):
    with column:
        show_plan(prefix, results[prefix], workload_error)

st.subheader("Max concurrency vs context length")
sweep = context_sweep(
    {SCENARIO_NAMES[p][-1]: r for p, r in results.items()}, values[f"{next(iter(results))}gpu"]
)
cached_chart(st, concurrency_vs_context_figure, sweep.contexts, sweep.series, sweep.max_model_len)
st.caption(
    f"{sweep.model_name}, same parallelism and dtypes on two comparison GPUs. A request of c tokens holds "
    "ceil(c / block size) blocks; a line that stops means no request of that length fits (log scale has no 0). "
    "Memory decides concurrency (GPUs of equal memory draw the same line); bandwidth decides speed."
)

what_ifs = {n: r.what_if for n, r in named.items() if r.what_if is not None}
if what_ifs:
    st.subheader("Paged vs contiguous concurrency for this workload")
    seqs = {n: r.plan.max_num_seqs for n, r in named.items() if r.what_if}
    cached_chart(st, paged_vs_contiguous_figure, what_ifs, seqs)
    st.markdown("  \n".join(what_if_summary(n, w) for n, w in what_ifs.items()))

    st.subheader("Internal fragmentation vs block size")
    frag = next(r for r in results.values() if r.fragmentation)
    cached_chart(st, fragmentation_figure, frag.fragmentation, frag.plan.block_size)
    st.caption(
        "Share of allocated KV slots that hold no token (the unfilled tail of each request's last block), "
        "averaged over decode steps. Small blocks waste less but mean more block-table entries."
    )

document = plan_document(values, named)
document["url_query"] = encoded
st.download_button(
    "Download the plan (JSON)",
    data=json.dumps(document, indent=2),
    file_name="capacity_plan.json",
    mime="application/json",
)


def cpu_section() -> None:
    """vLLM on a CPU: scenario A's model in VLLM_CPU_KVCACHE_SPACE, the blocks and tokens vLLM's CPU backend
    allocates, and the command (issue 36)."""
    st.subheader("vLLM on a CPU")
    if not state.widget(st.toggle, FIELDS["cpu"].label, "cpu"):
        return
    for column, field in zip(st.columns(4), CPU_FIELDS, strict=True):  # `plan`'s CPU flags' fields
        with column:
            input_widget(state.widget, st.number_input if field.kind == "int" else st.selectbox, field)
    try:
        cpu = cpu_plan(state.values)
    except LabError as error:
        st.error(f"vLLM on a CPU: {error}")
        return
    (st.success if cpu.fits else st.warning)(cpu.verdict)
    m = st.columns(4)
    m[0].metric("num_blocks", f"{cpu.num_blocks:,}", help=f"blocks of {cpu.block_size} tokens")
    m[1].metric("kv_tokens", f"{cpu.kv_tokens:,}", help="as vLLM logs its CPU KV cache size")
    m[2].metric("Block bytes (all layers)", f"{cpu.block_bytes:,} B")
    m[3].metric("KV dtype", f"{cpu.kv_dtype} (model {cpu.dtype})")
    st.code(cpu.vllm_command, language="bash", wrap_lines=True)
    st.caption(
        "vLLM's CPU backend takes the whole space for the KV cache (weights live in the rest of RAM): "
        "num_blocks = floor(space / (block size x KV bytes per token over all layers)); kv_tokens as its start log "
        'says them ("CPU KV cache size"). dtype auto serves a float32 checkpoint in bfloat16. Uses scenario A\'s '
        "model, max_model_len and max_num_batched_tokens; the same as `python -m core.planning --cpu-kv-cache-space-gib`."
    )
    for note in cpu.notes:
        st.caption(note)


cpu_section()

show_presets = state.widget(st.toggle, FIELDS["presets"].label, "presets")
state.write_url(url_params(state.values))  # this toggle is drawn below the URL's first write
if show_presets:
    cached_dataframe(st, cached_value(model_preset_rows), width="stretch")
    cached_dataframe(st, cached_value(gpu_preset_rows), width="stretch")
    st.caption(
        "GPU memory is the total the driver reports (nvidia-smi, torch.cuda.mem_get_info), the figure vLLM "
        "multiplies by gpu_memory_utilization: an H100 “80GB” reports 79.6 GiB, an L4 “24GB” 22.5 GiB (ECC "
        "takes 1/16). The source column says where each figure comes from; use a custom GPU for your own card."
    )
    chosen = values["a_model"] if values["a_model"] != CUSTOM else "llama-3.1-8b"
    st.markdown(f"config.json fields of `{chosen}` (a template for a custom model):")
    st.json(cached_value(preset_configs)[chosen], expanded=False)
