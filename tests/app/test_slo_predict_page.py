"""The SLO planner's "predict my deployment" mode under AppTest: every value it shows is what `predict` (called here,
apart from the page) and the command line (`python -m core.planning predict` / `max-rate`, run on the very
flags the page prints) give for the same inputs; the URL holds every input; bad input is st.error naming it.

Tiny loads (16-token prompts, one output token, one sequence at a time) keep each prediction well under a second.
"""

import json
import math
import shlex
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from core.planning.commands.predict_cli import max_rate_main, predict_main
from core.planning.cost.fits.engine_profiles import DEFAULT_ENGINE
from core.planning.cost.speculative import Speculation
from core.planning.predict.deployment import Deployment
from core.planning.predict.disagg import DisaggDeployment, predict_disagg
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.latency import PERCENTILES
from core.serving.steady_state import STEADY_METRICS
from tests.conftest import ROOT
from ui.slo_planner.state import PREDICT_INPUTS

PAGE = "app_pages/slo_planner.py"
TINY = {
    "mode": "predict",
    "model": "qwen2.5-7b",
    "rate": "12",
    "prompt_len": "16",
    "output_len": "1",
    "spread": "0",
    "ttft": "auto",
    "tpot_ms": "auto",
    "gpu": "l40s",
    "tp": "1",
    "pp": "1",
    "replicas": "1",
    "seqs": "1",
    "kv_dtype": "auto",
    "weight_dtype": "auto",
    "engine": DEFAULT_ENGINE,  # the references below are predict's with its default engine
    "vllm": "auto",  # today's vLLM (--vllm-version left out)
    "load": "concurrency",
    "clients": "2",
    "seed": "0",
    "itl_ms": "auto",
    "e2e": "0.5",
    "ttft_q": "95",
    "tpot_q": "95",
    "itl_q": "99",
    "e2e_q": "50",
    "prefix_len": "0",
    "prefixes": "1",
    "zipf": "auto",
    "turns": "1",
    "turn_gap": "10",
    "spec_k": "0",
    "spec_acc": "",
    "spec_method": "ngram",
    "draft": "phi-3-mini",
    "disagg": "0",
    "p_workers": "1",
    "p_tp": "1",
    "d_workers": "1",
    "d_tp": "1",
    "kv_link": "auto",
    "offload": "0",
    "offload_policy": "lru",
}
NO_TARGETS = {"e2e": "auto"}  # no highest rate to bisect where it is not what a test checks


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
    bench_at_highest, cli, serve, bench = (
        c.value for c in at.code
    )  # the highest rate sits above the commands
    # long lines (the CLI line, a disaggregated note, --kv-transfer-config) wrap on screen; the copy is unchanged
    assert all(c.proto.wrap_lines for c in at.code)
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
    # the bench command at the highest rate: max-rate's own, Poisson at that rate (to 4 digits, rounded down)
    assert bench_at_highest == highest["vllm_bench_command"]
    rate = float(bench_at_highest.split("--request-rate ")[1].split()[0])
    assert highest["max_rate_req_per_s"] * (1 - 1e-3) <= rate <= highest["max_rate_req_per_s"]
    assert (
        "--max-concurrency" not in bench_at_highest and "--max-concurrency" in bench
    )  # the page's load: clients
    assert shown["Highest rate within the targets"] == f"{highest['max_rate_req_per_s']:.3g} req/s"
    # one sequence at a time: the next grid rate misses on its e2e p50 or is not served at all
    assert shown["Binding at the next rate"] == highest["binding"] in ("e2e_p50_s", "rate")
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
        ({"e2e": "0"}, "--e2e-p50 (seconds) must be greater than 0"),
        ({"prefix_len": "-1"}, "--shared-prefix-len"),  # a negative length
        ({"prefix_len": "17"}, "--shared-prefix-len 17 is longer than the shortest prompt (16"),
        ({"prefix_len": "8", "prefixes": "0"}, "--num-prefixes"),
        ({"prefix_len": "8", "zipf": "-1"}, "--prefix-zipf"),
        ({"turns": "0"}, "--turns"),
        ({"turns": "2", "turn_gap": "0"}, "--turn-gap"),
        ({"spec_k": "2", "spec_acc": "0.8,1.5"}, "--spec-acceptance rates must be in [0, 1], got 1.5"),
        ({"spec_k": "2", "spec_acc": "0.8,x"}, "--spec-acceptance must be comma-separated numbers"),
        ({"spec_k": "2", "spec_acc": "0.8"}, "--spec-acceptance needs one rate per draft token"),
        ({"spec_k": "-1", "spec_acc": "0.8"}, "--spec-tokens"),
        ({"disagg": "1", "spec_k": "1", "spec_acc": "0.5"}, "--disagg takes neither --spec-tokens"),
        ({"disagg": "1", "d_workers": "0"}, "--decode-workers must be between 1 and 1,024, got 0"),
        ({"disagg": "1", "kv_link": "network"}, "L40S has no known network bandwidth"),
        ({"vllm": "0.x"}, "--vllm-version takes a vLLM release such as 0.12.0"),
        ({"vllm": "0.12.0", "engine": "trtllm"}, "--engine trtllm is not vLLM's profile"),
    ],
)
def test_bad_input_is_an_error_naming_it(params, named):
    at = open_page(TINY | NO_TARGETS | params)
    [error] = at.error
    assert error.value.startswith("Cannot predict: ") and named in error.value
    assert not at.metric and not at.dataframe


def test_a_deployment_that_does_not_fit_says_so():
    at = open_page(TINY | {"model": "llama-3.1-70b", "kv_dtype": "auto"})
    [error] = at.error
    assert error.value.startswith("Cannot predict: the deployment does not fit")


def test_a_vllm_release_prices_its_kernel_and_travels_to_the_printed_command(capsys):
    """vllm=0.12.0 on a block-FP8 MoE checkpoint on H200 (`--vllm-version`): the page's table is predict's for that
    release (vLLM 0.12's padded expert rows), not today's, and its predict line carries the flag and reproduces it."""
    params = {"model": "qwen3-235b-a22b-fp8", "gpu": "h200-141gb", "tp": "2", "vllm": "0.12.0"}
    at = open_page(TINY | NO_TARGETS | params)
    assert not at.error and query(at)["vllm"] == "0.12.0"
    load = Load(None, 16, 1, concurrency=2)
    deployment = Deployment("qwen3-235b-a22b-fp8", "h200-141gb", tp=2, max_num_seqs=1, vllm_version="0.12.0")
    ref, todays = (
        predict(deployment, load).to_dict(),
        predict(replace(deployment, vllm_version=None), load).to_dict(),
    )
    rows = at.dataframe[0].value.set_index(["metric", "percentile"])
    assert rows.loc[("ttft", "p50"), "predicted (ms)"] == pytest.approx(ref["ttft_p50_s"] * 1e3, rel=1e-12)
    assert ref["ttft_p50_s"] > todays["ttft_p50_s"]  # the padding's FLOPs in the prefill step
    predict_line = next(c.value for c in at.code if "core.planning predict" in c.value).splitlines()[0]
    assert "--vllm-version 0.12.0" in predict_line
    assert cli_json(predict_main, predict_line, capsys)["ttft_p50_s"] == pytest.approx(
        ref["ttft_p50_s"], rel=1e-12
    )


def test_an_unknown_engine_in_the_url_is_named_and_replaced():
    at = open_page(TINY | {"engine": "sglang"})
    assert any("`engine`" in e.value and "vllm, trtllm" in e.value for e in at.error)
    assert query(at)["engine"] == DEFAULT_ENGINE and at.dataframe


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_shared_prefixes_show_the_hit_rate_beside_ttft_and_what_a_larger_kv_cache_does(capsys):
    levers = {"prompt_len": "64", "prefix_len": "48", "prefixes": "2", "zipf": "1.2"}  # 3 of 4 blocks shared
    at = open_page(TINY | NO_TARGETS | levers)
    assert not at.error and query(at) == TINY | NO_TARGETS | levers
    load = Load(None, 64, 1, concurrency=2, shared_prefix_len=48, num_prefixes=2, prefix_zipf=1.2)
    ref = predict(Deployment("qwen2.5-7b", "l40s", max_num_seqs=1), load).to_dict()
    assert 0 < ref["prefix_hit_rate"] < 1
    shown = metrics(at)
    assert shown["Prefix-hit rate"] == f"{ref['prefix_hit_rate']:.3f}"
    assert shown["TTFT p50 (predicted)"] == f"{ref['ttft_p50_s'] * 1e3:.3g} ms"
    assert shown["Output tokens/s per GPU"] == f"{ref['throughput_tokens_per_s']:,.0f}"  # one GPU
    _, larger = at.dataframe
    rows = larger.value.set_index("deployment")
    for label, deployment in (
        ("fp8 KV cache", Deployment("qwen2.5-7b", "l40s", max_num_seqs=1, kv_dtype="fp8")),
        ("2x GPUs: tp 2 (was 1)", Deployment("qwen2.5-7b", "l40s", tp=2, max_num_seqs=1)),
    ):
        other = predict(deployment, load)
        assert rows.loc[label, "prefix-hit rate"] == pytest.approx(
            other.to_dict()["prefix_hit_rate"], rel=1e-12
        )
        assert rows.loc[label, "TTFT p99 (s)"] == pytest.approx(other.metrics["ttft_p99_s"], rel=1e-12)
        assert rows.loc[label, "KV slots per replica"] == other.kv_tokens
    assert (
        rows.loc["fp8 KV cache", "KV slots per replica"] == 2 * rows.loc["as given", "KV slots per replica"]
    )
    printed = cli_json(predict_main, at.code[0].value, capsys)  # the printed command carries the levers
    assert printed["prefix_hit_rate"] == pytest.approx(ref["prefix_hit_rate"], rel=1e-12)
    assert at.code[2].value.startswith(
        "# no vllm bench serve"
    )  # its prefix_repetition dataset uses each prefix equally: no Zipf weights


def test_a_host_kv_tier_shows_the_hits_per_tier_and_its_flags(capsys):
    levers = {
        "prompt_len": "64",
        "prefix_len": "48",
        "prefixes": "2",
        "offload": "1",
        "offload_policy": "arc",
    }
    at = open_page(TINY | NO_TARGETS | levers)
    assert not at.error and query(at) == TINY | NO_TARGETS | levers
    load = Load(None, 64, 1, concurrency=2, shared_prefix_len=48, num_prefixes=2)
    deployment = Deployment("qwen2.5-7b", "l40s", max_num_seqs=1, kv_offload_gib=1, offload_policy="arc")
    ref = predict(deployment, load).to_dict()
    shown = metrics(at)["Prefix-hit rate"]
    assert (
        shown
        == f"{ref['prefix_hit_rate']:.3f} = {ref['gpu_hit_rate']:.3f} HBM + {ref['host_hit_rate']:.3f} host"
    )
    printed = cli_json(predict_main, at.code[0].value, capsys)  # the printed command carries the tier
    assert (
        printed["deployment"]["vllm_serve_flags"] == "--kv-offloading-size 1 --kv-offloading-backend native"
    )
    assert printed["host_hit_rate"] == pytest.approx(ref["host_hit_rate"], rel=1e-12)


def test_speculation_shows_the_mean_accepted_length_and_its_tpot(capsys):
    levers = {"output_len": "6", "spec_k": "2", "spec_acc": "0.8,0.5", "spec_method": "eagle"}
    at = open_page(TINY | NO_TARGETS | levers)
    assert not at.error
    spec = Speculation(2, (0.8, 0.5), "eagle")
    ref = predict(
        Deployment("qwen2.5-7b", "l40s", max_num_seqs=1, speculation=spec), Load(None, 16, 6, concurrency=2)
    ).to_dict()
    assert metrics(at)["Mean accepted length"] == "2.2 tokens/step"  # 1 + 0.8 + 0.8 x 0.5
    rows = at.dataframe[0].value.set_index(["metric", "percentile"])
    assert rows.loc[("tpot", "p50"), "predicted (ms)"] == pytest.approx(ref["tpot_p50_s"] * 1e3, rel=1e-12)
    printed = cli_json(predict_main, at.code[0].value, capsys)
    assert printed["mean_accepted_len"] == pytest.approx(2.2) and printed["tpot_p50_s"] == pytest.approx(
        ref["tpot_p50_s"], rel=1e-12
    )


def test_disaggregated_shows_how_the_gpus_split_and_the_kv_transfer(capsys):
    levers = {"output_len": "4", "disagg": "1", "p_workers": "1", "d_workers": "2", "kv_link": "nvlink"}
    at = open_page(TINY | NO_TARGETS | levers)
    assert not at.error
    deployment = DisaggDeployment.of("qwen2.5-7b", "l40s", (1, 1), (2, 1), "nvlink", max_num_seqs=1)
    ref = predict_disagg(deployment, Load(None, 16, 4, concurrency=2)).to_dict()
    shown = metrics(at)
    assert shown["Mode"] == "disagg" and shown["Prefill / decode GPUs"] == "1 + 2"
    assert shown["KV transfer per request"] == f"{ref['kv_transfer_s'] * 1e3:.3g} ms"
    assert shown["Output tokens/s per GPU"] == f"{ref['tokens_per_s_per_gpu']:,.0f}"
    rows = at.dataframe[0].value.set_index(["metric", "percentile"])
    assert rows.loc[("ttft", "p99"), "predicted (ms)"] == pytest.approx(ref["ttft_p99_s"] * 1e3, rel=1e-12)
    cli, serve, _ = (c.value for c in at.code)
    assert cli_json(predict_main, cli, capsys)["kv_transfer_s"] == pytest.approx(ref["kv_transfer_s"])
    assert serve.startswith("# disaggregated") and serve.count("\nvllm serve") == 2  # one per pool


def test_every_widget_is_labelled_and_keyed_by_its_field(capsys):
    """The predict form's widgets come from the input groups' declarations (`ui.slo_planner.state.PREDICT_INPUTS`),
    and a bad value's error is the command line's, word for word."""
    at = open_page(TINY | NO_TARGETS | {"turns": "0"})
    shown = {
        w.key: w.label
        for kind in (at.number_input, at.selectbox, at.text_input, at.checkbox, at.slider)
        for w in kind
    }
    assert {f.url_key: f.label for f in PREDICT_INPUTS}.items() <= shown.items()
    [error] = at.error
    argv = ["--model", "qwen2.5-7b", "--gpu", "l40s", "--concurrency", "2", "--prompt-len", "16"]
    capsys.readouterr()
    assert predict_main([*argv, "--output-len", "1", "--turns", "0"]) == 2
    # the command's one line (a worker thread's logging may write to the captured stderr too)
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert error.value == f"Cannot predict: {line.removeprefix('error: ')}"
