"""Workload generators and trace loading: fitted means, Poisson arrivals, prefixes, and row/column errors."""

import io
import json
import math

import numpy as np
import pytest

from core.errors import InvalidArgumentError
from core.serving.workload import Request, alpaca, fixed, load_trace, sharegpt, uniform


def _lengths(requests):
    return (
        np.array([r.prompt_len for r in requests], dtype=float),
        np.array([r.output_len for r in requests], dtype=float),
    )


@pytest.mark.parametrize(
    ("make", "prompt_mean", "output_mean"), [(sharegpt, 161.31, 337.99), (alpaca, 19.31, 58.45)]
)
def test_length_means_match_the_paper(make, prompt_mean, output_mean):
    prompts, outputs = _lengths(make(20_000, seed=3))
    assert prompts.mean() == pytest.approx(prompt_mean, rel=0.04)
    assert outputs.mean() == pytest.approx(output_mean, rel=0.04)
    assert (prompts >= 1).all() and (outputs >= 1).all()
    assert (prompts + outputs).max() <= 2048


def test_sharegpt_varies_far_more_than_alpaca():
    sp, so = _lengths(sharegpt(10_000, seed=1))
    ap, ao = _lengths(alpaca(10_000, seed=1))
    assert sp.std() > 8 * ap.std() and so.std() > 5 * ao.std()
    # Figure 11: 8.4x longer prompts, 5.8x longer outputs
    assert sp.mean() / ap.mean() == pytest.approx(8.4, rel=0.08)
    assert so.mean() / ao.mean() == pytest.approx(5.8, rel=0.08)


def test_poisson_arrivals_have_the_requested_rate():
    times = np.array([r.arrival_time for r in sharegpt(20_000, rate=4.0, seed=2)])
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() == pytest.approx(0.25, rel=0.05)  # exponential: std == mean
    assert all(r.arrival_time == 0.0 for r in sharegpt(50, rate=math.inf))


def test_deterministic_for_a_seed():
    assert sharegpt(200, seed=7) == sharegpt(200, seed=7)
    assert sharegpt(200, seed=7) != sharegpt(200, seed=8)
    assert [r.request_id for r in sharegpt(5)] == [0, 1, 2, 3, 4]


def test_shared_prefix_and_parallel_sampling():
    requests = sharegpt(4_000, seed=4, n=3, prefix_len=100, prefix_fraction=0.25)
    shared = [r for r in requests if r.prefix_group is not None]
    assert len(shared) / len(requests) == pytest.approx(0.25, abs=0.03)
    assert all(r.prefix_len == 100 and r.prompt_len > 100 and r.prefix_group == 0 for r in shared)
    assert all(r.n == 3 for r in requests)
    assert all(r.prompt_len + r.output_len <= 2048 for r in requests)


def test_fixed_and_uniform():
    assert {(r.prompt_len, r.output_len) for r in fixed(10, 17, 5)} == {(17, 5)}
    requests = uniform(2_000, (10, 20), (1, 3), rate=10.0, seed=1)
    prompts, outputs = _lengths(requests)
    assert prompts.min() == 10 and prompts.max() == 20 and set(outputs) == {1, 2, 3}


@pytest.mark.parametrize(
    "call",
    [
        lambda: sharegpt(0),
        lambda: sharegpt(10, rate=0),
        lambda: sharegpt(10, n=0),
        lambda: sharegpt(10, prefix_fraction=1.5, prefix_len=10),
        lambda: fixed(10, 2000, 100),
        lambda: uniform(10, (5, 1), (1, 2)),
        lambda: fixed(10, 0, 5),
    ],
)
def test_bad_arguments_raise(call):
    with pytest.raises(InvalidArgumentError):
        call()


def test_load_csv_and_jsonl_agree_and_sort_by_arrival():
    csv_text = "arrival_time,prompt_len,output_len,n,prefix_group,prefix_len\n0.5,10,3,,,\n0.1,20,4,2,sys,8\n"
    rows = [
        {"arrival_time": 0.5, "prompt_len": 10, "output_len": 3},
        {
            "arrival_time": 0.1,
            "prompt_len": 20,
            "output_len": 4,
            "n": 2,
            "prefix_group": "sys",
            "prefix_len": 8,
        },
    ]
    jsonl = "\n".join(json.dumps(r) for r in rows) + "\n"
    expected = [Request(0, 0.1, 20, 4, 2, "sys", 8), Request(1, 0.5, 10, 3, 1, None, 0)]
    assert load_trace(csv_text) == expected
    assert load_trace(io.BytesIO(jsonl.encode())) == expected
    assert load_trace(jsonl.encode()) == expected


def test_load_trace_from_path(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrival_time,prompt_len,output_len\n0,5,5\n1.5,6,7\n")
    assert [r.prompt_len for r in load_trace(path)] == [5, 6]
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrival_time,prompt_len,output_len\n0,5,5\n1,x,5\n", r"row 3, column 'prompt_len'"),
        ("arrival_time,prompt_len,output_len\n0,5,0\n", r"row 2, column 'output_len'"),
        ("arrival_time,prompt_len,output_len\n-1,5,5\n", r"row 2, column 'arrival_time'"),
        ("arrival_time,prompt_len\n0,5\n", r"lacks column\(s\) \['output_len'\]"),
        ('{"arrival_time": 0, "prompt_len": 5, "output_len": 2}\n{"arrival_time": 1}\n', r"row 2: missing"),
        ('{"arrival_time": 0, "prompt_len": 5, "output_len": 2}\nnot json\n', r"line 2: not valid JSON"),
        ("arrival_time,prompt_len,output_len,prefix_len\n0,5,5,9\n", r"row 2, column 'prefix_len'"),
        ("arrival_time,prompt_len,output_len\n0,5.5,5\n", r"row 2, column 'prompt_len'"),
        ("arrival_time,prompt_len,output_len\n", r"no requests"),
    ],
)
def test_bad_trace_names_row_and_column(text, message):
    with pytest.raises(InvalidArgumentError, match=message):
        load_trace(text)


def test_non_utf8_upload_is_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        load_trace(io.BytesIO(b"\xff\xfe\x00bad"))
