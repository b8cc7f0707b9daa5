"""The Live page's "start a lab server": core.serve, or a real vLLM when its CPU build is installed, on loopback
with a mixed chat load, and the page's inputs pointed at it."""

import streamlit as st

from core.errors import LabError
from core.limits import Limits
from core.serve import launcher
from core.serve.launcher import VLLM_CHOICE, LabServer, VLLMLabServer, vllm_available
from ui.url_widgets import UrlState

LAB_MODEL_LABELS = {
    "smollm2-135m-instruct": "SmolLM2-135M-Instruct (real)",
    "tiny": "tiny random Llama",
    VLLM_CHOICE: "SmolLM2 on a real vLLM",
}


@st.cache_resource(show_spinner=False)
def lab_servers() -> dict:
    """The one lab-started server of this app process (shared by every session: one model's CPU cost)."""
    return {}


def lab_server_controls(state: UrlState, limits: Limits) -> None:
    """Start or stop a lab server on loopback with a mixed chat load, and point the inputs at it."""
    try:
        limits.check_live_address("127.0.0.1", launcher.DEFAULT_PORTS[0], "the lab server")
    except LabError:
        return  # the operator restricted hosts: no lab-started server on this host
    holder = lab_servers()
    server: LabServer | None = holder.get("server")
    running = server is not None and server.running
    c1, c2, c3 = st.columns([2, 1, 3])
    with c1:
        model = state.widget(
            st.radio,
            "Lab server model",
            "lab_model",
            horizontal=True,
            disabled=running,
            format_func=LAB_MODEL_LABELS.get,
        )
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
        # vLLM connects its PUB socket to a host-named endpoint, so the page's subscriber binds there;
        # core.serve is started with wildcard endpoints, which it binds, so the page connects.
        state.set("events_bind", isinstance(server, VLLMLabServer))
        st.rerun()  # this run drew the start button: the next one draws the stop button and the status
    elif running and c2.button("Stop the lab server", key="lab_stop"):
        server.stop()
        st.rerun()
    if running:
        # refreshed as the page polls (the rest of the page does not rerun): the load's count goes on
        every = state.values["every"] if state.values["watch"] else None
        with c3:
            st.fragment(lab_server_status, run_every=every)(server)
    else:
        c3.caption(
            "One click starts our engine served like vLLM (core.serve) on this machine's loopback with prefix "
            "caching and KV events, plus a small mixed chat load, and points this page at it; or, with "
            "vLLM's CPU build installed, a real vLLM serving SmolLM2 the same way."
        )


def lab_server_status(server: LabServer) -> None:
    """Where the lab server runs and what its load has sent so far."""
    if not server.running:
        st.caption(f"{lab_server_kind(server)} ({server.model}) has stopped.")
        return
    load = server.load
    st.caption(
        f"{lab_server_kind(server)} ({server.model}) runs on 127.0.0.1:{server.ports[0]}, events on "
        f"{server.events_endpoint}; "
        f"a mixed chat load has sent {load.sent if load else 0:,} requests ({load.failed if load else 0:,} failed)."
    )


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
