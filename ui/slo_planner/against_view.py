"""The SLO planner's predict mode, once the user ran the `vllm bench serve` command it printed: their run's saved
result (`--save-result`) uploaded, and each predicted figure beside the run's with its error. Streamlit rendering
only: the rows are `core.page_models.slo_predict.against_rows`, what `predict --against` prints."""

import streamlit as st

from core.errors import LabError
from core.page_models.slo_predict import against_rows
from core.planning.predict.bench_report import bench_result_from
from core.planning.predict.load import Load
from core.uploads import read_upload
from ui.jobs import app_limits

UPLOAD_KEY = "against_upload"
ROW_PX = 35  # a dataframe row's height in Streamlit's grid


def show_against_run(prediction: dict, load: Load) -> None:
    """An upload of the run's result JSON under the bench command; a bad file or a run of another load is an
    st.error that names why, and changes nothing else on the page."""
    upload = st.file_uploader(
        "Ran it? Upload the result `vllm bench serve --save-result` wrote, to see each figure beside the prediction",
        type=["json"],
        key=UPLOAD_KEY,
    )
    if upload is None:
        return
    try:
        result = bench_result_from(
            read_upload(upload, "the uploaded result", app_limits()), "the uploaded result"
        )
        rows = against_rows(prediction, load, result)
    except LabError as error:
        st.error(f"Upload not used: {error}")
        return
    shown = [row | {"error": None if row["error"] is None else 100.0 * row["error"]} for row in rows]
    percent = st.column_config.NumberColumn("error (%)", format="%+.1f", help="predicted / measured - 1")
    numbers = {k: st.column_config.NumberColumn(format="%.2f") for k in ("predicted", "measured")}
    height = ROW_PX * (len(shown) + 1) + 3  # every row in view, no inner scroll
    st.dataframe(
        shown, width="stretch", height=height, hide_index=True, column_config=numbers | {"error": percent}
    )
    st.caption(
        "The run's percentiles include its ramp-up and drain, which the steady state has not; the command's prompt "
        "count keeps them about a tenth of the run. Times in ms, throughputs per second, as vLLM prints them."
    )
