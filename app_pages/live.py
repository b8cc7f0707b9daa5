"""Live: a running vLLM (or core.serve) server's KV cache, read from its Prometheus metrics and KV cache events."""

import streamlit as st

from core.errors import LabError
from core.live.history import FLEET
from core.live.watch import LiveWatch, PollResult
from core.planning.catalog.hardware import GPUS
from ui.jobs import app_limits
from ui.live.events_view import draw_events, draw_lookup
from ui.live.figures import (
    hit_rate_figure,
    latency_figure,
    preemptions_figure,
    requests_figure,
    source_colors,
    usage_figure,
)
from ui.live.lab_server import lab_server_controls
from ui.live.plan_view import draw_plan, draw_planned_vs_observed, draw_served_plan, served_config_input
from ui.live.url import FIELDS, LiveInputs, resolve_sources
from ui.query_state import encode_params
from ui.url_widgets import UrlState

WATCH_KEY = "_live_watch"
LATENCY_WINDOW_S = 30.0

state = UrlState("_live", FIELDS)

st.title("Live")
st.markdown(
    "What a running vLLM server's KV cache is doing now: usage, queues, preemptions, prefix-cache hits and "
    "latency from its `/metrics`, and, with `--kv-events-config`, the cached blocks themselves as prefix trees. "
    "Several servers (replicas) are drawn one line each and summed as the fleet. The page polls only while "
    "someone has it open."
)

try:
    limits = app_limits()
except LabError as err:
    st.error(f"The operator limits are misconfigured, so the Live page cannot run: {err}")
    st.stop()
if not limits.live_enabled:
    st.info("The operator turned the Live page off on this server (PAGED_LAB_LIVE_HOSTS=off).")
    st.stop()

state.sync_from_url()
for message in state.pop_errors():
    st.error(message)

view = st.container()


lab_server_controls(state, limits)

with st.expander("Sources, polling and the plan to compare with", expanded=True):
    c1, c2, c3 = st.columns(3)
    with c1:
        state.widget(
            st.text_area,
            "Metrics URLs (one per line: replicas of a fleet)",
            "metrics",
            height=100,
            help="http:// or https:// only, e.g. http://127.0.0.1:8000/metrics",
        )
        state.widget(st.number_input, "Poll every (s)", "every")
        state.widget(st.toggle, "Watching (off: pause polling)", "watch")
    with c2:
        state.widget(
            st.text_input, "KV events endpoint (optional)", "events", placeholder="tcp://127.0.0.1:5557"
        )
        state.widget(
            st.text_input, "Replay endpoint (optional)", "replay", placeholder="tcp://127.0.0.1:5558"
        )
        state.widget(
            st.toggle,
            "Bind the events socket here (vLLM connects)",
            "events_bind",
            help="vLLM binds its PUB socket only for a wildcard endpoint (tcp://*:5557): then this page connects "
            "(off). A vLLM whose endpoint names a host (tcp://127.0.0.1:5557) connects to it: then this page "
            "binds that address (on; loopback addresses only). The replay endpoint is always connected to.",
        )
        state.widget(st.text_input, "Topic", "topic")
        state.widget(st.number_input, "Data-parallel ranks (rank r on port + r)", "ranks")
    with c3:
        state.widget(st.selectbox, "Model (for the plan)", "model")
        state.widget(st.selectbox, "GPU (for the plan)", "gpu", format_func=lambda g: GPUS[g].name)
        state.widget(st.number_input, "Tensor parallel", "tp")
        state.widget(st.number_input, "Context length for concurrency (tokens)", "context")
        state.widget(
            st.selectbox,
            "Served dtype (vllm serve --dtype)",
            "dtype",
            help="What a vLLM on this machine's CPU was started with: /metrics does not say it. auto: what vLLM "
            "picks, the checkpoint's dtype with float32 served as bfloat16. The KV cache ('auto') is stored in it.",
        )
        state.widget(st.number_input, "Draw the tree of rank", "tree_rank")
        state.widget(st.number_input, "Planned vs observed: window (s)", "pvo_window")
        state.widget(st.number_input, "max_num_seqs (0: the server's default)", "pvo_seqs")
        state.widget(st.number_input, "max_num_batched_tokens (0: the server's default)", "pvo_tokens")
    served_config_input(state)

with st.expander(
    "Where is my prompt cached (needs a KV events endpoint)", expanded=bool(state.values["lookup"])
):
    st.markdown(
        "A prompt's vLLM block hashes (for text, the server's own tokenizer: its `/tokenize`), looked up in the "
        "cached blocks each watched server announced: how many of its leading full blocks each server and medium "
        "holds, which is what a precise prefix-aware router scores. The answer is drawn below the cached-block tree."
    )
    c1, c2 = st.columns([3, 1])
    with c1:
        state.widget(st.text_area, "Prompt (text, or token ids)", "lookup", height=100)
    with c2:
        state.widget(st.radio, "Read the prompt as", "lookup_as", horizontal=True)
        state.widget(st.selectbox, "The server's --prefix-caching-hash-algo", "hash_algo")
        state.widget(
            st.text_input,
            "The server's NONE_HASH seed",
            "hash_seed",
            help="vllm-none-hash unless the server runs with PYTHONHASHSEED set (then that value)",
        )
        state.widget(st.text_input, "cache_salt (optional)", "cache_salt")

values = dict(state.values)
state.write_url(encode_params(values, FIELDS))
sources, source_errors = resolve_sources(values, limits)
for message in source_errors:
    st.error(message)

if WATCH_KEY not in st.session_state:
    st.session_state[WATCH_KEY] = LiveWatch()
watch: LiveWatch = st.session_state[WATCH_KEY]
watch.configure(sources, limits)
live = LiveInputs(values, sources, watch)


def draw_metrics(result: PollResult) -> None:
    for label, error in result.errors.items():
        st.warning(f"{label}: {error}")
    frame = watch.history.frame()
    if frame.empty:
        if sources.urls:
            st.info(
                "No server has answered yet: start a lab server below, or enter your vLLM's /metrics URL."
            )
        return
    several = len(watch.history.sources()) > 1
    latest = watch.history.latest(FLEET)
    m = st.columns(6)
    usage = latest.kv_cache_usage
    m[0].metric("KV cache usage", "–" if usage is None else f"{100 * usage:.1f}%")
    m[1].metric("Running / waiting", f"{_n(latest.num_requests_running)} / {_n(latest.num_requests_waiting)}")
    m[2].metric("Preemptions", _n(latest.num_preemptions))
    rate = latest.prefix_cache_hit_rate
    m[3].metric("Prefix-cache hit rate (overall)", "–" if rate is None else f"{100 * rate:.1f}%")
    window = frame[frame.source == (FLEET if several else frame.source.iloc[0])].window_hit_rate.dropna()
    m[4].metric("Hit rate (last window)", "–" if window.empty else f"{100 * window.iloc[-1]:.1f}%")
    blocks = "–" if latest.num_gpu_blocks is None else f"{latest.num_gpu_blocks:,}"
    m[5].metric("KV blocks (num_gpu_blocks)", blocks, help=f"block size {latest.block_size or '?'} tokens")
    if latest.legacy_names:
        st.caption(
            "Some figures were read from pre-0.9 metric names (gpu_cache_usage_perc, gpu_prefix_cache_*)."
        )
    colors = source_colors([*watch.history.sources(), FLEET])
    left, right = st.columns(2)
    left.plotly_chart(usage_figure(frame, colors), width="stretch")
    right.plotly_chart(requests_figure(frame, colors), width="stretch")
    left.plotly_chart(hit_rate_figure(frame, colors), width="stretch")
    right.plotly_chart(preemptions_figure(frame, colors), width="stretch")
    back = max(1, round(LATENCY_WINDOW_S / values["every"]))
    source = FLEET if several else watch.history.sources()[0]
    histograms = {
        "TTFT overall": latest.ttft,
        f"TTFT last {LATENCY_WINDOW_S:.0f} s": watch.history.latency_window(source, "ttft", back),
        "ITL overall": latest.itl,
        f"ITL last {LATENCY_WINDOW_S:.0f} s": watch.history.latency_window(source, "itl", back),
        "E2E overall": latest.e2e,
    }
    if any(h is not None and h.count > 0 for h in histograms.values()):
        st.plotly_chart(latency_figure(histograms), width="stretch")
        st.caption(
            "Percentiles are Prometheus's histogram_quantile estimates: linear within the bucket that holds them, "
            "so they are only as fine as vLLM's buckets. TTFT = time to first token; ITL = inter-token latency."
        )


def _n(value) -> str:
    return "–" if value is None else f"{value:,.0f}"


@st.fragment(run_every=values["every"] if values["watch"] else None)
def live_view() -> None:
    result = watch.poll(timeout_s=min(3.0, values["every"]))
    draw_metrics(result)
    draw_events(live, result)
    if sources.events is not None:
        draw_lookup(live)
    if not draw_served_plan(live):
        draw_plan(live)
    draw_planned_vs_observed(live)


with view:
    if not sources.urls and sources.events is None:
        st.info("Enter a metrics URL (e.g. http://127.0.0.1:8000/metrics) in the settings below.")
    else:
        live_view()
