"""Run a page's heavy computation in the worker pool for this browser session, showing queue place and progress.

The pool and the operator limits are process-wide resources (`st.cache_resource`): the pool holds only
per-session slots keyed by a random id kept in `st.session_state` and immutable finished results.
"""

import atexit
import os
import time
import uuid
from collections.abc import Callable, Mapping

import streamlit as st

from core.jobs import JobPool, job_key
from core.jobs.remote import remote_pool_from_env
from core.jobs.worker import PRELOAD
from core.limits import Limits

SESSION_KEY = "_job_session"
CANCELLED_KEY = "_job_cancelled"
POLL_S = 0.25


def _root_secrets() -> dict[str, object]:
    """Root-level `PAGED_LAB_*` entries of `st.secrets` ({} when the app has no secrets file)."""
    try:
        return {
            key: value
            for key, value in st.secrets.items()
            if key.startswith("PAGED_LAB_") and not isinstance(value, Mapping)
        }
    except Exception:  # no secrets.toml: Streamlit raises its own not-found error
        return {}


@st.cache_resource(show_spinner=False)
def app_limits() -> Limits:
    """The operator limits of this server: environment variables, overridden by root-level secrets of the same
    names. Raises LimitConfigError (shown by the caller) for a bad value."""
    return Limits.from_mapping({**os.environ, **_root_secrets()})


@st.cache_resource(show_spinner=False)
def job_pool() -> JobPool:
    """The server's worker pool: the team host's shared one when this server is one of its replicas (see
    hosting/), else its own, sized by `app_limits()`; closed (or disconnected) when the server exits."""
    pool = remote_pool_from_env(app_limits()) or JobPool.from_limits(app_limits(), preload=PRELOAD)
    atexit.register(pool.close)
    return pool


def session_id() -> str:
    """A random id for this browser session, kept in its own `st.session_state`."""
    if SESSION_KEY not in st.session_state:
        st.session_state[SESSION_KEY] = uuid.uuid4().hex
    return st.session_state[SESSION_KEY]


def _progress_text(label: str, status) -> str:
    """The line under the progress bar: queue place, jobs ahead, and the expected wait when the pool knows it."""
    estimate = "" if status.estimate_s is None else f", about {_seconds(status.estimate_s)} to go"
    if status.state == "queued":
        ahead = status.position - 1 + status.running
        return (
            f"{label}: waiting for a worker, place {status.position:,} of {status.queued:,} in the queue "
            f"({ahead:,} job{'s' if ahead != 1 else ''} ahead of it, {status.running:,} running{estimate})"
        )
    message = f": {status.message}" if status.message else ""
    return f"{label}{message} ({status.fraction:.0%}{estimate})"


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def run_job(fn: Callable, *args, label: str = "Computing"):
    """`fn(*args, progress=...)` computed in the worker pool for this session; returns its (shared, read-only)
    result. Blocks this session's script, not the server: a queue place or a progress bar and a Cancel button
    are shown while it waits. A cached result returns at once with nothing drawn.

    Raises the job's LabError (MemoryBudgetError text, QueueFullError, JobTimeoutError, ...) for the page to
    show with `st.error`. After Cancel, shows why nothing is drawn and stops the script (`st.stop`) until the
    user asks again.
    """
    pool = job_pool()
    session = session_id()
    key = job_key(fn, args)
    controls = st.empty()
    if st.session_state.get(CANCELLED_KEY) == key:
        with controls.container():
            st.info(f"{label}: cancelled. Change a setting or run it again.")
            again = st.button("Run again", key=f"_job_run_again:{label}")
        if not again:
            st.stop()
        del st.session_state[CANCELLED_KEY]
        controls.empty()
    status = pool.submit(session, fn, *args)
    if status.finished:
        return _outcome(status)
    with controls.container():
        bar = st.progress(0.0, text=_progress_text(label, status))
        if st.button("Cancel", key=f"_job_cancel:{label}"):
            pool.cancel(session)
            st.session_state[CANCELLED_KEY] = key
            st.rerun()
    while not status.finished:
        bar.progress(status.fraction, text=_progress_text(label, status))
        time.sleep(POLL_S)
        status = pool.poll(session)
        if status.state == "idle":  # the pool lost the job (the team host restarted its pool): ask again
            status = pool.submit(session, fn, *args)
    controls.empty()
    return _outcome(status)


def _outcome(status):
    if status.state == "failed":
        raise status.error
    return status.result
