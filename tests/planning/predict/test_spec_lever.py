"""Speculative decoding in the steady-state predictor (`core.planning.cost.speculative`): the expected accepted length
worked by hand, a speculative step priced as K + 1 tokens per sequence against the roofline, the gain at batch 1
(memory-bound: about the accepted length) against a compute-bound batch (none), and in simulation TPOT cut at
low load, zero acceptance costing, the gain shrinking as the rate rises; bad flags exit 2 with one line."""

import json

import numpy as np
import pytest

from core.errors import InvalidArgumentError
from core.planning.commands.predict_cli import predict_main
from core.planning.cost.speculative import Speculation, SpeculativeStepTime
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.steady_state import SteadyStateSettings

SMALL = SteadyStateSettings(tolerance=0.2, initial_measured=100, max_requests=400, warmup_lifetimes=2.0)
HIGH = (0.9, 0.8, 0.7)
MID = (0.7, 0.6, 0.5)


def _deploy(spec=None):
    return Deployment("llama-3.1-8b", "h100-80gb", speculation=spec)


def test_mean_accepted_len_is_one_plus_the_chained_acceptances():
    # 1 + 0.9 + 0.9 x 0.8 + 0.9 x 0.8 x 0.7 = 1 + 0.9 + 0.72 + 0.504
    assert Speculation(3, HIGH).mean_accepted_len == pytest.approx(3.124)
    assert Speculation(2, (0.0, 1.0)).mean_accepted_len == 1.0  # nothing after a rejection counts
    assert Speculation(4, (1, 1, 1, 1)).mean_accepted_len == 5.0
    # Leviathan et al. (ICML 2023), every position accepted with the same a: (1 - a^(K+1)) / (1 - a)
    assert Speculation(4, (0.6,) * 4).mean_accepted_len == pytest.approx((1 - 0.6**5) / (1 - 0.6))


def test_vllm_per_position_rates_are_the_chained_acceptances():
    """vLLM's accepted_tokens_per_pos / drafts counts position i only after 1..i-1: r_i = a_1 ... a_i, and the
    mean acceptance length is 1 + accepted / drafts = 1 + sum of r_i."""
    spec = Speculation.from_per_position((0.9, 0.72, 0.504))
    assert spec.acceptance == pytest.approx(HIGH)
    assert spec.mean_accepted_len == pytest.approx(1 + 0.9 + 0.72 + 0.504)
    assert Speculation.from_per_position((0.5, 0.0, 0.0)).acceptance == (0.5, 0.0, 0.0)


def test_a_speculative_step_prices_k_plus_1_tokens_per_sequence():
    """ngram (no draft cost): d sequences of context c verify d (K + 1) tokens, read the d c context keys once,
    attend (K + 1) c + d (K + 1)(K + 2) / 2 pairs, sample d (K + 1) logits; per emitted token / 3.124."""
    target = _deploy().step_model()
    cost = SpeculativeStepTime(target, Speculation(3, HIGH))
    d, c = 8, 8 * 1000
    whole = target.step_seconds(d * 4, c, 4 * c + d * 4 * 5 / 2, output_tokens=d * 4)
    assert float(cost.step_time(d, c)) == pytest.approx(whole / 3.124, rel=1e-12)
    assert cost.decode_step_seconds(d, 1000) == pytest.approx(whole / 3.124, rel=1e-12)


def test_decode_runs_and_single_steps_price_the_passes_bit_for_bit():
    """EAGLE's K draft passes and the verify pass, priced on the simulator's decode-run arrays (the draft passes
    as rows of one array) and on one step's numbers (Python floats), equal the passes priced one by one with
    `StepTimeModel.breakdown` (numpy float64, the reference) and summed in order."""
    from core.planning.catalog.models import MODELS
    from core.planning.cost.speculative import eagle_head_model
    from core.sched.step_load import StepLoad

    target = _deploy().step_model()
    cost = SpeculativeStepTime(
        target, Speculation(3, MID, "eagle"), eagle_head_model(target, MODELS["llama-3.1-8b"])
    )

    def reference(d, c):
        verify = target.breakdown(d * 4, c, 4 * c + d * 4 * 5 / 2, d * 4).total_s
        draft = cost.draft.breakdown(d, c, c + d).total_s
        for i in (1, 2):
            draft = draft + cost.draft.breakdown(d, c + i * d, c + (i + 1) * d).total_s
        return (verify + draft) / cost.spec.mean_accepted_len

    d = 7
    reads = 20_613 + d * np.arange(40, dtype=np.float64)
    got = cost.step_time(d, reads, reads + d)
    assert np.array_equal(got, np.array([reference(d, float(c)) for c in reads]))
    for c in (0, 1, 20_613, 3_999_999):
        load = StepLoad(d, 0, c, c + d, d, c)
        assert cost.step_load_seconds(load) == float(reference(d, c))


def test_speculation_gains_at_batch_one_and_gives_back_when_compute_bound():
    """At one sequence a step reads the weights whatever its 4 tokens: the gain per token is ~ the accepted
    length. At 256 sequences x 4 verified tokens of 500-token contexts the step is compute-bound: 4x the FLOPs
    for 2.33 tokens, a loss (0.72 with either vLLM profile; at 1,000-token contexts the plain step's K/V reads
    hide most of the extra FLOPs: 1.02 with the cross-model profile, 0.90 with the single-model one)."""
    target = _deploy().step_model()
    cost = SpeculativeStepTime(target, Speculation(3, MID))
    one = target.decode_step_seconds(1, 1000) / cost.decode_step_seconds(1, 1000)
    assert one == pytest.approx(Speculation(3, MID).mean_accepted_len, rel=0.05)
    many = target.decode_step_seconds(256, 500) / cost.decode_step_seconds(256, 500)
    assert many < 0.8 < 1.0 < one


def test_high_acceptance_cuts_tpot_at_low_load():
    plain = predict(_deploy(), Load(0.5, 512, 128), settings=SMALL)
    fast = predict(_deploy(Speculation(3, HIGH, "eagle")), Load(0.5, 512, 128), settings=SMALL)
    assert fast.metrics["tpot_p50_s"] < plain.metrics["tpot_p50_s"] / 2
    assert fast.to_dict()["mean_accepted_len"] == pytest.approx(3.124)
    assert plain.to_dict()["mean_accepted_len"] is None
    # the EAGLE head's one layer of weights and K/V, and 256 x 3 lookahead slots, come out of the cache
    assert fast.kv_tokens < plain.kv_tokens - 256 * 3


def test_zero_acceptance_costs():
    plain = predict(_deploy(), Load(0.5, 512, 128), settings=SMALL)
    for spec in (Speculation(3, (0, 0, 0), "eagle"), Speculation(2, (0, 0), "draft-model", "llama-2-7b")):
        slow = predict(_deploy(spec), Load(0.5, 512, 128), settings=SMALL)
        assert slow.metrics["tpot_p50_s"] > plain.metrics["tpot_p50_s"], spec.method


def test_the_gain_shrinks_as_the_rate_rises():
    spec = Speculation(3, MID, "eagle")
    gains = []
    for rate in (0.5, 20.0):  # 20 req/s: ~21 sequences a step, where 4 verified tokens each start to cost
        plain = predict(_deploy(), Load(rate, 512, 128), settings=SMALL)
        fast = predict(_deploy(spec), Load(rate, 512, 128), settings=SMALL)
        assert plain.stable and fast.stable
        gains.append(plain.metrics["tpot_p50_s"] / fast.metrics["tpot_p50_s"])
    assert gains[0] > 1.8 and gains[1] < 0.9 * gains[0]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ((3, (0.9, 1.2, 0.5)), "--spec-acceptance"),
        ((3, (0.9, -0.1, 0.5)), "--spec-acceptance"),
        ((3, (0.9, 0.5)), "--spec-acceptance"),
        ((0, ()), "--spec-tokens"),
        ((2, (0.5, 0.5), "medusa"), "--spec-method"),
        ((2, (0.5, 0.5), "draft-model"), "--draft-model"),
        ((2, (0.5, 0.5), "ngram", "llama-2-7b"), "--draft-model"),
    ],
)
def test_bad_speculation_names_the_flag(args, flag):
    with pytest.raises(InvalidArgumentError, match=flag):
        Speculation(*args)


@pytest.mark.parametrize(
    "bad",
    [
        ["--spec-tokens", "2", "--spec-acceptance", "0.5,1.5"],
        ["--spec-tokens", "2", "--spec-acceptance", "0.5,x"],
        ["--spec-tokens", "2"],
        ["--spec-acceptance", "0.5"],
        [
            "--spec-tokens",
            "1",
            "--spec-acceptance",
            "0.5",
            "--spec-method",
            "draft-model",
            "--draft-model",
            "x",
        ],
    ],
)
def test_cli_bad_speculation_exits_2_with_one_line(bad, capsys):
    base = ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--prompt-len", "100", "--output-len", "10"]
    assert predict_main([*base, "--rate", "1", *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err


def test_cli_prints_the_levers(capsys):
    args = [
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--prompt-len",
        "600",
        "--output-len",
        "32",
        "--rate",
        "1",
        "--shared-prefix-len",
        "512",
        "--num-prefixes",
        "2",
        "--turns",
        "2",
        "--turn-gap",
        "3",
        "--spec-tokens",
        "2",
        "--spec-acceptance",
        "0.8,0.5",
        "--spec-method",
        "eagle",
    ]
    assert predict_main(args) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["mean_accepted_len"] == pytest.approx(1 + 0.8 + 0.4)
    assert 0.5 < body["prefix_hit_rate"] < 1.0
    assert body["load"]["turns"] == 2 and body["deployment"]["spec_method"] == "eagle"
