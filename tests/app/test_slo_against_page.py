"""The SLO planner's predict mode, compared with the user's run: the `vllm bench serve --save-result` JSON uploaded
under the bench command puts each predicted figure beside the run's with its error, as `predict --against` prints
them (`core.page_models.slo_predict.against_rows`); a bad file or a run of another load is st.error naming why,
the prediction unchanged. The reference prediction is `predict`'s, called here apart from the page."""

import json

import pytest

from core.planning.predict.bench_report import bench_values
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from tests.app.test_slo_predict_page import NO_TARGETS, TINY, open_page

LOAD = Load(None, 16, 1, concurrency=2)  # TINY's load: 2 clients, 16 prompt tokens, one output token


def _upload(at, data: bytes):
    at.file_uploader(key="against_upload").set_value(("run.json", data, "application/json")).run()
    assert not at.exception, at.exception
    return at


def test_an_uploaded_run_sits_beside_the_prediction_and_a_wrong_one_is_refused():
    at = open_page(TINY | NO_TARGETS)
    ref = predict(Deployment("qwen2.5-7b", "l40s", max_num_seqs=1), LOAD).to_dict()
    before = at.dataframe[0].value.copy()
    run = bench_values(ref, LOAD) | {"completed": 100, "total_input_tokens": 1600, "total_output_tokens": 100}
    run |= {"request_rate": "inf", "max_concurrency": 2, "burstiness": 1.0}
    run["mean_ttft_ms"] *= 1.25  # the run's mean TTFT 1.25x the prediction: an error of -20 %
    _upload(at, json.dumps(run).encode())
    assert not at.error
    table = at.dataframe[-1].value.set_index("figure")
    # one output token: no TPOT or ITL; the throughputs and TTFT / E2EL's mean, median, p50 / p90 / p95 / p99
    assert len(table) == 3 + 2 * 6 and list(table.columns) == ["predicted", "measured", "error"]
    mean_ttft = table.loc["Mean TTFT (ms):"]
    assert mean_ttft["predicted"] == pytest.approx(ref["mean_ttft_s"] * 1000, rel=1e-9)
    assert mean_ttft["measured"] == pytest.approx(ref["mean_ttft_s"] * 1250, rel=1e-9)
    assert mean_ttft["error"] == pytest.approx(100 * (1 / 1.25 - 1), rel=1e-9)  # shown in percent: -20.0
    assert table.loc["Request throughput (req/s):", "predicted"] == pytest.approx(
        ref["request_throughput_per_s"]
    )
    assert (
        table.drop(index="Mean TTFT (ms):")["error"].abs() < 1e-9
    ).all()  # the page's worker and this process
    for data, reason in (
        (json.dumps(run | {"max_concurrency": 8}).encode(), "the uploaded result is of another load"),
        (json.dumps(run | {"completed": 0}).encode(), "is not a run's result: completed 0"),
        (b"\x1f\x8b\x08\x00", "gzip compressed archive"),
    ):
        _upload(at, data)
        [error] = at.error
        assert error.value.startswith("Upload not used: ") and reason in error.value, reason
        assert at.dataframe[0].value.equals(before) and len(at.dataframe) == 1  # the prediction as it was
