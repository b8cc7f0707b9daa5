"""The SLO planner's "predict my deployment" mode under AppTest: every value it shows is what `predict` (called here,
apart from the page) and the command line (`python -m core.planning predict` / `max-rate`, run on the very
flags the page prints) give for the same inputs; the URL holds every input; bad input is st.error naming it.

Tiny loads (16-token prompts, one output token, one sequence at a time) keep each prediction well under a second.
"""

import json
import math
import shlex

import pytest
from streamlit.testing.v1 import AppTest

from core.planning.load import Load
from core.planning.predict import Deployment, predict
from core.planning.predict_cli import max_rate_main, predict_main
from core.serving.latency import PERCENTILES
from core.serving.steady_state import STEADY_METRICS
from tests.conftest import ROOT

PAGE = "app_pages/slo_planner.py"
TINY = {"mode": "predict", "model": "qwen2.5-7b", "rate": "12", "prompt_len": "16", "output_len": "1",
        "spread": "0", "ttft": "auto", "tpot_ms": "auto", "gpu": "l40s", "tp": "1", "pp": "1", "replicas": "1",
        "seqs": "1", "kv_dtype": "auto", "weight_dtype": "auto", "engine": "vllm", "load": "concurrency",
        "clients": "2", "seed": "0", "itl_ms": "auto", "e2e": "0.5", "ttft_q": "95", "tpot_q": "95",
        "itl_q": "99", "e2e_q": "50"}  # fmt: skip


def open_page(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def query(at: AppTest) -> dict[str, str]:
    return {k: v[-1] if isinstance(v, list) else v for k, v in at.query_params.items()}


def cli_json(main, command: str, capsys) -> dict:
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "core.planning"]
    capsys.readouterr()
    assert main(words[4:]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_page_shows_what_predict_and_the_cli_give(capsys):
    at = open_page(TINY)
    assert not at.error and query(at) == TINY  # every input in the URL, as given
    reference = predict(Deployment("qwen2.5-7b", "l40s", max_num_seqs=1), Load(None, 16, 1, concurrency=2))
    ref = reference.to_dict()
    [table] = at.dataframe
    rows = table.value.set_index(["metric", "percentile"])
    assert len(rows) == len(STEADY_METRICS) * len(PERCENTILES)
    for metric in STEADY_METRICS:
        for q in PERCENTILES:
            key, row = f"{metric}_p{q}_s", rows.loc[(metric, f"p{q}")]
            if ref[key] is None or not math.isfinite(ref[key]):  # one output token: no TPOT, no ITL gap
                assert math.isnan(row["predicted (ms)"]), key
                continue
            assert row["predicted (ms)"] == pytest.approx(ref[key] * 1e3, rel=1e-12), key
            low, high = reference.intervals[key]
            assert (row["95% interval low (ms)"], row["95% interval high (ms)"]) == pytest.approx(
                (low * 1e3, high * 1e3), rel=1e-12
            )
    e2e = rows.loc[("e2e", "p50")]
    assert e2e["target (ms)"] == 500.0 and e2e["meets target"] == (ref["e2e_p50_s"] <= 0.5)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Output throughput"] == f"{ref['throughput_tokens_per_s']:,.0f} tok/s"
    assert shown["KV-limited"] == ("yes" if ref["kv_limited"] else "no")
    assert shown["Converged"] == ("yes" if ref["converged"] else "no")
    # the commands the page prints give the page's numbers: its predict line reproduces the table, its max-rate
    # line the highest rate shown
    cli, serve, bench = (c.value for c in at.code)
    predict_line, max_rate_line = cli.splitlines()
    printed = cli_json(predict_main, predict_line, capsys)
    for key in (f"{m}_p{q}_s" for m in STEADY_METRICS for q in PERCENTILES):
        assert (
            printed[key] == pytest.approx(ref[key], rel=1e-12)
            if ref[key] is not None
            else printed[key] is None
        )
    highest = cli_json(max_rate_main, max_rate_line, capsys)
    assert highest["targets"] == {"e2e_p50_s": 0.5} and highest["max_rate_req_per_s"] > 0
    assert shown["Highest rate within the targets"] == f"{highest['max_rate_req_per_s']:.3g} req/s"
    assert shown["Binding at the next rate"] == highest["binding"] == "e2e_p50_s"
    assert highest["e2e_p50_s"] <= 0.5  # the rate held meets the target
    assert "--max-num-seqs 1" in serve and "--max-model-len 17" in serve
    assert (
        "--max-concurrency 2" in bench and "--request-rate inf" in bench and "--random-input-len 16" in bench
    )


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"tp": "3"}, "tensor_parallel=3"),  # Qwen2.5-7B's 28 heads: a TP of 3 does not divide them
        ({"load": "rate", "rate": "-1"}, "rate (requests/s)"),
        ({"load": "concurrency", "clients": "0"}, "concurrency (clients)"),
        ({"e2e": "0"}, "e2e_p50_s"),
    ],
)
def test_bad_input_is_an_error_naming_it(params, named):
    at = open_page(TINY | params)
    [error] = at.error
    assert error.value.startswith("Cannot predict: ") and named in error.value
    assert not at.metric and not at.dataframe


def test_a_deployment_that_does_not_fit_says_so():
    at = open_page(TINY | {"model": "llama-3.1-70b", "kv_dtype": "auto"})
    [error] = at.error
    assert error.value.startswith("Cannot predict: the deployment does not fit")


def test_an_unknown_engine_in_the_url_is_named_and_replaced():
    at = open_page(TINY | {"engine": "sglang"})
    assert any("`engine`" in e.value and "vllm, trtllm" in e.value for e in at.error)
    assert query(at)["engine"] == "vllm" and at.dataframe
