"""SLO planner: the cheapest deployment that serves a workload within a TTFT / TPOT p95 target, and its latency
against the request rate, every input in the URL."""

import streamlit as st

from core.errors import LabError
from core.page_models.slo_planner import chart_configs, config_label, serve_command, table_rows
from core.page_models.tasks import slo_curves, slo_search
from core.planning.hardware import GPUS
from core.planning.models import MODELS
from ui.charts import cached_chart, cached_dataframe, cached_value
from ui.jobs import run_job
from ui.slo_planner_figures import latency_vs_rate_figure
from ui.slo_planner_state import FIELDS, params_from, url_params
from ui.url_widgets import UrlState

state = UrlState("_slo_planner", FIELDS)
TABLE_FORMATS = {
    "TTFT p95 (s)": "%.3f", "TPOT p95 (ms)": "%.1f", "output tokens/s": "%.0f", "GPUs per req/s": "%.3g",
    "worst / target": "%.2f",
}  # fmt: skip


def inputs() -> None:
    """The form of every input (each in the URL); the search runs on submit."""
    w = state.widget
    with st.form("slo_planner"):
        c1, c2, c3 = st.columns(3)
        with c1:
            st.markdown("**Workload**")
            w(st.selectbox, "Model", "model", format_func=lambda m: MODELS[m].name)
            w(st.number_input, "Request rate (requests/s, Poisson)", "rate")
            w(st.number_input, "Prompt length (tokens)", "prompt_len")
            w(st.number_input, "Output length (tokens)", "output_len")
            w(st.slider, "Length spread (each length uniform in ± this share)", "spread")
        with c2:
            st.markdown("**Latency target (p95)**")
            w(st.number_input, "TTFT p95 target (s)", "ttft", placeholder="no target")
            w(st.number_input, "TPOT p95 target (ms)", "tpot_ms", placeholder="no target")
        with c3:
            st.markdown("**Search space**")
            w(st.multiselect, "GPU types", "gpus", format_func=lambda g: GPUS[g].name)
            w(st.number_input, "Most GPUs per deployment", "max_gpus")
            w(st.multiselect, "KV cache dtypes", "kv")
            w(st.multiselect, "Weight dtypes", "weights")
        st.form_submit_button("Search", type="primary")


def show_config(config, meets: bool, params) -> None:
    """The answer's figures: the deployment, its predicted p95s against the targets, throughput, binding."""
    reason = config.reason[:1].upper() + config.reason[1:]
    if meets:
        st.success(f"Cheapest configuration that meets the SLO: **{config_label(config)}**. {reason}.")
    else:
        st.warning(f"Closest configuration (misses the SLO): **{config_label(config)}**. {reason}.")
    c = st.columns([2, 1.2, 1.6, 1])
    c[0].metric("Deployment", f"{config.num_gpus} × {config.gpu_name}")
    c[1].metric("TP × PP × replicas", f"{config.tp} × {config.pp} × {config.replicas}")
    c[2].metric("Binding constraint", config.binding)
    c[3].metric("GPUs per request/s", f"{config.gpus_per_request_per_s:.3g}")
    c = st.columns([1, 1, 1, 1, 1.4])
    c[0].metric("max_num_seqs", f"{config.max_num_seqs:,}")
    c[1].metric("KV cache dtype", config.kv_dtype, help=f"weights: {config.weight_dtype}")
    ttft = "—" if config.ttft_p95_s is None else f"{config.ttft_p95_s:.3g} s"
    tpot = "—" if config.tpot_p95_s is None else f"{config.tpot_p95_s * 1e3:.3g} ms"
    ttft_help = "no target" if params.ttft_p95_s is None else f"target {params.ttft_p95_s:g} s"
    tpot_help = "no target" if params.tpot_p95_s is None else f"target {params.tpot_p95_s * 1e3:g} ms"
    c[2].metric("TTFT p95 (predicted)", ttft, help=ttft_help)
    c[3].metric("TPOT p95 (predicted)", tpot, help=tpot_help)
    throughput = config.throughput_tokens_per_s
    c[4].metric("Output throughput", "—" if throughput is None else f"{throughput:,.0f} tok/s")
    st.markdown("`vllm serve` flags for this configuration:")
    st.code(cached_value(serve_command, params, config), language="bash")


def show_curves(curves, params, meeting: bool) -> None:
    """The chart and its caption, or why there is nothing to draw (a bound ruled out every rate)."""
    if not any(c.simulated for c in curves):
        st.info(
            f"Nothing to draw: at every rate from {curves[0].rates[0]:.3g} to {curves[0].rates[-1]:.3g} req/s a "
            f"bound rules these configurations out without simulating ({curves[0].label}: "
            f"{curves[0].reasons[0]})."
        )
        return
    cached_chart(st, latency_vs_rate_figure, curves, params.rate, params.ttft_p95_s, params.tpot_p95_s)
    knees = "; ".join(
        f"{c.label}: knee at {c.knee_rate:.3g} req/s ({c.knee_reason})"
        if c.knee_rate is not None
        else f"{c.label}: no knee up to {c.rates[-1]:.3g} req/s"
        for c in curves
    )
    which = "that meet the SLO" if meeting else "closest to the SLO (none meets it)"
    st.caption(
        f"The {len(curves)} best-ranked configurations {which}, one per deployment (topped up by the closest "
        f"that miss it when fewer meet it), each evaluated as the search does at {len(curves[0].rates)} rates "
        f"from 0.25x to 2x the target {params.rate:g} req/s (dotted line); dashed lines: the targets. The knee "
        "(✕ and a dashed line in the configuration's colour) is the first rate where queueing binds or the "
        f"throughput bound rules the rate out; a line stops where a bound ruled its points out. {knees}."
    )


def search_caption(plan) -> str:
    whole = (
        "every candidate"
        if plan.complete
        else f"stopping after the GPU count at which {plan.candidates.max_meeting} met the SLO, so every cheaper "
        "one was evaluated"
    )
    return (
        f"{plan.num_evaluated:,} of {plan.num_candidates:,} candidate deployments evaluated in rank order (fewest "
        f"GPUs, then total memory bandwidth as the cost proxy: no GPU price is used), {whole}; "
        f"{plan.num_simulated:,} simulated to their steady state (Poisson arrivals, warm-up dropped), "
        f"{plan.num_reused:,} answered by an identical run, the rest ruled out by memory or a bound. Step times "
        f"from the roofline model with the {plan.candidates.engine} engine profile's fitted efficiencies "
        "(docs/slo.md)."
    )


st.title("SLO planner")
st.markdown(
    "The cheapest GPU deployment (type, count, TP/PP, max_num_seqs, KV dtype) that serves your traffic within a "
    "p95 TTFT and TPOT target, predicted by the step-time model and the continuous-batching simulator, with "
    "latency against request rate for the best configurations. Every input is in the URL: copy it to share."
)
answer = st.container()  # the answer and the chart, drawn once the search is done, above the inputs

state.sync_from_url()
for message in state.pop_errors():  # shown once; the URL is rewritten with valid values below
    st.error(message)
st.subheader("Inputs")
inputs()
state.write_url(url_params(dict(state.values)))  # before anything can fail: a link reproduces the inputs

params = params_from(state.values)
with answer:
    try:
        params.check()
        found = run_job(slo_search, params, label="Searching configurations")
    except LabError as error:
        st.error(f"Cannot plan: {error}")
        st.stop()
    plan = found.plan
    if found.error:
        st.error(found.error)
    shown = plan.best or next(iter(chart_configs(plan)), None)
    if shown is not None:
        show_config(shown, plan.best is not None, params)
    st.caption(search_caption(plan))
    configs = chart_configs(plan)
    if configs:
        st.subheader("p95 latency against request rate")
        try:
            curves = run_job(slo_curves, params, configs, label="Predicting latency against rate")
        except LabError as error:
            st.error(f"Cannot draw the latency curves: {error}")
        else:
            show_curves(curves, params, plan.best is not None)
    st.subheader("Configurations, ranked")
    formats = {k: st.column_config.NumberColumn(format=v) for k, v in TABLE_FORMATS.items()}
    cached_dataframe(st, cached_value(table_rows, plan), width="stretch", column_config=formats)
    st.caption(
        "Every configuration evaluated, ranked by GPU count, then cost proxy, then meeting the SLO and headroom. "
        "worst / target: the largest predicted (or lower-bound) p95 over its target, or rate over capacity."
    )
