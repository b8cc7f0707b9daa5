"""The SLO search's percentile, metric and engine choices and its highest rates under AppTest: the answer is
`plan_slo`'s for the same targets and engine (called here, apart from the page), and each highest rate in the
ranked table is what `python -m core.planning max-rate` prints for that configuration.

A tiny search (one L40S, 64 / 8 tokens at 2 req/s) keeps it to a few seconds."""

import json

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from core.errors import SloInfeasibleError
from core.page_models.slo_planner import SloPlannerParams, search, serve_command, table_rows
from core.planning.commands.predict_cli import max_rate_main
from core.planning.predict.load import Load
from core.planning.search.slo import Slo, SloCandidates, plan_slo
from tests.conftest import ROOT

PAGE = "app_pages/slo_planner.py"
SMALL = {
    "mode": "search",
    "model": "qwen2.5-7b",
    "rate": "2",
    "prompt_len": "64",
    "output_len": "8",
    "spread": "0",
    "ttft": "0.5",
    "ttft_q": "99",
    "tpot_ms": "auto",
    "e2e": "2",
    "e2e_q": "90",
    "gpus": "l40s",
    "max_gpus": "1",
    "kv": "auto",
    "weights": "auto",
    "engine": "trtllm",
}


def open_page(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def test_targets_on_any_percentile_and_the_engine_reach_the_search_and_the_highest_rates(capsys):
    at = open_page(SMALL | {"rates": "1"})  # the highest rates are asked for (off by default)
    assert not at.error
    cands = SloCandidates(gpus=("l40s",), max_gpus=1, kv_dtypes=("auto",), engine="trtllm")
    plan = plan_slo("qwen2.5-7b", Load(2.0, 64, 8), Slo(ttft_p99_s=0.5, e2e_p90_s=2.0), cands)
    best = plan.best
    shown = {m.label: m.value for m in at.metric}
    assert shown["Deployment"] == f"{best.num_gpus} × {best.gpu_name}"
    assert shown["TTFT p99 (predicted)"] == f"{best.ttft_p99_s:.3g} s"  # the target's percentile, not p95
    assert (
        shown["TPOT p95 (predicted)"] == f"{best.tpot_p95_s * 1e3:.3g} ms"
    )  # no TPOT target: its percentile
    assert any("trtllm engine profile" in c.value for c in at.caption)
    [table] = at.dataframe
    rows = table.value
    assert len(rows) == plan.num_evaluated
    assert {"TTFT p99 (s)", "TPOT p95 (ms)", "E2E p90 (s)", "highest rate (req/s)"} <= set(rows.columns)
    first = rows[rows["meets SLO"]].iloc[0]
    assert first["E2E p90 (s)"] == pytest.approx(best.e2e_p90_s)
    rated = rows[rows["highest rate (req/s)"].notna()]
    assert 1 <= len(rated) <= 3
    for _, row in rated.iterrows():
        argv = [
            "--model",
            "qwen2.5-7b",
            "--gpu",
            "l40s",
            "--tp",
            str(row["TP"]),
            "--pp",
            str(row["PP"]),
            "--replicas",
            str(row["replicas"]),
            "--max-num-seqs",
            str(row["max_num_seqs"]),
            "--kv-dtype",
            row["KV dtype"],
            "--weight-dtype",
            row["weights"],
            "--engine",
            "trtllm",
            "--prompt-len",
            "64",
            "--output-len",
            "8",
            "--ttft-p99",
            "0.5",
            "--e2e-p90",
            "2",
        ]
        capsys.readouterr()
        assert max_rate_main(argv) == 0
        printed = json.loads(capsys.readouterr().out)
        assert row["highest rate (req/s)"] == pytest.approx(printed["max_rate_req_per_s"], rel=1e-12)
        assert printed["max_rate_req_per_s"] > 2.0  # it meets the targets at 2 req/s, so holds more
    bench = at.code[1].value
    assert "--request-rate 2 " in bench and "--random-output-len 8 " in bench


def test_disaggregated_too_ranks_both_kinds_side_by_side():
    # 90 req/s of 256 / 8 tokens on up to 2 L40S: no deployment holds it, so every one is evaluated (agg and the
    # disaggregated 1 + 1) in a fraction of a second, each ruled out by a bound
    params = SMALL | {
        "rate": "90",
        "prompt_len": "256",
        "ttft": "0.5",
        "max_gpus": "2",
        "disagg_too": "1",
        "rates": "0",
    }
    at = open_page(params)
    assert at.query_params["disagg_too"] == "1"
    cands = SloCandidates(gpus=("l40s",), max_gpus=2, kv_dtypes=("auto",), engine="trtllm", disagg=True)
    with pytest.raises(SloInfeasibleError) as infeasible:
        plan_slo("qwen2.5-7b", Load(90.0, 256, 8), Slo(ttft_p99_s=0.5, e2e_p90_s=2.0), cands)
    plan = infeasible.value.plan
    assert [e.value for e in at.error] == [str(infeasible.value)]
    [table] = at.dataframe
    rows = table.value
    assert len(rows) == len(plan.configs) and set(rows["mode"]) == {"agg", "disagg"}
    for (_, row), config in zip(rows.iterrows(), plan.configs, strict=True):
        assert (row["mode"], row["GPUs"], row["TP"]) == (config.mode, config.num_gpus, config.tp)
        for column, key in (
            ("prefill GPUs", "prefill_gpus"),
            ("decode GPUs", "decode_gpus"),
            ("tokens/s per GPU", "tokens_per_s_per_gpu"),
        ):
            assert (
                pd.isna(row[column]) if getattr(config, key) is None else row[column] == getattr(config, key)
            )
        transfer = config.kv_transfer_s
        assert (
            pd.isna(row["KV transfer (ms)"])
            if transfer is None
            else row["KV transfer (ms)"] == transfer * 1e3
        )
    [disagg] = rows[rows["mode"] == "disagg"].to_dict("records")
    assert (disagg["prefill GPUs"], disagg["decode GPUs"]) == (1, 1) and disagg["KV transfer (ms)"] > 0


def test_the_table_s_tokens_per_gpu_and_a_disaggregated_serve_note():
    # 9 req/s of 1,000 / 8 tokens: every 2-GPU layout is simulated, the disaggregated 1 + 1 among them
    params = SloPlannerParams(
        model="qwen2.5-7b",
        rate=9.0,
        prompt_len=1000,
        output_len=8,
        targets=(("ttft_p99_s", 1.0), ("e2e_p90_s", 3.0)),
        gpus=("l40s",),
        max_gpus=2,
        kv_dtypes=("auto",),
        engine="trtllm",
        disagg=True,
    )
    plan = search(params).plan
    rows = table_rows(plan, params)
    simulated = [(r, c) for r, c in zip(rows, plan.configs, strict=True) if c.simulated]
    assert {c.mode for _, c in simulated} == {"agg", "disagg"}
    for row, config in simulated:
        assert row["tokens/s per GPU"] == pytest.approx(row["output tokens/s"] / config.num_gpus, rel=1e-12)
    [disagg] = [c for c in plan.configs if c.mode == "disagg"]
    serve = serve_command(params, disagg)  # a disaggregated best shows its note and both pools' flags
    comments = [line[2:] for line in serve.splitlines() if line.startswith("# ")]
    assert " ".join(comments).startswith(disagg.serve_note) and serve.count("\nvllm serve") == 2
    # each pool's KV connector (checked against vLLM in tests/planning/memory/test_vllm_serve_flags.py)
    assert serve.count("\n  --kv-transfer-config '") == 2
