"""Live: a running vLLM (or core.serve) server's KV cache, read from its Prometheus metrics and KV cache events."""

import json
import time

import pandas as pd
import streamlit as st

from core.errors import LabError
from core.live.fleet_prefixes import fleet_prefixes
from core.live.history import FLEET
from core.live.poller import source_label
from core.live.prompt_lookup import PrefixLabels, detokenize
from core.live.served_model import fetch_served_models
from core.live.watch import LiveWatch, PollResult
from core.page_models.live_lookup import LookupRequest, answer_lookup
from core.page_models.live_planned import PlanCache, ServedConfig, live_plan, served_config
from core.page_models.planner_config import config_from_text, decode_config, encode_config, model_from_config
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS, ModelSpec
from core.planning.cost.cpu_roofline import measure_roofs
from core.planning.memory.plan import PlanInputs
from core.planning.observed.compare import compare_kv_space_with_server, compare_with_server, kv_space_bytes
from core.serve import launcher
from core.serve.launcher import VLLM_CHOICE, LabServer, VLLMLabServer, vllm_available
from ui.jobs import app_limits
from ui.live_figures import (
    comparison_figure,
    hit_rate_figure,
    latency_figure,
    planned_observed_figure,
    preemptions_figure,
    requests_figure,
    source_colors,
    tree_figure,
    usage_figure,
)
from ui.live_url import FIELDS, NO_MODEL, resolve_sources
from ui.query_state import encode_params
from ui.url_widgets import UrlState

WATCH_KEY = "_live_watch"
PLAN_KEY = "_live_plan_cache"
LABELS_KEY = "_live_prefix_labels"
LAB_MODEL_LABELS = {
    "smollm2-135m-instruct": "SmolLM2-135M-Instruct (real)",
    "tiny": "tiny random Llama",
    VLLM_CHOICE: "SmolLM2 on a real vLLM",
}
LATENCY_WINDOW_S = 30.0
TREE_NOTE = (
    "**What the tree shows:** the blocks the server announced as cached (BlockStored) and not yet evicted "
    "(BlockRemoved), chained by parent hash, per KV cache group and medium: which prefixes are cached and how "
    "they branch. **What it cannot show:** which request holds which slot, ref counts, physical block ids, free "
    "or in-use blocks, or prefix-cache hits: events carry none of these (a hit is not announced again). Usage "
    "comes from the metrics above. Blocks cached before the page subscribed appear only if the server's replay "
    "buffer still holds them."
)

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


@st.cache_resource(show_spinner=False)
def lab_servers() -> dict:
    """The one lab-started server of this app process (shared by every session: one model's CPU cost)."""
    return {}


def lab_server_controls() -> None:
    """Start or stop a core.serve on loopback with a mixed chat load, and point the inputs at it."""
    try:
        limits.check_live_address("127.0.0.1", launcher.DEFAULT_PORTS[0], "the lab server")
    except LabError:
        return  # the operator restricted hosts: no lab-started server on this host
    holder = lab_servers()
    server: LabServer | None = holder.get("server")
    running = server is not None and server.running
    c1, c2, c3 = st.columns([2, 1, 3])
    with c1:
        model = state.widget(st.radio, "Lab server model", "lab_model", horizontal=True, disabled=running,
                             format_func=LAB_MODEL_LABELS.get)  # fmt: skip
    if not running and c2.button("Start a lab server", type="primary", key="lab_start"):
        server = lab_server_for(model)
        if server is None:
            return
        with st.spinner(
            f"Starting {lab_server_kind(server)} with {LAB_MODEL_LABELS[model]} on "
            f"127.0.0.1:{launcher.DEFAULT_PORTS[0]}..."
        ):
            try:
                server.start()
            except LabError as err:
                st.error(f"The lab server did not start: {err}")
                return
        server.start_load()
        holder["server"] = server
        state.set("metrics", server.metrics_url)
        state.set("events", server.events_endpoint)
        state.set("replay", server.replay_endpoint)
        point_at_vllm(server)
        running = True
    elif running and c2.button("Stop the lab server", key="lab_stop"):
        server.stop()
        running = False
    if running:
        load = server.load
        c3.caption(
            f"{lab_server_kind(server)} ({server.model}) runs on 127.0.0.1:{server.ports[0]}, events on "
            f"{server.events_endpoint}; "
            f"a mixed chat load has sent {load.sent if load else 0:,} requests ({load.failed if load else 0:,} failed)."
        )
    else:
        c3.caption(
            "One click starts our engine served like vLLM (core.serve) on this machine's loopback with prefix "
            "caching and KV events, plus a small mixed chat load, and points this page at it; or, with "
            "vLLM's CPU build installed, a real vLLM serving SmolLM2 the same way."
        )


# --- A real vLLM as the lab server (issue 36: one click, a real vLLM) ------------------------------------------
def lab_server_kind(server: LabServer) -> str:
    return "vLLM" if isinstance(server, VLLMLabServer) else "core.serve"


def lab_server_for(model: str) -> LabServer | None:
    """The lab server of the chosen model: core.serve, or a real vLLM when one is installed (else None, said)."""
    if model != VLLM_CHOICE:
        return LabServer(model)
    why = vllm_available()
    if why is not None:
        st.error(f"A real vLLM cannot start here: {why}")
        return None
    return VLLMLabServer()


def point_at_vllm(server: LabServer) -> None:
    """vLLM connects its PUB socket to a host-named endpoint, so the page's subscriber binds there; core.serve
    is started with wildcard endpoints, which it binds, so the page connects."""
    state.set("events_bind", isinstance(server, VLLMLabServer))


lab_server_controls()


# --- The served model's config (issue 36: any model, any device) ----------------------------------------------
SERVED_KEY = "_live_served_models"
CONFIG_TEXT_KEY = "_live_config_text"
SERVED_TTL_S = 60.0  # /v1/models is asked again at most once a minute per server


def served_config_input() -> None:
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


def served_model_config(source: str) -> ServedConfig | None:
    """The config to plan `source` with: the pasted one, else the one in the folder the server's /v1/models
    names when it runs on this machine (asked at most once a minute); None when neither."""
    given = None
    if values["pvo_config"]:
        try:
            given = decode_config(values["pvo_config"])
        except LabError:
            given = None  # reported by served_config_input
    urls = list(sources.urls)
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
        latest = watch.history.latest(source)
        names = latest.model_names if latest is not None else ()
        hit = (time.monotonic(), next((m for m in models if m.name in names), models[0] if models else None))
        cache[url.url] = hit
    return served_config(url.host, hit[1], given)


def draw_served_plan() -> bool:
    """The capacity planner's blocks beside the server's for a server that names its KV space (vLLM's CPU build,
    or --kv-cache-memory-bytes) and whose model's config is known; False when there is none to draw."""
    sources_seen = watch.history.sources()
    first = watch.history.latest(sources_seen[0]) if sources_seen else None
    if first is None or kv_space_bytes(first) is None:
        return False
    config = served_model_config(sources_seen[0])
    if config is None:
        return False
    st.subheader("Predicted against observed")
    try:
        model = ModelSpec.from_hf_config(config.config, name=(first.model_names or ("the served model",))[0])
        comparison = compare_kv_space_with_server(model, first, int(values["context"]), config.max_model_len)
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
        state.widget(st.number_input, "Draw the tree of rank", "tree_rank")
        state.widget(st.number_input, "Planned vs observed: window (s)", "pvo_window")
        state.widget(st.number_input, "max_num_seqs (0: the server's default)", "pvo_seqs")
        state.widget(st.number_input, "max_num_batched_tokens (0: the server's default)", "pvo_tokens")
    served_config_input()

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
            st.text_input, "The server's NONE_HASH seed", "hash_seed",
            help="vllm-none-hash unless the server runs with PYTHONHASHSEED set (then that value)",
        )  # fmt: skip
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


def draw_events(result: PollResult) -> None:
    if sources.events is None:
        st.caption(
            "Give a KV events endpoint (a server started with --kv-events-config) to see cached blocks."
        )
        return
    st.subheader("Cached blocks (KV cache events)")
    if result.events_error:
        st.warning(f"KV events: {result.events_error}")
    rows = []
    for rank, sub in enumerate(watch.subscribers):
        s = sub.stats
        rows.append(
            {
                "rank": rank,
                "endpoint": sub.endpoint.address + (" (bound here)" if sub.bind else ""),
                "cached blocks": sub.tree.num_blocks(),
                "pools (group · medium)": ", ".join(
                    f"{g} · {m}: {n:,}" for (g, m), n in sub.tree.counts().items()
                ),
                "batches": s.applied,
                "last seq": s.last_seq,
                "gaps": len(s.gaps),
                "replayed": s.replayed,
                "lost": s.lost,
                "restarts": s.restarts,
                "bad messages": s.bad_messages,
            }
        )
    if watch.pub_silent:
        if sources.bind:
            st.warning(
                "The replay endpoint answers with new batches but nothing arrives on the bound events socket: is "
                f"the server's KV events endpoint {sources.events.address} (its PUB socket connects there)?"
            )
        else:
            st.warning(
                "The PUB socket is silent while the replay answers with new batches: the server publishes, but "
                "not to this page. A vLLM whose events endpoint names a host (not tcp://*:PORT) connects its "
                "PUB socket instead of binding it: turn on **Bind the events socket here** (or start vLLM with "
                "a wildcard endpoint). Meanwhile the tree is kept from the replay."
            )
    if rows and all(sub.stats.received == 0 and sub.stats.replayed == 0 for sub in watch.subscribers):
        st.caption(
            f"No batch has arrived yet on topic {sources.topic!r}. An idle server sends none; vLLM's default topic "
            "is empty (clear the Topic field to receive every topic); a replay endpoint fills in the history."
        )
    if rows:
        table = pd.DataFrame(rows)
        st.dataframe(table, hide_index=True, width="stretch")
        if len(rows) > 1:
            st.caption(f"Fleet: {int(table['cached blocks'].sum()):,} cached blocks over {len(rows)} ranks.")
            draw_fleet_prefixes()
        errors = [
            f"rank {r}: {sub.stats.last_error}"
            for r, sub in enumerate(watch.subscribers)
            if sub.stats.last_error
        ]
        if errors:
            st.caption("Last stream problem: " + "; ".join(errors))
        rank = values["tree_rank"]
        if rank < len(watch.subscribers):
            tree = watch.subscribers[rank].tree
            if tree.num_blocks():
                texts = prefix_texts(tree)
                fig, drawn = tree_figure(tree, texts=texts)
                st.plotly_chart(fig, width="stretch")
                if drawn < tree.num_blocks():
                    st.caption(
                        f"{drawn:,} of {tree.num_blocks():,} blocks drawn (the shallowest, largest first)."
                    )
            else:
                st.info(f"Rank {rank} has announced no cached block yet.")
    st.markdown(TREE_NOTE)


def prefix_texts(tree) -> dict:
    """The server's text of the drawn blocks' tokens (its /detokenize), fetched a few per poll, shallowest first."""
    if not sources.urls:
        return {}
    server = sources.urls[0]
    held = st.session_state.get(LABELS_KEY)
    if (
        held is None or held[0] != server.url
    ):  # a hash fixes the tokens; the text is this server's tokenizer's
        held = st.session_state[LABELS_KEY] = (server.url, PrefixLabels())
    labels: PrefixLabels = held[1]
    order = sorted(
        (p for pool in tree.pools() for p in tree.walk(pool)), key=lambda p: (p.depth, -p.blocks_below)
    )
    labels.fetch([p.block for p in order], lambda ids: detokenize(server, ids))
    if labels.error and not labels.texts:
        st.caption(
            f"The prefixes are labelled by hash: the server's /detokenize did not answer ({labels.error})."
        )
    return labels.texts


def draw_lookup() -> None:
    """Where is my prompt cached: per server and medium, the prompt's leading blocks cached."""
    st.subheader("Where is my prompt cached")
    if not values["lookup"].strip():
        st.caption(
            "Type a prompt sent to the server before (in the box above) to see where its prefix is cached."
        )
        return
    request = LookupRequest(values["lookup"], values["lookup_as"], values["hash_algo"], values["hash_seed"],
                            values["cache_salt"])  # fmt: skip
    trees = {f"rank {r}": sub.tree for r, sub in enumerate(watch.subscribers)}
    answer = answer_lookup(request, trees, sources.urls[0] if sources.urls else None)
    if answer.error:
        st.error(f"The prompt cannot be looked up: {answer.error}")
        return
    st.markdown(f"**{answer.sentence}**")
    if answer.rows:
        st.dataframe(pd.DataFrame(answer.rows), hide_index=True, width="stretch")
    st.caption(f"The prompt has {len(answer.token_ids):,} tokens; a partial last block is never cached.")


def draw_fleet_prefixes() -> None:
    """Which prefixes each replica (rank) holds and how many blocks several hold at once (group 0, GPU)."""
    fleet = fleet_prefixes({f"rank {r}": sub.tree for r, sub in enumerate(watch.subscribers)})
    st.dataframe(
        pd.DataFrame(
            [
                {"replica": r.name, "cached blocks": r.blocks, "prefixes (first blocks)": r.prefixes,
                 "also cached elsewhere": r.shared, "chain unknown": r.orphans}
                for r in fleet.replicas
            ]
        ),
        hide_index=True,
        width="stretch",
    )  # fmt: skip
    st.caption(
        f"{fleet.duplicated_blocks:,} of {fleet.distinct_blocks:,} distinct cached blocks are held by several "
        f"replicas at once ({fleet.extra_copies:,} blocks of memory spent twice or more), matched by their tokens. "
        "Round-robin routing spreads every prefix over every replica; prefix-aware routing keeps each on one."
    )


def draw_plan() -> None:
    if values["model"] == NO_MODEL:
        st.caption(
            "Name a model and GPU in the settings below to set the capacity planner's blocks beside the server's."
        )
        return
    first = next((watch.history.latest(s) for s in watch.history.sources() if watch.history.latest(s)), None)
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


def draw_planned_vs_observed() -> None:
    sources_seen = watch.history.sources()
    if not sources_seen:
        return
    source = sources_seen[0]  # the first server: a fit is one server's
    cache = st.session_state.setdefault(PLAN_KEY, PlanCache())
    key = (
        source,
        *(values[k] for k in ("pvo_window", "pvo_seqs", "pvo_tokens", "model", "gpu", "tp", "pvo_config")),
    )
    now = watch.history.polls[-1].t
    config = served_model_config(source)
    plan = cache.get(key, now, lambda: live_plan(watch.history, source, values, cpu_roofs, config))
    st.subheader("Planned vs observed latency")
    if plan.result is None:
        (st.error if plan.problem else st.caption)(plan.reason)
        return
    colors = source_colors([*sources_seen, FLEET])
    st.plotly_chart(planned_observed_figure(plan.result, colors[source], source), width="stretch")
    fit = plan.result.fit
    if not fit.converged:
        st.warning(f"The fit did not converge (held at a bound: {', '.join(fit.at_bound) or 'none'}): this model "
                   "and hardware cannot reproduce the window's means; check the model, GPU and limits.")  # fmt: skip
    st.caption(
        f"Planned with {plan.planned_with}: the step-time model's overhead ({1000 * fit.model.overhead_s:,.1f} ms "
        f"per step) and FLOP/s ({100 * fit.flops_vs_roof:.0f}% of the roof) fitted so that the simulator "
        "reproduces this window's mean prefill time and mean inter-token latency (the histograms' exact sums); "
        "the percentiles are then predicted, and both sides are read through vLLM's buckets. Redone every "
        "minute. Method and measured errors: docs/live-planned.md."
    )


def _n(value) -> str:
    return "–" if value is None else f"{value:,.0f}"


@st.fragment(run_every=values["every"] if values["watch"] else None)
def live_view() -> None:
    result = watch.poll(timeout_s=min(3.0, values["every"]))
    draw_metrics(result)
    draw_events(result)
    if sources.events is not None:
        draw_lookup()
    draw_served_plan() or draw_plan()
    draw_planned_vs_observed()


with view:
    if not sources.urls and sources.events is None:
        st.info("Enter a metrics URL (e.g. http://127.0.0.1:8000/metrics) in the settings below.")
    else:
        live_view()
