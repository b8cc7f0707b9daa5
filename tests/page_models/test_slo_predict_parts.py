"""The predict mode's answer in three parts, so the page shows the prediction before the extras: the prediction
with its commands, the highest rate, the larger-KV rows; together they are the whole answer, and each part is
what it was inside it (tiny loads: each prediction well under a second)."""

from dataclasses import replace

import pytest

from core.page_models.slo_predict import (
    SloPredictParams,
    deployment_answer,
    highest_rate,
    larger_kv_given_row,
    larger_kv_others,
    larger_kv_rows,
    prediction_answer,
)
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.max_rate import max_rate

TINY = SloPredictParams(
    model="qwen2.5-7b",
    gpu="l40s",
    replicas=1,
    max_num_seqs=1,
    kv_dtype="auto",
    load_kind="concurrency",
    concurrency=2,
    prompt_len=64,
    output_len=1,
    targets=(("e2e_p50_s", 0.5),),
    shared_prefix_len=48,
    num_prefixes=2,
)
calls = []


def _progress(fraction, message):
    calls.append((fraction, message))


@pytest.fixture(scope="module")
def whole():
    return deployment_answer(TINY, _progress)


def test_the_three_parts_are_the_whole_answer(whole):
    first = prediction_answer(TINY, _progress)
    assert first.max_rate is None and first.larger_kv == ()
    assert first.prediction == whole.prediction and first.serve_command == whole.serve_command
    assert (first.bench_command, first.num_prompts) == (whole.bench_command, whole.num_prompts)
    assert (
        larger_kv_given_row(TINY, first.prediction),
        *larger_kv_others(TINY, _progress),
    ) == whole.larger_kv
    assert whole.larger_kv == larger_kv_rows(TINY, first.prediction)
    assert [row["deployment"] for row in whole.larger_kv] == [
        "as given",
        "fp8 KV cache",
        "2x GPUs: tp 2 (was 1)",
    ]
    assert all(0 <= f <= 1 for f, _ in calls) and any("larger KV cache: fp8" in m for _, m in calls)


def test_the_highest_rate_is_max_rates(whole):
    found = whole.max_rate  # highest_rate's
    load = Load(None, 64, 1, concurrency=2, shared_prefix_len=48, num_prefixes=2)
    rate = max_rate(Deployment("qwen2.5-7b", "l40s", max_num_seqs=1), load, {"e2e_p50_s": 0.5})
    assert found["max_rate_req_per_s"] == rate.max_req_per_s and found["binding"] == rate.binding


def test_no_extras_where_there_is_nothing_to_ask():
    assert highest_rate(replace(TINY, targets=()), _progress) is None  # no targets: no highest rate
    assert larger_kv_others(replace(TINY, shared_prefix_len=0), _progress) == ()  # nothing shared
    disagg = replace(TINY, disagg=True)
    assert highest_rate(disagg, _progress) is None and larger_kv_others(disagg, _progress) == ()
    whole = deployment_answer(disagg, _progress)
    assert whole.max_rate is None and whole.larger_kv == () and whole.prediction["mode"] == "disagg"
