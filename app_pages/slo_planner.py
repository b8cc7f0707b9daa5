"""SLO planner: the cheapest deployment that serves a workload within a TTFT / TPOT p95 target, and its latency
against the request rate; or ("predict my deployment") one deployment's steady-state percentiles at one load and
the highest rate it holds within the targets, with the vLLM commands to check it. Every input in the URL."""

import shlex

import streamlit as st

from core.errors import LabError
from core.fields import field_named
from core.page_models.slo_planner import (
    chart_configs,
    column_name,
    config_label,
    config_layout,
    serve_command,
    table_rows,
)
from core.page_models.slo_predict import larger_kv_given_row, missed_targets, percentile_rows
from core.page_models.slo_rates import MAX_RATE_CONFIGS, bench_command
from core.page_models.tasks import (
    slo_curves,
    slo_highest_rates,
    slo_predict,
    slo_predict_highest_rate,
    slo_predict_larger_kv,
    slo_search,
)
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.fits.profile_checks import search_check_words
from core.planning.predict.deployment_fields import GPU_FIELD, MODEL_FIELD, PARALLEL_FIELDS, SETTING_FIELDS
from core.planning.search.search_fields import SEARCH_URL_FIELDS
from core.planning.search.slo_candidates import metric_label
from ui.charts import cached_chart, cached_dataframe, cached_value
from ui.input_fields import input_widget
from ui.jobs import run_job
from ui.metric_cards import Card, metric_cards
from ui.slo_planner.against_view import show_against_run
from ui.slo_planner.figures import latency_vs_rate_figure, percentiles_figure
from ui.slo_planner.levers_view import (
    latency_text,
    lever_inputs,
    percentiles_caption,
    show_larger_kv,
    show_prediction_figures,
)
from ui.slo_planner.state import (
    ENGINE,
    FIELDS,
    MODE_LABELS,
    RATE,
    RATE_FIELDS,
    SHAPE_FIELDS,
    TARGET_METRICS,
    VLLM_VERSION,
    params_from,
    predict_params_from,
    url_params,
)
from ui.url_widgets import UrlState

state = UrlState("_slo_planner", FIELDS)
TABLE_FORMATS = {
    "output tokens/s": "%.0f",
    "GPUs per req/s": "%.3g",
    "worst / target": "%.2f",
    "highest rate (req/s)": "%.3g",
    "tokens/s per GPU": "%.0f",
    "KV transfer (ms)": "%.3g",
}


def inputs() -> None:
    """The form of every input (each in the URL); the search runs on submit."""
    w = state.widget
    with st.form("slo_planner"):
        c1, c2, c3 = st.columns(3)
        with c1:
            st.markdown("**Workload**")
            input_widget(w, st.selectbox, MODEL_FIELD, format_func=lambda m: MODELS[m].name)
            input_widget(w, st.number_input, RATE)
            for field in SHAPE_FIELDS:
                input_widget(w, st.slider if field.name == "length_spread" else st.number_input, field)
        with c2:
            target_inputs()
        with c3:
            st.markdown("**Search space**")
            gpus, max_gpus, kv_dtypes, weight_dtypes, disagg_too = SEARCH_URL_FIELDS
            input_widget(w, st.multiselect, gpus, format_func=lambda g: GPUS[g].name)
            input_widget(w, st.number_input, max_gpus)
            input_widget(w, st.multiselect, kv_dtypes)
            input_widget(w, st.multiselect, weight_dtypes)
            input_widget(w, st.selectbox, ENGINE, help=ENGINE_HELP)
            input_widget(w, st.text_input, VLLM_VERSION, placeholder="today's", help=VLLM_VERSION_HELP)
            w(
                st.checkbox,
                f"Find the highest rate of the top {MAX_RATE_CONFIGS} configurations",
                "rates",
                help="a bisection of steady-state predictions each: about 10 s per configuration on 2 CPU cores",
            )
            input_widget(
                w,
                st.checkbox,
                disagg_too,
                help="x prefill workers and y decode workers, each its own TP, the KV cache moved between them; "
                "ranked with the aggregated ones (at least 2 GPUs)",
            )
        st.form_submit_button("Search", type="primary")


ENGINE_HELP = (
    "vllm-cross-model (the default): vLLM fitted across three models and checked on four it never saw, with a "
    "per-request front-end time in TTFT; vllm: fitted to one model's measured vLLM runs (Llama-3.1-70B); "
    "trtllm: to TensorRT-LLM's table. The flags printed are vLLM's for either vLLM profile"
)


VLLM_VERSION_HELP = (
    "the vLLM release to price, e.g. 0.12.0 (empty: today's vLLM). vLLM 0.12 computed the padded rows of "
    "block-FP8 experts' DeepGEMM kernel on Hopper / Blackwell (e.g. Qwen3-235B-A22B-FP8): a decode step far "
    "dearer than today's; docs/slo.md 2c"
)


def target_inputs(note: str = "") -> None:
    """The latency targets, each a value and its percentile (p50 ... p99); an empty value is no target."""
    st.markdown(f"**Latency targets{note}**")
    for metric in TARGET_METRICS:  # each a value (its unit) and its percentile, declared once
        a, b = st.columns([2, 1])
        with a:
            state.widget(st.number_input, metric.label, metric.url_key, placeholder="no target")
        with b:
            state.widget(st.selectbox, "percentile", metric.q_key, format_func=lambda q: f"p{q}")


def show_config(config, meets: bool, params) -> None:
    """The answer's figures: the deployment, its predicted TTFT / TPOT (at the chart's percentiles) against the
    targets, throughput, binding; then its `vllm serve` flags beside the `vllm bench serve` command."""
    reason = config.reason[:1].upper() + config.reason[1:]
    if meets:
        st.success(f"Cheapest configuration that meets the SLO: **{config_label(config)}**. {reason}.")
    else:
        st.warning(f"Closest configuration (misses the SLO): **{config_label(config)}**. {reason}.")
    if config.mode == "disagg":
        transfer = f"{config_layout(config)}; KV transfer {config.kv_transfer_s * 1e3:.3g} ms per request"
        split = Card("Prefill + decode GPUs", f"{config.prefill_gpus} + {config.decode_gpus}", transfer)
    else:
        split = Card("TP × PP × replicas", f"{config.tp} × {config.pp} × {config.replicas}")
    cards = [
        Card("Deployment", f"{config.num_gpus} × {config.gpu_name}"),
        split,
        Card("Binding constraint", config.binding),
        Card("GPUs per request/s", f"{config.gpus_per_request_per_s:.3g}"),
        Card("max_num_seqs", f"{config.max_num_seqs:,}"),
        Card("KV cache dtype", config.kv_dtype, f"weights: {config.weight_dtype}"),
    ]
    targets = dict(params.targets)
    for key, factor, unit in ((params.chart_keys()[0], 1, "s"), (params.chart_keys()[1], 1e3, "ms")):
        value = getattr(config, key)
        shown = "—" if value is None else f"{value * factor:.3g} {unit}"
        target = "no target" if key not in targets else f"target {targets[key] * factor:g} {unit}"
        cards.append(Card(f"{metric_label(key)} (predicted)", shown, target))
    throughput = config.throughput_tokens_per_s
    cards.append(Card("Output throughput", "—" if throughput is None else f"{throughput:,.0f} tok/s"))
    metric_cards(cards)
    if config.tokens_per_s_per_gpu is not None:
        st.caption(f"{config.tokens_per_s_per_gpu:,.0f} output tokens/s per GPU ({config.mode}).")
    left, right = st.columns(2)
    with left:
        st.markdown("`vllm serve` flags for this configuration:")
        st.code(cached_value(serve_command, params, config), language="bash", wrap_lines=True)
    with right:
        st.markdown("`vllm bench serve`, replaying this workload against it:")
        st.code(cached_value(bench_command, params, config), language="bash", wrap_lines=True)


def show_curves(curves, params, meeting: bool) -> None:
    """The chart and its caption, or why there is nothing to draw (a bound ruled out every rate)."""
    if not any(c.simulated for c in curves):
        st.info(
            f"Nothing to draw: at every rate from {curves[0].rates[0]:.3g} to {curves[0].rates[-1]:.3g} req/s a "
            f"bound rules these configurations out without simulating ({curves[0].label}: "
            f"{curves[0].reasons[0]})."
        )
        return
    targets = dict(params.targets)
    ttft_key, tpot_key = params.chart_keys()
    cached_chart(
        st, latency_vs_rate_figure, curves, params.rate, targets.get(ttft_key), targets.get(tpot_key)
    )
    knees = "; ".join(
        f"{c.label}: not drawn, a bound rules out every rate ({c.reasons[0]})"
        if not c.simulated
        else f"{c.label}: knee at {c.knee_rate:.3g} req/s ({c.knee_reason})"
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
        + (
            " Disaggregated configurations are not drawn (two pools, not one curve): see the table."
            if params.disagg
            else ""
        )
    )


def search_caption(plan) -> str:
    whole = (
        "every candidate"
        if plan.complete
        else f"stopping after the GPU count at which {plan.candidates.max_meeting} met the SLO, so every cheaper "
        "one was evaluated"
    )
    best = plan.best
    checked = (
        "" if best is None else search_check_words(plan.profile_check, plan.model, best.gpu, best.gpu_name)
    )
    return (
        f"{plan.num_evaluated:,} of {plan.num_candidates:,} candidate deployments evaluated in rank order (fewest "
        f"GPUs, then total memory bandwidth as the cost proxy: no GPU price is used), {whole}; "
        f"{plan.num_simulated:,} simulated to their steady state (Poisson arrivals, warm-up dropped), "
        f"{plan.num_reused:,} answered by an identical run, the rest ruled out by memory or a bound. Step times "
        f"from the roofline model with the {plan.candidates.engine} engine profile's fitted efficiencies"
        f"{release_words(plan.candidates.vllm_version)} "
        f"(docs/slo.md).{' ' + checked if checked else ''}"
    )


def release_words(vllm_version: str | None) -> str:
    """ " at vLLM 0.12.0's kernels" for a release the user named, "" for today's vLLM."""
    return f" at vLLM {vllm_version}'s kernels" if vllm_version else ""


PREDICT_COLUMNS = ("predicted (ms)", "95% interval low (ms)", "95% interval high (ms)", "target (ms)")
LOAD_LABELS = {"rate": "request rate (Poisson)", "concurrency": "concurrent clients (closed loop)"}


def predict_inputs() -> None:
    """The predict mode's form: the deployment, the load, optional targets (each in the URL)."""
    w = state.widget
    with st.form("slo_predict"):
        c1, c2, c3 = st.columns(3)
        with c1:
            st.markdown("**Deployment**")
            input_widget(w, st.selectbox, MODEL_FIELD, format_func=lambda m: MODELS[m].name)
            input_widget(w, st.selectbox, GPU_FIELD, format_func=lambda g: GPUS[g].name)
            for column, field in zip(st.columns(3), PARALLEL_FIELDS, strict=True):
                with column:
                    input_widget(w, st.number_input, field)
            input_widget(w, st.number_input, field_named(SETTING_FIELDS, "max_num_seqs"))
            input_widget(w, st.selectbox, field_named(SETTING_FIELDS, "kv_dtype"))
            input_widget(w, st.selectbox, field_named(SETTING_FIELDS, "weight_dtype"))
            input_widget(w, st.selectbox, ENGINE, help=ENGINE_HELP)
            input_widget(w, st.text_input, VLLM_VERSION, placeholder="today's", help=VLLM_VERSION_HELP)
        with c2:
            st.markdown("**Load**")
            w(st.radio, "Load given as", "load", format_func=LOAD_LABELS.get)
            for field in RATE_FIELDS:
                input_widget(w, st.number_input, field)
            for field in SHAPE_FIELDS:
                input_widget(w, st.slider if field.name == "length_spread" else st.number_input, field)
        with c3:
            target_inputs(" (optional)")
        lever_inputs(state.widget)
        st.form_submit_button("Predict", type="primary")


def show_prediction(found, params) -> None:
    """The predict mode's first answer: verdict, figures, the percentile chart and table, the equivalent CLI and
    the vLLM commands; then the extras, each its own job with its own progress, in places kept above the
    commands: what a larger KV cache does (prompts sharing tokens) and the highest rate (targets given)."""
    p, targets = found.prediction, params.targets_dict()
    load = params.load()
    at = f"{load.rate:g} req/s" if load.concurrency is None else f"{load.concurrency:,} concurrent clients"
    name = f"{p['deployment']['num_gpus']} × {p['deployment']['gpu']}"
    if not p["stable"]:
        st.warning(
            f"**{name} does not keep up with {at}**: its queue grows, so there is no steady state; the "
            "latencies below grow with the simulated horizon and describe it, not the load."
        )
    elif missed_targets(p, targets):
        misses = "; ".join(
            f"{k} {latency_text(p[k])} against {latency_text(targets[k])}" for k in missed_targets(p, targets)
        )
        st.warning(f"At {at}, {name} misses the targets: {misses}.")
    else:
        st.success(f"At {at}, {name} is in steady state{' and meets every target' if targets else ''}.")
    show_prediction_figures(p, params)
    cached_chart(st, percentiles_figure, p, targets)
    st.caption(percentiles_caption(p))
    formats = {k: st.column_config.NumberColumn(format="%.4g") for k in PREDICT_COLUMNS}
    cached_dataframe(st, cached_value(percentile_rows, p, targets), width="stretch", column_config=formats)
    larger_place, rate_place = st.container(), st.container()  # filled below, once the commands are drawn
    asks_rate = bool(targets) and p["mode"] != "disagg"
    if p["mode"] == "disagg" and targets:
        st.caption("No highest rate: `max-rate` takes one aggregated deployment, not two pools.")
    predict_args, max_rate_args = params.cli_args()
    st.markdown("The same answer from the command line:")
    commands = [shlex.join(["python", "-m", "core.planning", "predict", *predict_args])]
    if asks_rate:
        commands.append(shlex.join(["python", "-m", "core.planning", "max-rate", *max_rate_args]))
    st.code("\n".join(commands), language="bash", wrap_lines=True)
    left, right = st.columns(2)
    with left:
        st.markdown("`vllm serve` flags for this deployment:")
        st.code(found.serve_command, language="bash", wrap_lines=True)
    with right:
        st.markdown("`vllm bench serve`, replaying this load against it:")
        st.code(found.bench_command, language="bash", wrap_lines=True)
    st.caption(
        f"{found.num_prompts:,} prompts: 20 × the requests in flight (Little's law), at least 1,000, so the ramp-up "
        "and the drain that vLLM's percentiles include are about a tenth of the run. --random-range-ratio is the "
        "length spread (the same uniform range, to a token); --ignore-eos makes every output its full length."
    )
    if p["mode"] != "disagg":
        show_against_run(p, load)
    if p["mode"] != "disagg" and load.uses_prefix_cache:
        with larger_place:
            show_larger_kv_job(p, params)
    if asks_rate:
        with rate_place:
            show_highest_rate_job(params, targets)


def show_larger_kv_job(p: dict, params) -> None:
    """What a larger KV cache does: its own job (one prediction per larger deployment), then the table."""
    try:
        others = run_job(
            slo_predict_larger_kv, params, label="Predicting the same load with a larger KV cache"
        )
    except LabError as error:
        st.error(f"Cannot predict a larger KV cache: {error}")
        return
    show_larger_kv((larger_kv_given_row(params, p), *others))


def show_highest_rate_job(params, targets: dict[str, float]) -> None:
    """The highest rate within the targets: its own job (a bisection of predictions), then its cards."""
    try:
        m = run_job(slo_predict_highest_rate, params, label="Finding the highest rate within the targets")
    except LabError as error:
        st.error(f"Cannot find the highest rate: {error}")
        return
    binding = m["binding"]
    there = latency_text(m.get(binding)) if binding in targets else "—"
    metric_cards(
        [
            Card("Highest rate within the targets", f"{m['max_rate_req_per_s']:.3g} req/s"),
            Card("Binding at the next rate", binding),
            Card("Binding target at the highest rate", there, "its predicted value at the highest rate held"),
        ]
    )
    st.caption(
        f"The highest Poisson rate of these lengths whose steady state meets every target, by bisection "
        f"({m['evaluations']} predictions, 3% apart at the end; MLPerf's Server figure). Binding: the target "
        'the next higher rate missed ("rate": it was not served at all).'
    )
    if m.get("vllm_bench_command"):
        with st.expander("`vllm bench serve` at that rate, to check it"):
            st.code(m["vllm_bench_command"], language="bash", wrap_lines=True)


def show_table(table, caption, plan, params, rates) -> None:
    """The ranked table and its caption, in their placeholders; `rates`: the highest rates found so far."""
    numbers = {k: st.column_config.NumberColumn(format=v) for k, v in TABLE_FORMATS.items()}
    numbers |= {column_name(k): st.column_config.NumberColumn(format="%.4g") for k, _ in params.targets}
    numbers |= {column_name(k): st.column_config.NumberColumn(format="%.4g") for k in params.chart_keys()}
    rows = cached_value(table_rows, plan, params, rates)
    cached_dataframe(table, rows, width="stretch", column_config=numbers)
    caption.caption(
        "Every configuration evaluated, ranked by GPU count, then cost proxy, then meeting the SLO and headroom; "
        "steady-state percentiles (TTFT and e2e in s, TPOT and ITL in ms). worst / target: the largest predicted "
        "(or lower-bound) percentile over its target, or rate over capacity. highest rate: the highest Poisson "
        "rate of these lengths whose steady state meets every target (`max_rate`, bisection to 3%), computed for "
        f"the configurations the chart draws that meet the SLO (at most {MAX_RATE_CONFIGS}; here {len(rates)}"
        + ("" if state.values["rates"] else ": not asked for, see the search space")
        + ")"
        + "".join(f"; {r.label}: {r.max_req_per_s:.3g} req/s ({r.binding} binds above)" for r in rates)
        + "."
    )


st.title("SLO planner")
st.markdown(
    "The cheapest GPU deployment (type, count, TP/PP, max_num_seqs, KV dtype) that serves your traffic within "
    "latency targets on any percentile (p50 ... p99) of TTFT, TPOT, ITL or end-to-end latency, predicted in steady "
    "state by the step-time model and the continuous-batching simulator, with latency against request rate and "
    "the highest rate each holds for the best configurations; or, for the deployment you run, its steady-state "
    "latency percentiles at your load and the highest rate it holds within your targets, with the `vllm bench "
    "serve` command that checks it on your GPU. The levers serving engineers pull are inputs: shared prefixes "
    "and chats (through the simulator's real prefix cache), speculative decoding, disaggregated prefill / "
    "decode. Every input is in the URL: copy it to share."
)
state.sync_from_url()
mode = state.widget(st.radio, "Question", "mode", horizontal=True, format_func=MODE_LABELS.get)
answer = st.container()  # the answer and the chart, drawn once computed, above the inputs

with answer:  # at the top of the answer, which is computed with the defaults put in their place
    for message in state.pop_errors():  # shown once; the URL is rewritten with valid values below
        st.error(message)
st.subheader("Inputs")
if mode == "predict":
    predict_inputs()
else:
    inputs()
state.write_url(url_params(dict(state.values)))  # before anything can fail: a link reproduces the inputs

if mode == "predict":
    params = predict_params_from(state.values)
    with answer:
        try:
            params.check()
            found = run_job(slo_predict, params, label="Predicting the deployment")
        except LabError as error:
            st.error(f"Cannot predict: {error}")
            st.stop()
        show_prediction(found, params)
    st.stop()

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
        st.subheader(f"{' and '.join(metric_label(k) for k in params.chart_keys())} against request rate")
        try:
            curves = run_job(slo_curves, params, configs, label="Predicting latency against rate")
        except LabError as error:
            st.error(f"Cannot draw the latency curves: {error}")
        else:
            show_curves(curves, params, plan.best is not None)
    st.subheader("Configurations, ranked")
    table, caption = st.empty(), st.empty()  # drawn at once, then again with the highest rates when found
    show_table(table, caption, plan, params, ())
    meeting = tuple(c for c in configs if c.meets_slo)[:MAX_RATE_CONFIGS]
    if meeting and state.values["rates"]:
        try:
            rates = run_job(
                slo_highest_rates, params, meeting, label="Finding each configuration's highest rate"
            )
        except LabError as error:
            st.error(f"Cannot find the highest rates: {error}")
        else:
            show_table(table, caption, plan, params, rates)
