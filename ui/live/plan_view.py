"""The Live page's predicted-against-observed views: the capacity planner's blocks beside the server's, and the
latency the simulator plans beside the latency the server's histograms measured."""

import json
import time

import streamlit as st

from core.errors import LabError
from core.live.history import FLEET
from core.live.poller import source_label
from core.live.served_model import fetch_served_models
from core.page_models.live_planned import PlanCache, ServedConfig, live_plan, served_config
from core.page_models.planner_config import config_from_text, decode_config, encode_config, model_from_config
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS, ModelSpec
from core.planning.cost.cpu_roofline import measure_roofs
from core.planning.memory.plan import PlanInputs
from core.planning.observed.compare import compare_kv_space_with_server, compare_with_server, kv_space_bytes
from ui.live.figures import comparison_figure, planned_observed_figure, source_colors
from ui.live.url import NO_MODEL, LiveInputs
from ui.url_widgets import UrlState

PLAN_KEY = "_live_plan_cache"
SERVED_KEY = "_live_served_models"
CONFIG_TEXT_KEY = "_live_config_text"
SERVED_TTL_S = 60.0  # /v1/models is asked again at most once a minute per server


def served_config_input(state: UrlState) -> None:
    """A pasted config.json for the served model (kept in the URL, encoded as the Planner page keeps one); a bad
    one is reported and the last valid one kept."""
    if CONFIG_TEXT_KEY not in st.session_state:
        blob = state.values["pvo_config"]
        try:
            st.session_state[CONFIG_TEXT_KEY] = json.dumps(decode_config(blob), indent=2) if blob else ""
        except LabError as err:
            st.error(str(err))
            st.session_state[CONFIG_TEXT_KEY] = ""
    text = st.text_area(
        "The served model's config.json (optional)",
        key=CONFIG_TEXT_KEY,
        height=100,
        help="Only needed when the model is no planner preset and the server does not name a model folder on "
        "this machine (vLLM's /v1/models gives its root); the fields the planner reads are kept in the URL.",
    )
    if not text.strip():
        state.values["pvo_config"] = ""
        return
    try:
        config = config_from_text(text)
        model_from_config(config)
        state.values["pvo_config"] = encode_config(config)
    except LabError as err:
        st.error(f"The served model's config.json is not used: {err}")


def served_model_config(live: LiveInputs, source: str) -> ServedConfig | None:
    """The config to plan `source` with: the pasted one, else the one in the folder the server's /v1/models
    names when it runs on this machine (asked at most once a minute); None when neither."""
    given = None
    if live.values["pvo_config"]:
        try:
            given = decode_config(live.values["pvo_config"])
        except LabError:
            given = None  # reported by served_config_input
    urls = list(live.sources.urls)
    url = next((u for u in urls if source_label(u, urls) == source), None)
    if url is None:
        return served_config("", None, given) if given is not None else None
    cache = st.session_state.setdefault(SERVED_KEY, {})
    hit = cache.get(url.url)
    if hit is None or time.monotonic() - hit[0] > SERVED_TTL_S:
        try:
            models = fetch_served_models(url, timeout_s=2.0)
        except LabError:
            models = ()  # core.serve's tiny model, or a server without /v1/models: presets only
        latest = live.watch.history.latest(source)
        names = latest.model_names if latest is not None else ()
        hit = (time.monotonic(), next((m for m in models if m.name in names), models[0] if models else None))
        cache[url.url] = hit
    return served_config(url.host, hit[1], given)


def draw_served_plan(live: LiveInputs) -> bool:
    """The capacity planner's blocks beside the server's for a server that names its KV space (vLLM's CPU build,
    or --kv-cache-memory-bytes) and whose model's config is known; False when there is none to draw."""
    sources_seen = live.watch.history.sources()
    first = live.watch.history.latest(sources_seen[0]) if sources_seen else None
    if first is None or kv_space_bytes(first) is None:
        return False
    config = served_model_config(live, sources_seen[0])
    if config is None:
        return False
    st.subheader("Predicted against observed")
    try:
        model = ModelSpec.from_hf_config(config.config, name=(first.model_names or ("the served model",))[0])
        comparison = compare_kv_space_with_server(
            model, first, int(live.values["context"]), config.max_model_len, live.values["dtype"]
        )
    except LabError as err:
        st.error(f"The planner cannot plan this server's KV space: {err}")
        return True
    st.plotly_chart(comparison_figure(comparison), width="stretch")
    st.caption(
        f"Planned from {config.origin} in the server's own KV space ({', '.join(comparison.settings_from_server)}), "
        "as vLLM sizes an explicit KV space (VLLM_CPU_KVCACHE_SPACE on a CPU): no profiling, no weights taken."
    )
    for sentence in comparison.explanations:
        st.markdown(f"- {sentence}")
    return True


def draw_plan(live: LiveInputs) -> None:
    """The capacity planner's blocks for the preset model and GPU the inputs name, beside the server's."""
    values, history = live.values, live.watch.history
    if values["model"] == NO_MODEL:
        st.caption(
            "Name a model and GPU in the settings below to set the capacity planner's blocks beside the server's."
        )
        return
    first = next((history.latest(s) for s in history.sources() if history.latest(s)), None)
    if first is None:
        return
    st.subheader("Predicted against observed")
    inputs = PlanInputs(MODELS[values["model"]], GPUS[values["gpu"]], tensor_parallel=int(values["tp"]))
    try:
        comparison = compare_with_server(inputs, first, int(values["context"]))
    except LabError as err:
        st.error(f"The planner cannot plan this: {err}")
        return
    st.plotly_chart(comparison_figure(comparison), width="stretch")
    taken = ", ".join(comparison.settings_from_server) or "none published"
    st.caption(f"Planned with the server's own settings where it publishes them ({taken}).")
    for sentence in comparison.explanations:
        st.markdown(f"- {sentence}")


@st.cache_resource(show_spinner=False)
def cpu_roofs() -> dict:
    """This machine's memory bandwidth and FLOP/s, measured once per app process (core.serve's hardware)."""
    return measure_roofs(repeats=6)


def draw_planned_vs_observed(live: LiveInputs) -> None:
    """The simulator's latency, fitted to the first server's window of means, beside its measured percentiles."""
    values, history = live.values, live.watch.history
    sources_seen = history.sources()
    if not sources_seen:
        return
    source = sources_seen[0]  # the first server: a fit is one server's
    cache = st.session_state.setdefault(PLAN_KEY, PlanCache())
    key = (
        source,
        *(
            values[k]
            for k in ("pvo_window", "pvo_seqs", "pvo_tokens", "model", "gpu", "tp", "pvo_config", "dtype")
        ),
    )
    now = history.polls[-1].t
    config = served_model_config(live, source)
    plan = cache.get(key, now, lambda: live_plan(history, source, values, cpu_roofs, config))
    st.subheader("Planned vs observed latency")
    if plan.result is None:
        (st.error if plan.problem else st.caption)(plan.reason)
        return
    colors = source_colors([*sources_seen, FLEET])
    st.plotly_chart(planned_observed_figure(plan.result, colors[source], source), width="stretch")
    fit = plan.result.fit
    if not fit.converged:
        st.warning(
            f"The fit did not converge (held at a bound: {', '.join(fit.at_bound) or 'none'}): this model "
            "and hardware cannot reproduce the window's means; check the model, GPU and limits."
        )
    st.caption(
        f"Planned with {plan.planned_with}: the step-time model's overhead ({1000 * fit.model.overhead_s:,.1f} ms "
        f"per step) and FLOP/s ({100 * fit.flops_vs_roof:.0f}% of {plan.roof}) fitted so that the simulator "
        "reproduces this window's mean prefill time and mean inter-token latency (the histograms' exact sums); "
        "the percentiles are then predicted, and both sides are read through vLLM's buckets. Redone every "
        "minute. Method and measured errors: docs/live-planned.md."
    )
