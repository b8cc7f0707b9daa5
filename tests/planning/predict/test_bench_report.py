"""`predict --format vllm-bench`: the steady state in the block `vllm bench serve` prints. The layout is held here to
a block written out by hand from vLLM 0.32's format strings (vllm/benchmarks/serve.py: `{:<40} {:<10.2f}`, titles
centred in 50 characters), and in tests/vllm/test_bench_prefix_repetition.py to what the real `vllm bench serve`
printed; the values to the JSON prediction of the same command."""

import gzip
import json
import math
import re

import pytest

from core.errors import InvalidArgumentError
from core.planning.commands.dispatch import main
from core.planning.predict.bench_report import (
    against_result,
    bench_report,
    bench_values,
    check_same_load,
    read_bench_result,
)
from core.planning.predict.load import Load

RESULT = {
    "request_throughput": 2.5,
    "output_throughput": 80.0,
    "total_token_throughput": 720.125,
    "mean_ttft_ms": 45.678,
    "median_ttft_ms": 40.0,
    "p50_ttft_ms": 40.0,
    "p99.9_ttft_ms": 1234.5,
}
# by hand: each label padded to 40, a space, the value with 2 decimals padded to 10 (51 characters, ending in spaces;
# 720.125 is exact in binary and rounds half to even)
BY_HAND = [
    "============ Serving Benchmark Result ============",
    "Request throughput (req/s):              2.50      ",
    "Output token throughput (tok/s):         80.00     ",
    "Total token throughput (tok/s):          720.12    ",
    "---------------Time to First Token----------------",
    "Mean TTFT (ms):                          45.68     ",
    "Median TTFT (ms):                        40.00     ",
    "P50 TTFT (ms):                           40.00     ",
    "P99.9 TTFT (ms):                         1234.50   ",
    "==================================================",
]


def test_the_block_is_vllms_layout_worked_by_hand():
    assert bench_report(RESULT, ("ttft",), (50, 99.9)).splitlines() == BY_HAND
    with pytest.raises(InvalidArgumentError, match="p90_ttft_ms"):
        bench_report(RESULT, ("ttft",), (90,))
    with pytest.raises(InvalidArgumentError, match="metrics must be among"):
        bench_report(RESULT, ("latency",))


ARGS = ["predict", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--concurrency", "8"]
ARGS += ["--prompt-len", "256", "--output-len", "32", "--length-spread", "0.5"]


def test_predict_prints_its_steady_state_in_that_block(capsys):
    """The same prediction twice (one seed): as JSON and as the block; every line of the block is the JSON's figure
    in ms (two decimals), the median its p50, total tokens/s = output tokens/s + requests/s x the mean prompt."""
    assert main(ARGS) == 0
    body = json.loads(capsys.readouterr().out)
    assert main([*ARGS, "--format", "vllm-bench"]) == 0
    printed = capsys.readouterr().out.splitlines()
    lines, footer = printed[:-2], printed[-2:]
    assert lines[0] == "======= Predicted Serving Benchmark Result =======" and lines[-1] == "=" * 50
    assert footer[0].startswith(  # Llama-3.1-8B's checkpoint is bf16: what "auto" is for both
        "predicted for Llama-3.1-8B on 1 x H100 SXM 80GB (tp 1, pp 1, 1 replica; max_num_seqs 256, weights auto "
        "(bf16), KV auto (bf16)), "
    )
    assert footer[0].endswith(f"engine profile {body['deployment']['engine']}")
    yes = {True: "yes", False: "no"}
    assert footer[1].startswith(
        f"steady state: converged {yes[body['converged']]}, stable {yes[body['stable']]}, KV-limited no; "
        f"{body['measured_requests']:,} requests measured after {body['warmup_requests']:,} of warm-up"
    )
    assert all(len(line) == (50 if line[0] in "=-" else 51) for line in lines)
    shown = {line[:40].strip(): float(line[41:]) for line in lines if not line.startswith(("=", "-"))}
    expected = {
        "Request throughput (req/s):": body["request_throughput_per_s"],
        "Output token throughput (tok/s):": body["throughput_tokens_per_s"],
        "Total token throughput (tok/s):": body["throughput_tokens_per_s"]
        + body["request_throughput_per_s"] * 256,
    }
    for ours, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2EL")):
        expected[f"Mean {name} (ms):"] = body[f"mean_{ours}_s"] * 1000
        expected[f"Median {name} (ms):"] = body[f"{ours}_p50_s"] * 1000
        for q in (50, 90, 95, 99):
            expected[f"P{q} {name} (ms):"] = body[f"{ours}_p{q}_s"] * 1000
    assert list(shown) == list(expected)
    assert shown == pytest.approx(expected, abs=0.005 + 1e-9)
    headers = [line.strip("-") for line in lines if line.startswith("-")]
    assert headers == [
        "Time to First Token",
        "Time per Output Token (excl. 1st token)",
        "Inter-token Latency",
        "End-to-end Latency",
    ]


def test_a_one_token_output_leaves_out_the_metrics_it_has_not(capsys):
    """TPOT and ITL are undefined when every request outputs one token: their blocks are left out (vLLM prints
    0.00 for them), TTFT and E2EL stay."""
    args = [*ARGS[:7], "--prompt-len", "256", "--output-len", "1", "--format", "vllm-bench"]
    assert main(args) == 0
    headers = [line.strip("-") for line in capsys.readouterr().out.splitlines() if line.startswith("-")]
    assert headers == ["Time to First Token", "End-to-end Latency"]


@pytest.mark.parametrize(
    "extra, word",
    [
        (["--benchmark-requests", "80"], "--benchmark-requests"),
        (["--disagg"], "--disagg"),
        (["--format", "x"], ""),
    ],
)
def test_what_the_block_cannot_show_is_refused(capsys, extra, word):
    try:
        status = main([*ARGS, "--format", "vllm-bench", *extra])
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2 and word in err and "Traceback" not in err


def _run_of(body: dict, scale_ttft: float = 1.0) -> dict:
    """A `vllm bench serve --save-result` file of ARGS's load (8 clients, 256 / 32 tokens), its figures the
    prediction's with the mean TTFT measured `scale_ttft` times the predicted one."""
    load = Load(None, 256, 32, 0.5, concurrency=8)
    run = bench_values(body, load) | {
        "completed": 800,
        "total_input_tokens": 800 * 256,
        "total_output_tokens": 800 * 32,
    }
    run |= {"request_rate": "inf", "max_concurrency": 8, "duration": 12.5, "peak_concurrent_requests": 8.0}
    run["mean_ttft_ms"] *= scale_ttft
    return run


def test_against_a_run_each_figure_beside_the_runs(capsys, tmp_path):
    """`predict --against run.json`: every figure the run has beside the predicted one, error = predicted /
    measured - 1 (a mean TTFT measured 1.25x the prediction: -20.0 %; the rest equal: 0); in the JSON under
    "against", as a table with --format vllm-bench."""
    assert main(ARGS) == 0
    body = json.loads(capsys.readouterr().out)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run_of(body, scale_ttft=1.25)))
    assert main([*ARGS, "--against", str(path)]) == 0
    figures = json.loads(capsys.readouterr().out)["against"]["figures"]
    assert len(figures) == 3 + 4 * 6  # the throughputs; per metric mean, median, p50, p90, p95, p99
    assert figures["mean_ttft_ms"]["rel_err"] == pytest.approx(1 / 1.25 - 1)
    assert all(
        row["rel_err"] == pytest.approx(0, abs=1e-12) for key, row in figures.items() if key != "mean_ttft_ms"
    )
    assert main([*ARGS, "--against", str(path), "--format", "vllm-bench"]) == 0
    table = capsys.readouterr().out.splitlines()
    ttft = body["mean_ttft_s"] * 1000
    assert table[0] == f"{'':<40}  predicted   measured    error"
    assert f"{'Mean TTFT (ms):':<40} {ttft:>10.2f} {ttft * 1.25:>10.2f}   -20.0%" in table
    assert (
        f"{'P99 E2EL (ms):':<40} {body['e2e_p99_s'] * 1000:>10.2f} {body['e2e_p99_s'] * 1000:>10.2f}    +0.0%"
        in table
    )


def test_a_run_of_another_load_or_no_run_is_refused(capsys, tmp_path):
    assert main(ARGS) == 0
    body = json.loads(capsys.readouterr().out)
    load = Load(None, 256, 32, 0.5, concurrency=8)
    other = {
        "a rate": ({"request_rate": 4.0, "max_concurrency": None}, "request_rate 4.0"),
        "other clients": ({"max_concurrency": 16}, "not 8 clients"),
        "longer prompts": ({"total_input_tokens": 800 * 300}, "mean prompt length is 300.0 tokens, not 256"),
    }
    for change, word in other.values():
        with pytest.raises(InvalidArgumentError, match=word):
            check_same_load(_run_of(body) | change, load)
    poisson = Load(4.0, 256, 32, 0.5)
    check_same_load(
        _run_of(body) | {"request_rate": 4.0, "max_concurrency": None, "burstiness": 1.0}, poisson
    )
    with pytest.raises(InvalidArgumentError, match=r"burstiness 0\.5, not Poisson's 1"):
        check_same_load(
            _run_of(body) | {"request_rate": 4.0, "max_concurrency": None, "burstiness": 0.5}, poisson
        )
    check_same_load(_run_of(body) | {"total_input_tokens": 800 * 260}, load)  # within 5 %: a tokenizer's few
    good = _run_of(body)
    for data, word in (
        (b"{", "is not valid JSON"),
        (b"", "is empty"),
        (gzip.compress(json.dumps(good).encode()), "gzip compressed archive"),
        (b"[]", "not a `vllm bench serve --save-result` file"),
        (json.dumps(good | {"completed": "800"}).encode(), "not a run's result: completed '800'"),
        (json.dumps(good | {"max_concurrency": True}).encode(), "max_concurrency True"),
        (json.dumps(good | {"request_rate": -1}).encode(), "request_rate -1"),
        (json.dumps(good | {"total_input_tokens": None}).encode(), "total_input_tokens None"),
    ):
        (tmp_path / "bad.json").write_bytes(data)
        with pytest.raises(InvalidArgumentError, match=re.escape(word)):
            read_bench_result(tmp_path / "bad.json")
    with pytest.raises(InvalidArgumentError, match="cannot be read"):
        read_bench_result(tmp_path / "missing.json")
    (tmp_path / "run.json").write_text(json.dumps(good | {"max_concurrency": 16}))
    assert main([*ARGS, "--against", str(tmp_path / "run.json")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: --against {tmp_path / 'run.json'} is of another load")
        and len(err.splitlines()) == 1
    )
    assert against_result({"mean_ttft_ms": 5.0}, {"mean_ttft_ms": 0}) == {
        "mean_ttft_ms": {"predicted": 5.0, "measured": 0.0, "rel_err": None}
    }


def test_max_rate_prints_its_highest_rates_steady_state_in_that_block(capsys):
    """`max-rate --format vllm-bench`: the block of the prediction at the highest rate (the JSON's figures there),
    the two lines under it, then that rate and the target the next rate misses, as the JSON says them."""
    args = ["max-rate", *ARGS[1:5], "--prompt-len", "256", "--output-len", "32", "--ttft-p99", "0.2"]
    assert main(args) == 0
    body = json.loads(capsys.readouterr().out)
    # the JSON's bench command replays the load at the highest rate, rounded down to 4 significant digits, with
    # 20 x the requests in flight there (Little's law), at least 1,000, in hundreds
    words = body["vllm_bench_command"].replace("\\\n", " ").split()
    rate, prompts = (
        float(words[words.index("--request-rate") + 1]),
        int(words[words.index("--num-prompts") + 1]),
    )
    top = body["max_rate_req_per_s"]
    assert top * (1 - 1e-3) <= rate <= top and len(f"{rate:g}".replace(".", "").strip("0")) <= 4
    assert prompts == max(1000, -(-math.ceil(20 * rate * body["mean_e2e_s"]) // 100) * 100)
    assert main([*args, "--format", "vllm-bench"]) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = {line[:40].strip(): float(line[41:]) for line in printed[1:-4] if not line.startswith(("=", "-"))}
    assert shown["Request throughput (req/s):"] == pytest.approx(body["request_throughput_per_s"], abs=0.005)
    assert shown["P99 TTFT (ms):"] == pytest.approx(body["ttft_p99_s"] * 1000, abs=0.005)
    assert (
        printed[-1]
        == f"highest rate within the targets: {rate:g} req/s; the next rate misses {body['binding']}"
    )
    impossible = [*args[:-1], "0.000001"]  # a TTFT p99 of 1 us: no rate holds it
    assert main([*impossible, "--format", "vllm-bench"]) == 0
    assert capsys.readouterr().out == "no rate tried holds the targets: the lowest misses ttft_p99_s\n"


def test_a_chats_total_token_throughput_is_left_out():
    """Multi-turn chats: each later prompt carries the conversation so far, so prompt_len (the first turn's) does
    not give the tokens in; the total line is left out, the other throughputs stay."""
    figures = {"request_throughput_per_s": 2.0, "throughput_tokens_per_s": 64.0}
    figures |= {f"{m}_s": 0.01 for m in ("mean_ttft", "ttft_p50", "ttft_p90", "ttft_p95", "ttft_p99")}
    chats = bench_values(figures, Load(1.0, 256, 32, shared_prefix_len=128, turns=3))
    single = bench_values(figures, Load(1.0, 256, 32))
    assert "total_token_throughput" not in chats and single["total_token_throughput"] == 64.0 + 2.0 * 256
    lines = bench_report(chats, ("ttft",)).splitlines()
    assert lines[1:3] == [
        "Request throughput (req/s):              2.00      ",
        "Output token throughput (tok/s):         64.00     ",
    ]
    assert lines[3] == "---------------Time to First Token----------------"
