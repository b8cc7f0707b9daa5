"""Capacity planner: what fits on which GPUs, with the formula, two scenarios side by side, all in the URL."""

import json
from collections import Counter

import pandas as pd
import streamlit as st

from core.errors import LabError
from core.planning.hardware import GPUS
from core.planning.models import MODELS, preset_configs
from core.planning.planner import (
    BLOCK_SIZES,
    KV_DTYPES,
    WEIGHT_DTYPES,
    concurrency_vs_context,
    kv_bytes_per_token,
    plan,
)
from core.planning.weights import read_safetensors_index
from ui.planner_figures import (
    concurrency_vs_context_figure,
    fragmentation_figure,
    memory_breakdown,
    memory_breakdown_figure,
    paged_vs_contiguous_figure,
)
from ui.planner_scenario import (
    ALL_FIELDS,
    CUSTOM,
    WORKLOADS,
    comparison_gpus,
    compute_scenario,
    config_from_text,
    encode_config,
    formula_lines,
    hybrid_comparison,
    kv_group_rows,
    make_workload,
    plan_document,
    url_params,
)
from ui.query_state import decode_blob, parse_params
from ui.theme import fmt_int

STATE = "_planner_values"
WRITTEN = "_planner_url"
URL_ERRORS = "_planner_url_errors"
NAMES = {"a_": "Scenario A", "b_": "Scenario B"}


@st.cache_data(show_spinner=False, max_entries=32)
def cached_workload(
    kind: str, n: int, prompt: int, output: int, seed: int, max_len: int
) -> list[tuple[int, int]]:
    values = {"wl": kind, "wl_n": n, "wl_prompt": prompt, "wl_output": output, "wl_seed": seed}
    return make_workload(values, max_len)


def sync_from_url() -> None:
    """Seed the widgets from the URL on the first run, and whenever the URL no longer matches what we wrote."""
    current = st.query_params.to_dict()
    if STATE in st.session_state:
        if st.session_state.get(WRITTEN) == current:
            return
        if not any(field.key in current for field in ALL_FIELDS):
            # Back from another page (navigation drops the query): keep this session's what-if.
            return
    values, errors = parse_params(current, ALL_FIELDS)
    st.session_state[STATE] = values
    st.session_state[URL_ERRORS] = errors
    for key, value in values.items():
        st.session_state[key] = value
    for prefix in NAMES:
        blob = values[f"{prefix}config"]
        text = ""
        if blob:
            try:
                text = json.dumps(decode_blob(blob), indent=2)
            except ValueError:
                text = ""
        st.session_state[f"{prefix}config_text"] = text


def widget(factory, label: str, key: str, **kwargs):
    """A widget bound to `key`, restoring its value from the page state when streamlit dropped it."""
    if key not in st.session_state:
        st.session_state[key] = st.session_state[STATE][key]
    value = factory(label, key=key, **kwargs)
    st.session_state[STATE][key] = value
    return value


def clamp_context(prefix: str) -> None:
    """On a model change, bring max_model_len within the new model's max_position_embeddings."""
    slug = st.session_state[f"{prefix}model"]
    key = f"{prefix}ctx"
    if slug in MODELS and st.session_state.get(key, 0) > MODELS[slug].max_position_embeddings:
        st.session_state[key] = MODELS[slug].max_position_embeddings
        st.session_state[STATE][key] = st.session_state[key]


def scenario_inputs(prefix: str) -> None:
    p = prefix
    model_options = [*MODELS, CUSTOM]
    widget(
        st.selectbox,
        "Model",
        f"{p}model",
        options=model_options,
        format_func=lambda s: "Custom (paste or upload config.json)" if s == CUSTOM else MODELS[s].name,
        on_change=clamp_context,
        args=(p,),
    )
    if st.session_state[f"{p}model"] == CUSTOM:
        upload = st.file_uploader("Upload config.json", type=["json"], key=f"{p}upload")
        if upload is not None and st.session_state.get(f"{p}upload_seen") != upload.file_id:
            st.session_state[f"{p}upload_seen"] = upload.file_id
            st.session_state[f"{p}config_text"] = upload.getvalue().decode("utf-8", errors="replace")
        st.text_area(
            "config.json (Hugging Face)",
            key=f"{p}config_text",
            height=180,
            help="Paste a model's config.json; the fields the planner reads are kept in the URL.",
        )
        try:
            config = config_from_text(st.session_state.get(f"{p}config_text", ""))
            st.session_state[STATE][f"{p}config"] = encode_config(config)
        except LabError as error:
            st.session_state[STATE][f"{p}config"] = ""
            st.error(str(error))
    widget(
        st.selectbox,
        "GPU",
        f"{p}gpu",
        options=[*GPUS, CUSTOM],
        format_func=lambda s: (
            "Custom GPU" if s == CUSTOM else f"{GPUS[s].name} ({GPUS[s].memory_gib:,.0f} GiB)"
        ),
    )
    if st.session_state[f"{p}gpu"] == CUSTOM:
        c1, c2, c3 = st.columns(3)
        with c1:
            widget(st.number_input, "Memory (GiB)", f"{p}gpu_mem", min_value=0.5, max_value=4096.0, step=1.0)
        with c2:
            widget(
                st.number_input,
                "Bandwidth (GB/s)",
                f"{p}gpu_bw",
                min_value=1.0,
                max_value=100_000.0,
                step=100.0,
            )
        with c3:
            widget(
                st.number_input,
                "bf16 TFLOP/s (dense)",
                f"{p}gpu_tflops",
                min_value=0.0,
                max_value=100_000.0,
                step=10.0,
                placeholder="unknown",
            )
    c1, c2, c3 = st.columns(3)
    with c1:
        widget(st.number_input, "GPUs", f"{p}gpus", min_value=1, max_value=4096, step=1)
    with c2:
        widget(st.number_input, "Tensor parallel", f"{p}tp", min_value=1, max_value=1024, step=1)
    with c3:
        widget(st.number_input, "Pipeline parallel", f"{p}pp", min_value=1, max_value=1024, step=1)
    c1, c2, c3 = st.columns(3)
    with c1:
        widget(st.selectbox, "Weight dtype", f"{p}wdtype", options=list(WEIGHT_DTYPES))
    with c2:
        widget(st.selectbox, "KV cache dtype", f"{p}kvdtype", options=list(KV_DTYPES))
    with c3:
        widget(st.selectbox, "Block size (tokens)", f"{p}block", options=list(BLOCK_SIZES))
    c1, c2 = st.columns(2)
    with c1:
        widget(
            st.number_input,
            "Context length: max_model_len (tokens)",
            f"{p}ctx",
            min_value=16,
            max_value=16_777_216,
            step=1024,
        )
    with c2:
        widget(st.slider, "gpu_memory_utilization", f"{p}util", min_value=0.05, max_value=1.0, step=0.01)
    c1, c2 = st.columns(2)
    with c1:
        widget(
            st.number_input,
            "Activation reserve per GPU (GiB)",
            f"{p}act",
            min_value=0.0,
            max_value=1024.0,
            step=0.5,
            placeholder="auto (estimate)",
            help="Leave empty for the estimate; enter vLLM's logged activation peak for an exact plan.",
        )
    with c2:
        widget(st.number_input, "max_num_seqs", f"{p}seqs", min_value=1, max_value=65_536, step=16)
    hybrid_inputs(p)


def hybrid_inputs(p: str) -> None:
    """Inputs that matter for hybrid models (sliding-window, chunked, Mamba layers) and exact weights."""
    with st.expander("Hybrid KV cache manager, tokens per step, exact weights"):
        c1, c2 = st.columns(2)
        with c1:
            widget(
                st.number_input,
                "max_num_batched_tokens",
                f"{p}mbt",
                min_value=1,
                max_value=16_777_216,
                step=1024,
                help="Tokens scheduled per step: a sliding-window group reserves room for the window plus these. "
                "With async scheduling vLLM keeps two steps in flight: enter twice the value.",
            )
        with c2:
            widget(
                st.toggle,
                "Hybrid KV cache manager",
                f"{p}hybrid",
                help="Off = vLLM's --disable-hybrid-kv-cache-manager: sliding and chunked layers are cached "
                "like full attention (compute stays windowed).",
            )
        upload = st.file_uploader(
            "model.safetensors.index.json (exact weight bytes)", type=["json"], key=f"{p}index_upload"
        )
        if upload is not None and st.session_state.get(f"{p}index_seen") != upload.file_id:
            st.session_state[f"{p}index_seen"] = upload.file_id
            try:
                st.session_state[STATE][f"{p}ckpt"] = read_safetensors_index(upload.getvalue())
            except LabError as error:
                st.error(str(error))
        checkpoint = st.session_state[STATE].get(f"{p}ckpt")
        if checkpoint:
            st.caption(f"Weights: the checkpoint's {checkpoint:,} B from the uploaded index.")
            if st.button("Use the weight estimate instead", key=f"{p}index_clear"):
                st.session_state[STATE][f"{p}ckpt"] = None
                st.rerun()


def show_metrics(prefix: str, result, baseline) -> None:
    p = result.plan
    w = result.what_if

    def delta(value, base_value):
        if baseline is None or value is None or base_value is None:
            return None
        return f"{value - base_value:+,.0f}"

    base_plan = baseline.plan if baseline else None
    base_w = baseline.what_if if baseline else None
    c = st.columns(5)
    c[0].metric(
        "KV tokens per replica", fmt_int(p.kv_tokens), delta(p.kv_tokens, base_plan and base_plan.kv_tokens)
    )
    c[1].metric("KV blocks", fmt_int(p.num_blocks), delta(p.num_blocks, base_plan and base_plan.num_blocks))
    c[2].metric(
        "Max requests at max_model_len",
        fmt_int(p.max_concurrency_total),
        delta(p.max_concurrency_total, base_plan and base_plan.max_concurrency_total),
        help=f"Requests of {p.context_len:,} tokens held at once, all replicas together; each holds "
        f"ceil({p.context_len:,} / {p.block_size}) blocks.",
    )
    c[3].metric(
        "Avg concurrent, paged",
        fmt_int(w.paged_concurrency) if w else "—",
        delta(w.paged_concurrency if w else None, base_w.paged_concurrency if base_w else None),
        help="Per replica, capped at max_num_seqs; the chart below shows the memory-bound figure.",
    )
    c[4].metric(
        "Decode tokens/s (est.)",
        fmt_int(p.decode_tokens_per_s) if p.decode_tokens_per_s else "—",
        delta(p.decode_tokens_per_s, base_plan and base_plan.decode_tokens_per_s),
        help="Roofline estimate: weights + KV read per step over memory bandwidth (or FLOPs over peak).",
    )


st.title("Capacity planner")
st.markdown(
    "How many KV-cache tokens, blocks and concurrent requests a model gets on given GPUs, computed with vLLM's "
    "memory rules and shown with the formula, so you can answer *what fits?* before renting hardware. "
    "Every input is in the URL: copy it to share the what-if."
)

sync_from_url()
# Shown once, on the run that read the URL; the next interaction rewrites the URL with valid values.
for message in st.session_state.pop(URL_ERRORS, []):
    st.error(message)

compare = widget(st.toggle, "Compare with scenario B", "compare")
columns = st.columns(2) if compare else [st.container()]
prefixes = ["a_", "b_"] if compare else ["a_"]
for column, prefix in zip(columns, prefixes, strict=True):
    with column, st.container(border=True):
        st.subheader(NAMES[prefix])
        scenario_inputs(prefix)

st.subheader("Workload")
c = st.columns(5)
with c[0]:
    workload_kind = widget(
        st.selectbox,
        "Requests",
        "wl",
        options=list(WORKLOADS),
        format_func={
            "sharegpt": "ShareGPT-like (161 in / 338 out)",
            "alpaca": "Alpaca-like (19 in / 58 out)",
            "fixed": "Fixed lengths",
            "uniform": "Uniform lengths",
        }.get,
    )
with c[1]:
    widget(st.number_input, "Number of requests", "wl_n", min_value=1, max_value=20_000, step=100)
with c[2]:
    widget(
        st.number_input,
        "Prompt tokens" + (" (max)" if workload_kind == "uniform" else ""),
        "wl_prompt",
        min_value=1,
        max_value=10_000_000,
        step=64,
        disabled=workload_kind in ("sharegpt", "alpaca"),
    )
with c[3]:
    widget(
        st.number_input,
        "Output tokens" + (" (max)" if workload_kind == "uniform" else ""),
        "wl_output",
        min_value=1,
        max_value=10_000_000,
        step=64,
        disabled=workload_kind in ("sharegpt", "alpaca"),
    )
with c[4]:
    widget(st.number_input, "Seed", "wl_seed", min_value=0, max_value=2**31 - 1, step=1)
st.caption(
    "ShareGPT / Alpaca lengths follow the PagedAttention paper's means (Figure 11), clipped so each request fits "
    "the shorter max_model_len of the scenarios shown. The what-if assumes a saturated server: as many requests "
    "run as memory (and max_num_seqs) allow."
)

values = dict(st.session_state[STATE])

# The URL mirrors the inputs (written before any computation can fail, so a shared link always reproduces them).
encoded = url_params(values)
if st.query_params.to_dict() != encoded:
    st.query_params.from_dict(encoded)
st.session_state[WRITTEN] = encoded

requests, workload_error = None, None
max_len = min(values[f"{prefix}ctx"] for prefix in prefixes)
try:
    requests = cached_workload(
        values["wl"], values["wl_n"], values["wl_prompt"], values["wl_output"], values["wl_seed"], max_len
    )
except LabError as error:
    workload_error = str(error)
    st.error(f"Workload: {error}")

results = {}
for prefix in prefixes:
    try:
        results[prefix] = compute_scenario(values, prefix, requests, workload_error)
    except LabError as error:
        st.error(f"{NAMES[prefix]}: {error}")

if not results:
    st.info("Fix the inputs above to see a plan.")
    st.stop()

st.divider()
columns = st.columns(len(prefixes))
for column, prefix in zip(columns, prefixes, strict=True):
    if prefix not in results:
        continue
    result = results[prefix]
    with column:
        st.markdown(
            f"#### {NAMES[prefix]}: {result.model.name} on {result.plan.num_gpus} × {result.gpu.name}"
        )
        (st.success if result.plan.fits else st.error)(result.plan.verdict)
        if result.model.is_hybrid or len(result.plan.kv_layout.groups) > 1:
            st.markdown("KV cache groups, as vLLM V1 lays them out:")
            st.dataframe(pd.DataFrame(kv_group_rows(result.plan)), hide_index=True, width="stretch")
            comparison = hybrid_comparison(result)
            if comparison:
                st.caption(comparison)
        if result.workload_error and result.workload_error != workload_error:
            st.warning(f"Workload what-if: {result.workload_error}")
        with st.expander("Formula, with these numbers", expanded=prefix == "a_"):
            for line in formula_lines(result):
                st.markdown(f"- {line}")
            for note in result.plan.notes:
                st.caption(note)
        st.markdown("`vllm serve` flags for this plan:")
        st.code(result.plan.vllm_command, language="bash")

st.subheader("Key figures" + (" (B's deltas against A)" if len(results) > 1 else ""))
for prefix, result in results.items():
    if len(results) > 1:
        st.markdown(f"**{NAMES[prefix]}**")
    show_metrics(prefix, result, results.get("a_") if prefix == "b_" else None)

st.subheader("Memory per GPU")
breakdowns = {NAMES[p]: memory_breakdown(r.plan, r.what_if) for p, r in results.items()}
st.plotly_chart(
    memory_breakdown_figure(breakdowns, {NAMES[p]: r.plan.gpu_memory_bytes for p, r in results.items()}),
    width="stretch",
)
st.caption(
    "KV used = blocks held by the workload's requests at their average paged concurrency (capped at "
    "max_num_seqs); the rest of the KV budget is free. The black mark is the GPU's memory."
)

st.subheader("Max concurrency vs context length")
first_prefix = next(iter(results))
first = results[first_prefix]
top = min(first.model.max_position_embeddings, 1 << 20)
contexts = sorted({*(1 << k for k in range(9, 21) if (1 << k) <= top), first.plan.max_model_len})
series = {}
for prefix, result in results.items():
    label = (
        f"{NAMES[prefix][-1]}: {result.plan.num_gpus}× {result.gpu.name}, tp {result.plan.tensor_parallel}"
    )
    if result.model.name == first.model.name:
        series[label] = concurrency_vs_context(result.plan, contexts)
for slug in comparison_gpus(values[f"{first_prefix}gpu"]):
    try:
        other = plan(
            first.model,
            GPUS[slug],
            num_gpus=first.plan.num_gpus,
            tensor_parallel=first.plan.tensor_parallel,
            pipeline_parallel=first.plan.pipeline_parallel,
            weight_dtype=first.plan.weight_dtype,
            kv_dtype=first.plan.kv_dtype,
            gpu_memory_utilization=first.plan.gpu_memory_utilization,
            block_size=first.plan.block_size,
            max_model_len=first.plan.max_model_len,
            activation_reserve=None if first.plan.activation_estimated else first.plan.activation_bytes,
            max_num_batched_tokens=first.plan.max_num_batched_tokens,
            hybrid_kv_cache_manager=first.plan.hybrid_kv_cache_manager,
        )
    except LabError:
        continue
    series[f"{other.num_gpus}× {GPUS[slug].name}, tp {other.tensor_parallel}"] = concurrency_vs_context(
        other, contexts
    )
st.plotly_chart(concurrency_vs_context_figure(contexts, series, first.plan.max_model_len), width="stretch")
st.caption(
    f"{first.model.name}, same parallelism and dtypes on two comparison GPUs. A request of c tokens holds "
    "ceil(c / block size) blocks; a line that stops means no request of that length fits (log scale has no 0). "
    "Memory decides concurrency (GPUs of equal memory draw the same line); bandwidth decides speed."
)

what_ifs = {NAMES[p]: r.what_if for p, r in results.items() if r.what_if is not None}
if what_ifs:
    st.subheader("Paged vs contiguous concurrency for this workload")
    st.plotly_chart(
        paged_vs_contiguous_figure(
            what_ifs, {NAMES[p]: r.plan.max_num_seqs for p, r in results.items() if r.what_if}
        ),
        width="stretch",
    )
    lines = []
    for name, w in what_ifs.items():
        ratio = w.paged_memory_concurrency / max(w.contiguous_memory_concurrency, 1)
        lines.append(
            f"**{name}**: a request holds {w.mean_tokens_held:,.0f} tokens on average over its decode steps "
            f"({w.mean_blocks_held:,.1f} blocks); paging holds {w.paged_memory_concurrency:,.0f} such requests "
            f"where reserving {w.reservation_tokens:,} tokens each holds {w.contiguous_memory_concurrency:,} "
            f"({ratio:,.1f}×). Limited by {w.limited_by} at {w.paged_concurrency:,.0f}."
        )
    st.markdown("  \n".join(lines))

    st.subheader("Internal fragmentation vs block size")
    frag_prefix = next(p for p, r in results.items() if r.fragmentation)
    frag_result = results[frag_prefix]
    st.plotly_chart(
        fragmentation_figure(frag_result.fragmentation, frag_result.plan.block_size), width="stretch"
    )
    st.caption(
        "Share of allocated KV slots that hold no token (the unfilled tail of each request's last block), "
        "averaged over decode steps. Small blocks waste less but mean more block-table entries."
    )

document = plan_document(values, {NAMES[p]: r for p, r in results.items()})
document["url_query"] = encoded
st.download_button(
    "Download the plan (JSON)",
    data=json.dumps(document, indent=2),
    file_name="capacity_plan.json",
    mime="application/json",
)

with st.expander("Presets: models and GPUs (the data behind the numbers)"):
    model_rows = [
        {
            "slug": slug,
            "model": m.name,
            "layers": m.num_layers,
            "heads": m.num_attention_heads,
            "attention": "MLA" if m.is_mla else ("MHA" if m.num_kv_heads == m.num_attention_heads else "GQA"),
            "layer types": ", ".join(f"{n} {kind}" for kind, n in Counter(m.layer_kinds).items()),
            "KV heads (MLA: 1 latent)": m.num_kv_heads,
            "head_dim": m.head_dim,
            "max positions": m.max_position_embeddings,
            "params (B)": m.num_params / 1e9,
            "active (B)": m.num_params_active / 1e9,
            "KV B/token (auto dtype, tp 1)": kv_bytes_per_token(m),
            "dtype": m.compute_dtype,
        }
        for slug, m in MODELS.items()
    ]
    st.dataframe(pd.DataFrame(model_rows), hide_index=True, width="stretch")
    gpu_rows = [
        {
            "slug": slug,
            "GPU": g.name,
            "memory (GiB)": g.memory_gib,
            "memory (GB, 1e9 B)": g.memory_gb,
            "bandwidth (GB/s)": g.memory_bandwidth / 1e9,
            "bf16 dense TFLOP/s": (g.peak_bf16_flops or 0) / 1e12,
            "type": g.memory_type,
            "source": g.source,
        }
        for slug, g in GPUS.items()
    ]
    st.dataframe(pd.DataFrame(gpu_rows), hide_index=True, width="stretch")
    st.caption(
        "Vendors' “80GB” HBM is 80 GiB; the driver reports ~1% less (e.g. 79.1 GiB on an H100). "
        "Use a custom GPU with your nvidia-smi figure for the last percent."
    )
    chosen = values["a_model"] if values["a_model"] != CUSTOM else "llama-3.1-8b"
    st.markdown(f"config.json fields of `{chosen}` (a template for a custom model):")
    st.json(preset_configs()[chosen], expanded=False)
