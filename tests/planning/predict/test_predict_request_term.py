"""The vLLM profile's request-side TTFT term in `predict` / `max-rate` / `slo` (issue 40; docs/slo.md 2c): the one
definition (`core.serving.latency.request_side_seconds`) worked by hand, predict adding it as the bench's replay
does, a closed loop at fixed lengths run out of phase as the replay runs it, a finite benchmark's mean
(`--benchmark-requests`) as the replay's, and issue 40's check derived from the sample: `predict --concurrency C`
for every row of a held-out MoE model against its measured TTFT and TPOT."""

import json

import numpy as np
import pytest

from core.errors import InvalidArgumentError
from core.planning.commands.predict_cli import predict_main
from core.planning.cost.fits import published_vllm as pv
from core.planning.cost.fits import published_vllm_rows as pvr
from core.planning.cost.fits.engine_profiles import (
    REQUEST_TERM,
    VLLM_CROSS_MODEL_PROFILE,
    engine_request_overhead_s,
    engine_step_defaults,
)
from core.planning.predict.benchmark import benchmark_means
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.planning.search.slo_candidates import SloCandidates
from core.serving.latency import benchmark_mean, request_side_seconds, steps_ended_before
from core.serving.steady_state import SteadyStateSettings
from tests.conftest import ROOT

CROSS = "vllm-cross-model"
FIXED_S = VLLM_CROSS_MODEL_PROFILE[REQUEST_TERM]
# the cross-model profile's step parameters without its request term, on the default engine
WITHOUT_TERM = {k: v for k, v in VLLM_CROSS_MODEL_PROFILE.items() if k != REQUEST_TERM}
# predict prices today's vLLM, whose MoE kernels compute the routed rows only; the replay of a vLLM 0.12 row prices
# the padded kernel it ran (docs/slo.md 2c, the eighth stage), so like for like the replay's experts are routed too
TODAYS_KERNELS = VLLM_CROSS_MODEL_PROFILE | pv.ROUTED_EXPERTS


def test_request_side_seconds_by_hand():
    """Steps of 10, 20, 30 ms ending at 10, 30, 60 ms. A closed-loop request arriving at 0 meets an idle engine
    (the fixed time alone), one arriving at 30 ms (the end of the second step) waits for a step as long as that
    one (20 ms); an open-loop arrival waits in the simulator already: the fixed time alone."""
    ends, durations = np.array([0.01, 0.03, 0.06]), np.array([0.01, 0.02, 0.03])
    arrival = steps_ended_before(ends, np.array([0.0, 0.03, 0.06, 0.045]))
    assert arrival.tolist() == [0, 2, 3, 2]
    closed = request_side_seconds(0.005, durations, arrival)
    assert closed == pytest.approx([0.005, 0.025, 0.035, 0.025], abs=1e-15)
    assert request_side_seconds(0.005, durations, arrival, closed_loop=False) == pytest.approx([0.005] * 4)


def test_the_cross_model_profile_is_the_saved_fit_and_its_request_term_is_apart():
    saved = json.loads((ROOT / "bench" / "results" / "slo-published.json").read_text())
    # rel 1e-7: the fit's last digits follow the CPU's vectorised sums (the stored values fitted on Zen 4 with
    # AVX-512, the saved run on Zen 3 with AVX2: at most 3.3e-9 apart, the request term)
    assert saved["fitted"] == pytest.approx(VLLM_CROSS_MODEL_PROFILE, rel=1e-7)
    assert engine_step_defaults(CROSS) == WITHOUT_TERM
    assert engine_request_overhead_s(CROSS) == FIXED_S and engine_request_overhead_s("vllm") is None
    with pytest.raises(InvalidArgumentError, match=REQUEST_TERM):
        SloCandidates(step_time={REQUEST_TERM: 0.01})
    with pytest.raises(InvalidArgumentError, match=REQUEST_TERM):
        Deployment("llama-3.1-8b", "h100-80gb").request_overhead_s({REQUEST_TERM: -1.0})


def test_predict_adds_the_fixed_time_and_the_step_in_flight_by_hand():
    """One client, 16 prompt / 4 output tokens on 8 x H100 (as the bench's own hand-worked row): each request is a
    16-token prefill step and 3 decodes at contexts 16, 17, 18; in the steady state every request arrives at the
    end of the previous one's last decode, so its TTFT is the prefill + the fixed time + that decode. TPOT does not
    move. A Poisson load's TTFT gains the fixed time alone, on the same simulated steps."""
    deployment = Deployment("llama-3.1-70b", "h100-80gb", tp=8, weight_dtype="fp8", engine=CROSS)
    step = deployment.step_model()
    prefill = step.step_seconds(16, 0, 16 * 17 / 2)
    last_decode = step.step_seconds(1, 18, 19)
    closed = predict(deployment, Load(None, 16, 4, concurrency=1)).metrics
    assert closed["mean_ttft_s"] == pytest.approx(prefill + FIXED_S + last_decode, rel=1e-9)
    assert closed["mean_tpot_s"] == pytest.approx(
        (sum(step.step_seconds(1, c, c + 1) for c in (16, 17, 18))) / 3, rel=1e-9
    )
    # the single-model profile: no request term
    plain = Deployment("llama-3.1-70b", "h100-80gb", tp=8, weight_dtype="fp8", engine="vllm")
    assert plain.step_model(WITHOUT_TERM) == step
    load = Load(20.0, 64, 8, seed=1)
    with_term = predict(deployment, load).metrics
    without = predict(plain, load, step_time=WITHOUT_TERM).metrics
    assert with_term["mean_ttft_s"] == pytest.approx(without["mean_ttft_s"] + FIXED_S, rel=1e-9)
    assert with_term["mean_tpot_s"] == without["mean_tpot_s"]


def _qwen_row(tp, isl, osl, clients):
    key = ("qwen3-235b-a22b", tp, isl, osl, clients)
    return next(r for r in pvr.ROWS if (r.model, r.tp, r.isl, r.osl, r.concurrency) == key and r.ep == 1)


def _deployment(row, at_release: bool = False) -> Deployment:
    """The row's deployment as predict takes it; at_release: its checkpoint (`pvr.FP8_CHECKPOINTS`) at its vLLM
    release (--vllm-version), else the model's preset on today's vLLM."""
    if not at_release:
        return Deployment(row.model, row.gpu, tp=row.tp, weight_dtype=row.weight_dtype, engine=CROSS)
    checkpoint = pvr.FP8_CHECKPOINTS.get(row.model, row.model)
    return Deployment(
        checkpoint,
        row.gpu,
        tp=row.tp,
        weight_dtype=row.weight_dtype,
        engine=CROSS,
        vllm_version=row.backend_version,
    )


def test_predict_concurrency_answers_the_replays_steady_state(capsys):
    """`python -m core.planning predict --concurrency C` on a sample row answers what the bench's replay of that
    row's steady phase answers (clients out of phase, the same request term): Qwen3-235B-A22B on 2 x H200,
    1,000 / 100 tokens, 16 clients. The replay's benchmark mean adds its synchronized first round on top."""
    row = _qwen_row(2, 1000, 100, 16)
    argv = ["--model", row.model, "--gpu", row.gpu, "--tp", "2", "--weight-dtype", "fp8", "--engine", CROSS]
    argv += ["--concurrency", "16", "--prompt-len", "1000", "--output-len", "100"]
    assert predict_main(argv) == 0
    answer = json.loads(capsys.readouterr().out)
    ttft, tpot = pv.replay(row).phase_latencies(TODAYS_KERNELS, "steady")
    assert answer["mean_ttft_s"] == pytest.approx(ttft, rel=0.03)
    assert answer["mean_tpot_s"] == pytest.approx(tpot, rel=0.01)
    assert answer["deployment"]["engine"] == CROSS


def test_predict_at_the_rows_vllm_release_answers_the_replay_with_its_kernel(capsys):
    """`predict --model qwen3-235b-a22b-fp8 --vllm-version 0.12.0` prices what the bench's replay of the row prices
    (vLLM 0.12's padded kernel, the profile as fitted): the same steady state within the replay's 3 % / 1 %, its
    TPOT above today's vLLM's (the padding's FLOPs), and the release echoed with the deployment."""
    row = _qwen_row(2, 1000, 100, 16)
    argv = ["--model", "qwen3-235b-a22b-fp8", "--gpu", row.gpu, "--tp", "2", "--engine", CROSS]
    argv += ["--concurrency", "16", "--prompt-len", "1000", "--output-len", "100", "--vllm-version", "0.12.0"]
    assert predict_main(argv) == 0
    answer = json.loads(capsys.readouterr().out)
    ttft, tpot = pv.replay(row).phase_latencies(VLLM_CROSS_MODEL_PROFILE, "steady")
    assert answer["mean_ttft_s"] == pytest.approx(ttft, rel=0.03)
    assert answer["mean_tpot_s"] == pytest.approx(tpot, rel=0.01)
    assert answer["deployment"]["vllm_version"] == "0.12.0"
    assert tpot > 1.2 * pv.replay(row).phase_latencies(TODAYS_KERNELS, "steady")[1]
    assert predict_main([*argv[:-1], "0.12.x"]) == 2
    assert "--vllm-version takes a vLLM release" in capsys.readouterr().err
    assert predict_main([*argv, "--engine", "trtllm"]) == 2
    assert "not vLLM's profile" in capsys.readouterr().err


# issue 40's bound: predict --concurrency C within 25 % of the measured TTFT and TPOT on average
SAMPLE_BOUND = 0.25
# enough for a mean of a fixed-length closed loop (its requests repeat; the defaults give the same means to 3
# digits in ~5x the time)
CHEAP = SteadyStateSettings(
    initial_measured=60, num_batches=5, warmup_lifetimes=1.0, tolerance=0.5, batch_lifetimes=0.1
)


def test_benchmark_mean_by_hand():
    """A benchmark of 10 rounds whose synchronized first round averages 2 s and whose steady state 0.5 s reports
    (2 + 9 x 0.5) / 10 = 0.65 s; one round is the first round alone; fewer than one round is refused."""
    assert benchmark_mean(2.0, 0.5, 10) == pytest.approx(0.65, rel=1e-15)
    assert benchmark_mean(2.0, 0.5, 1) == 2.0
    with pytest.raises(InvalidArgumentError, match="at least one round"):
        benchmark_mean(2.0, 0.5, 0.5)


def test_predict_benchmark_requests_answers_the_replays_benchmark_mean(capsys):
    """`predict --concurrency C --benchmark-requests N` adds what a benchmark of N requests reports: its first
    round (all C clients at once) is the replay's "first" phase to the last digit (the same simulation), its mean
    the replay's benchmark mean within the steady state's 3 % (Qwen3-235B-A22B on 2 x H200, 1,000 / 100 tokens,
    16 clients, 10 rounds). The steady state's keys do not move."""
    row = _qwen_row(2, 1000, 100, 16)
    argv = ["--model", row.model, "--gpu", row.gpu, "--tp", "2", "--weight-dtype", "fp8", "--engine", CROSS]
    argv += ["--concurrency", "16", "--prompt-len", "1000", "--output-len", "100"]
    assert predict_main(argv) == 0
    steady = json.loads(capsys.readouterr().out)
    assert "benchmark" not in steady
    assert predict_main([*argv, "--benchmark-requests", str(pv.BENCHMARK_ROUNDS * 16)]) == 0
    answer = json.loads(capsys.readouterr().out)
    bench = answer.pop("benchmark")
    assert answer == steady
    assert (bench["requests"], bench["rounds"]) == (160, 10.0)
    first = pv.replay(row).phase_latencies(TODAYS_KERNELS, "first")
    assert (bench["first_round_mean_ttft_s"], bench["first_round_mean_tpot_s"]) == pytest.approx(
        first, rel=1e-9
    )
    ttft, tpot = pv.replay(row).latencies(TODAYS_KERNELS)
    assert bench["mean_ttft_s"] == pytest.approx(ttft, rel=0.03)
    assert bench["mean_tpot_s"] == pytest.approx(tpot, rel=0.01)
    assert bench["mean_ttft_s"] == pytest.approx(
        (first[0] + 9 * steady["mean_ttft_s"]) / 10, rel=1e-12
    )  # the first round weighs 1 / 10


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rate", "2", "--benchmark-requests", "40"], "needs a closed loop"),
        (["--concurrency", "16", "--benchmark-requests", "8"], "at least the clients"),
        (["--concurrency", "16", "--benchmark-requests", "0"], "--benchmark-requests"),
        (["--concurrency", "4", "--turns", "2", "--benchmark-requests", "40"], "one-turn requests"),
    ],
)
def test_benchmark_requests_refusals(flags, message, capsys):
    argv = [
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--prompt-len",
        "100",
        "--output-len",
        "10",
        *flags,
    ]
    assert predict_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_benchmark_requests_is_not_for_a_disaggregated_deployment(capsys):
    argv = ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--prompt-len", "100", "--output-len", "10"]
    argv += ["--disagg", "--concurrency", "4", "--benchmark-requests", "40"]
    assert predict_main(argv) == 2
    assert "not --disagg" in capsys.readouterr().err


# issue 40's check derived from the sample: predict --concurrency C for every row of one held-out model within 25 %
# of the measured TTFT and TPOT on average. The rows are means of finite benchmarks (aiconfigurator's deployment
# guide: 10 x C requests, `pv.BENCHMARK_ROUNDS`), so the like-for-like answer is predict's benchmark mean of
# 10 x C requests (`--benchmark-requests`); the steady state alone leaves out the synchronized first round.
SAMPLE_BOUND = 0.25
# enough for a mean of a fixed-length closed loop (its requests repeat; the defaults give the same means to 3
# digits in ~5x the time)
CHEAP = SteadyStateSettings(
    initial_measured=60, num_batches=5, warmup_lifetimes=1.0, tolerance=0.5, batch_lifetimes=0.1
)


def _sample_errors(model: str, at_release: bool = False) -> tuple[float, float, float, float]:
    """(benchmark mean |error| of TTFT, of TPOT, steady-state mean |error| of TTFT, of TPOT) of predict
    --concurrency C on every held-out row of `model` (at_release: `_deployment`'s)."""
    rows = [r for r in pvr.ROWS if r.model == model and pvr.row_set(r) == "held out"]
    errors, predicted = [], {}
    for row in rows:
        # a configuration measured several times (Kimi-K2.5's 15, three times each) is predicted once: the
        # prediction is seeded, so each copy would get the same numbers
        key = (row.gpu, row.tp, row.weight_dtype, row.isl, row.osl, row.concurrency)
        if key not in predicted:
            load = Load(None, row.isl, row.osl, concurrency=row.concurrency)
            prediction = predict(_deployment(row, at_release), load, settings=CHEAP)
            bench = benchmark_means(prediction, pv.BENCHMARK_ROUNDS * row.concurrency)
            predicted[key] = (bench, prediction.metrics)
        bench, steady = predicted[key]
        errors.append(
            [
                abs(bench["mean_ttft_s"] / row.ttft_s - 1),
                abs(bench["mean_tpot_s"] / row.tpot_s - 1),
                abs(steady["mean_ttft_s"] / row.ttft_s - 1),
                abs(steady["mean_tpot_s"] / row.tpot_s - 1),
            ]
        )
    return tuple(np.mean(errors, axis=0))


def test_predict_concurrency_on_every_row_of_the_held_out_moe_model():
    """Kimi-K2.5's 45 held-out rows (MLA, int4 experts; never fitted), the seventh stage's profile: the benchmark
    mean of 10 x C requests within 25 % on average, TTFT 0.211, TPOT 0.076 (docs/slo.md 2c); the steady state
    alone under-predicts TTFT (0.507, TPOT 0.077: the synchronized round is a tenth of the requests and most of
    their wait)."""
    ttft, tpot, steady_ttft, steady_tpot = _sample_errors("kimi-k2.5")
    assert ttft <= SAMPLE_BOUND and tpot <= SAMPLE_BOUND
    assert (ttft, tpot) == pytest.approx((0.211, 0.076), abs=0.005)
    assert (steady_ttft, steady_tpot) == pytest.approx((0.507, 0.077), abs=0.005)


def test_predict_concurrency_on_every_row_of_qwen3_235b_at_the_rows_vllm_release():
    """Qwen3-235B-A22B's 32 held-out rows (vLLM 0.12, Qwen/Qwen3-235B-A22B-FP8 on H200) predicted as a user would
    ask for them: `predict --model qwen3-235b-a22b-fp8 --vllm-version 0.12.0`, which prices vLLM 0.12's padded
    DeepGEMM kernel (docs/slo.md 2c, the eighth stage): the benchmark mean within 25 % on average, TTFT 0.169,
    TPOT 0.120. Priced as today's vLLM (no --vllm-version, routed experts) the TPOT misses by 0.329: the rows'
    TP 2 decode (~52 ms whatever the batch) is the padded kernel's."""
    ttft, tpot, _, _ = _sample_errors("qwen3-235b-a22b", at_release=True)
    assert ttft <= SAMPLE_BOUND and tpot <= SAMPLE_BOUND
    assert (ttft, tpot) == pytest.approx((0.169, 0.120), abs=0.005)
    todays = _sample_errors("qwen3-235b-a22b")
    assert todays[0] == pytest.approx(0.227, abs=0.005) and todays[1] == pytest.approx(0.329, abs=0.005)
