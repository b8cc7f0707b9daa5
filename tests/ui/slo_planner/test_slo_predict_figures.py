"""The predict mode's chart and inputs: each drawn percentile and its error bars are `predict`'s (called here),
each target sits at its own percentile and value, and the URL fields build the `SloPredictParams` they name."""

import pytest

from core.page_models.slo_planner import DEFAULT_PARAMS
from core.page_models.slo_predict import DEFAULT_PREDICT_PARAMS, missed_targets, percentile_rows
from core.planning.cost.speculative import Speculation
from core.planning.predict.deployment import Deployment
from core.planning.predict.disagg import DisaggDeployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.latency import PERCENTILES
from ui.query_state import parse_params
from ui.slo_planner.figures import PERCENTILE_PANELS, percentiles_figure
from ui.slo_planner.state import FIELDS, MODE_KEYS, params_from, predict_params_from, url_params


@pytest.fixture(scope="module")
def prediction():
    return predict(
        Deployment("qwen2.5-7b", "l40s", max_num_seqs=4), Load(None, 64, 8, concurrency=4)
    ).to_dict()


def test_the_drawn_percentiles_and_intervals_are_predict_s(prediction):
    targets = {"tpot_p99_s": 0.03, "e2e_p50_s": 0.5}
    fig = percentiles_figure(prediction, targets)
    for metric, _, unit, factor in PERCENTILE_PANELS:
        [trace] = [t for t in fig.data if t.name == f"predicted {metric}"]
        keys = [f"{metric}_p{q}_s" for q in PERCENTILES]
        assert list(trace.x) == [f"p{q}" for q in PERCENTILES]
        assert list(trace.y) == pytest.approx([prediction[k] * factor for k in keys])
        assert list(trace.y) == pytest.approx(
            [
                (prediction["intervals"][k][1] * factor) - e
                for k, e in zip(keys, trace.error_y.array, strict=True)
            ]
        )
        assert factor == (1e3 if unit == "ms" else 1.0)
    [tpot] = [t for t in fig.data if t.name == "target tpot_p99_s"]
    assert (list(tpot.x), list(tpot.y)) == (["p99"], [pytest.approx(30.0)])  # TPOT drawn in ms
    [e2e] = [t for t in fig.data if t.name == "target e2e_p50_s"]
    assert (list(e2e.x), list(e2e.y)) == (["p50"], [0.5])  # end-to-end in s
    assert len([t for t in fig.data if t.name.startswith("target")]) == 2


def test_table_rows_say_which_targets_are_met(prediction):
    tight = prediction["tpot_p99_s"] * 0.5
    targets = {"tpot_p99_s": tight, "e2e_p50_s": prediction["e2e_p50_s"] * 2}
    rows = {(r["metric"], r["percentile"]): r for r in percentile_rows(prediction, targets)}
    assert len(rows) == 16
    assert rows[("tpot", "p99")]["meets target"] is False and rows[("e2e", "p50")]["meets target"] is True
    assert rows[("ttft", "p50")]["meets target"] is None and rows[("ttft", "p50")]["target (ms)"] is None
    assert rows[("tpot", "p99")]["predicted (ms)"] == pytest.approx(prediction["tpot_p99_s"] * 1e3)
    assert missed_targets(prediction, targets) == ["tpot_p99_s"]


def test_the_url_fields_build_the_params_and_hold_only_the_mode_s_inputs():
    values, errors = parse_params(
        {
            "mode": "predict",
            "tpot_ms": "40",
            "tpot_q": "99",
            "itl_ms": "25",
            "load": "concurrency",
            "clients": "16",
            "kv_dtype": "auto",
        },
        FIELDS,
    )
    assert not errors
    params = predict_params_from(values)
    assert params.targets == (("ttft_p95_s", 1.0), ("tpot_p99_s", 0.04), ("itl_p99_s", 0.025))
    assert params.load() == Load(None, 2000, 300, concurrency=16)
    assert params.deployment() == Deployment("llama-3.1-8b", "h100-80gb", replicas=2)
    assert set(url_params(values)) == set(MODE_KEYS["predict"])
    assert "gpus" not in url_params(values) and "gpu" in url_params(values)
    defaults, _ = parse_params({"mode": "predict"}, FIELDS)
    assert predict_params_from(defaults) == DEFAULT_PREDICT_PARAMS
    search, _ = parse_params({}, FIELDS)
    assert set(url_params(search)) == set(MODE_KEYS["search"]) and "gpu" not in url_params(search)
    # one set of target fields serves both modes, so both defaults are the same targets
    assert params_from(search) == DEFAULT_PARAMS and DEFAULT_PARAMS.targets == DEFAULT_PREDICT_PARAMS.targets


def test_the_lever_fields_build_the_levers_core_takes():
    values, errors = parse_params(
        {
            "mode": "predict",
            "prompt_len": "4000",
            "prefix_len": "3500",
            "prefixes": "8",
            "zipf": "1.1",
            "turns": "3",
            "turn_gap": "30",
            "spec_k": "2",
            "spec_acc": "0.9, 0.7",
            "spec_method": "draft-model",
            "draft": "qwen2.5-7b",
        },
        FIELDS,
    )
    assert not errors
    params = predict_params_from(values)
    assert params.load() == Load(
        12.0, 4000, 300, shared_prefix_len=3500, num_prefixes=8, prefix_zipf=1.1, turns=3, turn_gap_s=30.0
    )
    assert params.deployment().speculation == Speculation(2, (0.9, 0.7), "draft-model", "qwen2.5-7b")
    assert set(url_params(values)) == set(MODE_KEYS["predict"])
    disagg, _ = parse_params(
        {"mode": "predict", "disagg": "1", "p_workers": "2", "d_tp": "2", "kv_link": "network"}, FIELDS
    )
    assert predict_params_from(disagg).disagg_deployment() == DisaggDeployment.of(
        "llama-3.1-8b", "h100-80gb", (2, 1), (1, 2), "network", kv_dtype="fp8"
    )
    ngram, _ = parse_params(
        {"mode": "predict", "spec_k": "1", "spec_acc": "0.5", "draft": "qwen2.5-7b"}, FIELDS
    )
    assert predict_params_from(ngram).deployment().speculation == Speculation(1, (0.5,))  # draft: method only
