"""ui.jobs.run_job under AppTest: a job's result reaches the page, a cached rerun, a job's error as st.error,
the cancelled state and "Run again"."""

from streamlit.testing.v1 import AppTest

from core.jobs import job_key
from tests.hosting import job_functions as jf
from ui.jobs import CANCELLED_KEY

SCRIPT = """
import streamlit as st
from core.errors import LabError
from tests.hosting import job_functions as jf
from ui.jobs import run_job

kind = st.selectbox("kind", ["sleep", "budget"], key="kind")
steps = int(st.number_input("steps", 1, 100, 3, key="steps"))
try:
    if kind == "sleep":
        value, count, pid = run_job(jf.sleep_steps, steps, 0.05, "v", label="Sleeping")
        st.markdown(f"result {value} {count} from {pid}")
    else:
        run_job(jf.raise_budget, 10**12, label="Allocating")
except LabError as error:
    st.error(f"Cannot run: {error}")
"""


def _app():
    at = AppTest.from_string(SCRIPT, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    return at


def test_result_reaches_the_page_and_a_rerun_is_cached():
    import os

    at = _app()
    text = at.markdown[0].value
    assert text.startswith("result v 3 from ") and int(text.split()[-1]) != os.getpid()
    at.run()
    assert at.markdown[0].value == text  # same worker pid: the cached value, not a rerun
    at.number_input(key="steps").set_value(4).run()
    assert at.markdown[0].value.startswith("result v 4 ")


def test_job_error_is_shown_with_st_error():
    at = _app()
    at.selectbox(key="kind").set_value("budget").run()
    assert not at.exception
    assert at.error[0].value == "Cannot run: needs 1,000,000,000,000 bytes"


def test_cancelled_inputs_wait_for_run_again():
    at = AppTest.from_string(SCRIPT, default_timeout=60)
    at.session_state[CANCELLED_KEY] = job_key(jf.sleep_steps, (5, 0.05, "v"))
    at.number_input  # noqa: B018
    at.run()
    at.number_input(key="steps").set_value(5).run()
    assert not at.exception and not at.markdown
    assert "cancelled" in at.info[0].value
    next(b for b in at.button if b.label == "Run again").click().run()
    assert at.markdown[0].value.startswith("result v 5 ")
