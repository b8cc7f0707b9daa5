"""About: what this server runs (version, device, torch, Streamlit) and the operator limits that protect it."""

import platform
import tomllib
from pathlib import Path

import pandas as pd
import streamlit as st
import torch

from core.device import default_device, device_label
from core.errors import LabError
from ui.jobs import app_limits, job_pool

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@st.cache_resource(show_spinner=False)
def _app_version() -> str:
    try:
        return tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


st.title("About this server")
st.markdown(
    "PagedAttention Lab runs its heavy work (simulations, kernel sweeps and checks) in a small pool of worker "
    "processes so one person's job never freezes another's screen. The operator limits below bound what one job "
    "may take, where the Engine page may load models from and which hosts the Live page may read metrics and KV events from (a server that fetches user-given URLs is a door into its own network); the host sets them with environment variables or Streamlit secrets of the same names."
)

versions = {
    "PagedAttention Lab": _app_version(),
    "Torch device": device_label(default_device()),
    "torch": torch.__version__,
    "Streamlit": st.__version__,
    "Python": platform.python_version(),
}
cols = [*st.columns(3), *st.columns(3)]  # three a row: "cpu (2 threads)" was cut off in a fifth of the width
for col, (name, value) in zip(cols, versions.items(), strict=False):
    col.metric(name, value)

st.subheader("Operator limits")
try:
    limits = app_limits()
except LabError as error:
    st.error(f"The operator limits are misconfigured, so heavy pages refuse to run: {error}")
    st.stop()
st.dataframe(pd.DataFrame(limits.rows()), hide_index=True, width="stretch")

st.subheader("Worker pool")
stats = job_pool().stats()
st.caption(
    f"{stats['workers']:,} of {limits.workers:,} worker processes alive ({stats['ready']:,} ready), "
    f"{stats['running']:,} jobs running, {stats['queued']:,} waiting, {stats['cached']:,} results cached, "
    f"{stats['restarts']:,} workers replaced since the server started."
)
