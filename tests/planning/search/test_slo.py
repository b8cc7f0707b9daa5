"""The SLO planner: a hand-checked answer, the exact planner behind every feasible configuration, the bounds it
prunes with against the simulator, and the errors for SLOs nothing can meet."""

import contextlib
import json
import pickle
import re
from types import SimpleNamespace

import pytest

from core.errors import InvalidArgumentError, SloInfeasibleError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.commands.dispatch import main
from core.planning.memory.plan import plan
from core.planning.predict.early_stop import (
    SEARCH_SETTINGS,
    Question,
    outranked,
    ratio_floor,
    verdict_decider,
)
from core.planning.predict.prediction import Load, predict
from core.planning.search.slo import (
    Slo,
    SloCandidates,
    SloWorkload,
    config_deployment,
    latency_curve,
    plan_slo,
)
from core.planning.search.slo_candidates import enumerate_candidates
from core.planning.search.slo_eval import (
    BINDINGS,
    analytic_bounds,
    floor_of,
    memory_plan,
    steady_prediction,
    step_model,
    verdict_is_clear,
)
from core.serving.memory_policies import paged
from core.serving.sim_config import SimulatorConfig
from core.serving.simulator import simulate
from core.serving.steady_state import metric_keys

# a small search space: one GPU type and vLLM setting, the layouts and replicas free
SMALL_SPACE = SloCandidates(gpus=("h100-80gb",), max_num_seqs=(1024,), kv_dtypes=("fp8",), max_meeting=2)
STEP = {
    "bandwidth_efficiency": 0.5,
    "flops_efficiency": 0.5,
    "overhead_s": 0.002,
    "per_token_overhead_s": 0.0,
}
LLAMA_8B = MODELS["llama-3.1-8b"]


def _by_hand_prefill(tp: int) -> float:
    """One 1,000-token prefill step of Llama-3.1-8B bf16 on H100s: compute-bound."""
    flops = 2 * 8.03e9 / tp * 1000 + 4 * 32 * 4096 / tp * (1000 * 1001 / 2)
    memory = (8.03e9 * 2 / tp + 2 * 32 * (8 // tp) * 128 * 2 * 1000) / (3.35e12 * 0.5)
    comm = 0.0 if tp == 1 else 64 * 1e-5 + 2 * 32 * 4096 * 2 * 1000 / 450e9
    assert flops / (989e12 * 0.5) > memory
    return 0.002 + flops / (989e12 * 0.5) + comm


def test_a_tiny_search_answers_as_worked_by_hand():
    # requests 100 s apart (never two at once): TTFT is one prefill alone. tp 1 takes 36.6 ms, tp 2 19.5 ms:
    # a 25 ms TTFT target needs tp 2, and replicas do not help one request.
    tp1, tp2 = _by_hand_prefill(1), _by_hand_prefill(2)
    assert tp2 < 0.025 < tp1
    workload = SloWorkload(rate=0.01, prompt_len=1000, output_len=11)
    candidates = SloCandidates(
        gpus=("h100-80gb",),
        max_gpus=2,
        tensor_parallel=(1, 2),
        pipeline_parallel=(1,),
        max_num_seqs=(8,),
        kv_dtypes=("auto",),
        step_time=STEP,
        engine="vllm",  # a profile with no request-side term: TTFT is the prefill alone
    )
    result = plan_slo("llama-3.1-8b", workload, Slo(ttft_p95_s=0.025), candidates)
    assert result.complete and result.num_candidates == 3  # 1 x tp1, 2 x tp1 (2 replicas), 1 x tp2
    one, two_replicas, tp_two = sorted(result.configs, key=lambda c: (c.num_gpus, c.tp))
    assert not one.simulated and one.limiting_metric == "ttft_p95_s" and one.binding == "compute"
    assert one.slo_ratio == pytest.approx(tp1 / 0.025, rel=1e-9)  # pruned by the floor: the prefill alone
    assert not two_replicas.meets_slo and two_replicas.slo_ratio == pytest.approx(tp1 / 0.025, rel=1e-9)
    best = result.best
    assert best is tp_two and (best.num_gpus, best.tp, best.replicas) == (2, 2, 1) and best.meets_slo
    assert best.ttft_p95_s == pytest.approx(tp2, rel=1e-9)
    # TPOT: the mean of the 10 decode steps of batch 1 at contexts 1,000..1,009, bandwidth-bound
    weights, kv = 8.03e9, 2 * 32 * 4 * 128 * 2
    steps = [
        0.002 + (weights + kv * (c + 1)) / (3.35e12 * 0.5) + 64e-5 + 524_288 / 450e9
        for c in range(1000, 1010)
    ]
    assert best.tpot_p95_s == pytest.approx(sum(steps) / 10, rel=1e-9)
    assert best.gpus_per_request_per_s == pytest.approx(2 / 0.01)
    assert best.binding in BINDINGS


@pytest.mark.parametrize(
    ("model", "rate"), [("llama-3.1-8b", 12.0), ("llama-3.1-70b", 4.0), ("llama-3.1-70b", 12.0)]
)
def test_every_feasible_configuration_fits_by_the_exact_planner(model, rate):
    # a TTFT target no prefill meets: every candidate is checked for memory and pruned by its floor, unsimulated
    workload = SloWorkload(rate=rate, prompt_len=2000, output_len=300)
    with pytest.raises(SloInfeasibleError) as info:
        plan_slo(model, workload, Slo(ttft_p99_s=1e-3))
    result = info.value.plan
    assert result.complete and not any(c.simulated for c in result.configs)
    assert result.configs
    spec = MODELS[model]
    for c in result.configs:
        capacity = plan(
            spec,
            GPUS[c.gpu],
            num_gpus=c.tp * c.pp,
            tensor_parallel=c.tp,
            pipeline_parallel=c.pp,
            kv_dtype=c.kv_dtype,
            max_model_len=2300,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=8192,
        )
        assert capacity.fits == c.feasible, c
        if c.feasible:
            assert c.kv_tokens == capacity.kv_tokens
        assert not c.meets_slo or (c.feasible and c.simulated)
        assert c.num_gpus == c.tp * c.pp * c.replicas <= 8 and c.binding in BINDINGS
    keys = [(c.num_gpus, c.cost_proxy_tb_per_s) for c in result.configs]
    assert keys == sorted(keys)


def _simulate_all(step, requests, cand, capacity, cands, max_len):
    """Every request through the simulator (counted paged blocks over the plan's KV tokens), drained."""
    config = SimulatorConfig(
        kv_capacity_tokens=int(capacity.kv_tokens),
        max_num_seqs=cand.max_num_seqs,
        max_num_batched_tokens=cands.max_num_batched_tokens,
        max_seq_len=max_len,
        step_time=step,
        max_snapshots=1,
    )
    return simulate(requests, paged(cands.block_size, counted=True), config)


def test_the_bounds_it_prunes_with_hold_against_the_simulator():
    workload = SloWorkload(rate=1e6, prompt_len=1500, output_len=200, length_spread=0.5)
    cands = SloCandidates(gpus=("h100-80gb", "l40s"), max_gpus=2, max_num_seqs=(32, 256))
    requests = workload.requests(120)
    for cand in list(enumerate_candidates(LLAMA_8B, cands))[:12]:
        capacity = memory_plan(LLAMA_8B, cand, workload, cands)
        if not capacity.fits:
            continue
        step = step_model(LLAMA_8B, cand, STEP)
        bounds = analytic_bounds(
            step, requests, cand.max_num_seqs, cands.max_num_batched_tokens, capacity.kv_tokens
        )
        s = _simulate_all(step, requests, cand, capacity, cands, workload.max_len).summary
        assert s["request_throughput_per_s"] <= bounds.capacity_rps * 1.000001, cand
        for key in (
            "ttft_p50_s",
            "ttft_p95_s",
            "ttft_p99_s",
            "tpot_p50_s",
            "tpot_p95_s",
            "tpot_p99_s",
            "e2e_p95_s",
        ):
            assert s[key] >= floor_of(bounds, key) * 0.999999, (cand, key)
        assert (bounds.ttft_floor_s, bounds.tpot_floor_s) == (
            floor_of(bounds, "ttft_p95_s"),
            floor_of(bounds, "tpot_p95_s"),
        )


def test_a_verdict_is_clear_only_when_every_interval_is():
    targets = {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05}
    met = {"ttft_p99_s": (0.5, 0.9), "tpot_p99_s": (0.03, 0.04)}
    assert verdict_is_clear(met, targets)
    assert not verdict_is_clear(met | {"ttft_p99_s": (0.9, 1.1)}, targets)  # straddles its target
    assert verdict_is_clear(
        met | {"ttft_p99_s": (0.9, 1.1), "tpot_p99_s": (0.06, 0.07)}, targets
    )  # a clear miss
    assert not verdict_is_clear({"ttft_p99_s": (0.5, 0.9)}, targets)  # TPOT unknown: nothing decided


def test_an_estimate_is_outranked_only_when_its_whole_interval_is():
    targets = {"ttft_p95_s": 1.0, "tpot_p95_s": 0.05}
    intervals = {"ttft_p95_s": (0.9, 1.2), "tpot_p95_s": (0.04, 0.06)}
    # the lowest ratio the intervals leave: max(0.9 / 1.0, 0.04 / 0.05) = 0.9
    assert ratio_floor(intervals, targets) == pytest.approx(0.9)
    assert outranked(intervals, targets, beat=0.85)
    assert not outranked(intervals, targets, beat=0.95)  # it may still come below 0.95
    assert not outranked(intervals, targets, beat=None)
    assert ratio_floor({"ttft_p95_s": (0.9, 1.2)}, targets) is None  # TPOT unknown: no floor
    assert not outranked({"ttft_p95_s": (2.0, 3.0)}, targets, beat=0.5)


def test_an_outranked_estimate_is_decided_before_its_batches_are_long_enough():
    targets = {"ttft_p95_s": 1.0, "tpot_p95_s": 0.05}
    estimate = SimpleNamespace(
        long_enough=False,
        metrics={"ttft_p95_s": 0.95, "tpot_p95_s": 0.045},
        intervals={"ttft_p95_s": (0.9, 1.2), "tpot_p95_s": (0.04, 0.06)},
    )
    assert not verdict_decider(targets)(estimate)  # meets by its point, nothing clear
    assert verdict_decider(targets, beat=0.85)(estimate)  # cannot come below 0.85
    assert not verdict_decider(targets, beat=0.95)(estimate)


def test_an_outranked_row_would_not_rank_above_the_best_if_run_to_its_end():
    # Llama-3.1-8B at 12 req/s on H100s: in a group of one GPU count, the tp 2 layout is visited first and
    # meets; a layout of the same GPUs stopped as outranked, simulated again without the stop, still ranks below
    cands = SloCandidates(gpus=("h100-80gb",), max_num_seqs=(1024,), kv_dtypes=("fp8",), max_meeting=3)
    workload, slo = SloWorkload(12.0, 2000, 300), Slo(1.0, 0.05)
    result = plan_slo("llama-3.1-8b", workload, slo, cands)
    stopped = [c for c in result.configs if c.outranked]
    assert stopped, [(c.num_gpus, c.tp, c.replicas, c.slo_ratio) for c in result.configs]
    for row in stopped:
        assert "simulated no further" in row.reason and not row.converged
        peers = [
            c
            for c in result.configs
            if c.meets_slo and not c.outranked and c.num_gpus == row.num_gpus and c is not row
        ]
        beat = min(c.slo_ratio for c in peers)
        full = predict(
            config_deployment("llama-3.1-8b", row, cands),
            Load(rate=12.0, prompt_len=2000, output_len=300),
            settings=SEARCH_SETTINGS,
            decided=verdict_decider(slo.targets()),
            focus=tuple(slo.targets()),
        ).metrics
        assert max(full[key] / target for key, target in slo.targets().items()) > beat


def test_a_reused_simulation_is_the_run_it_stands_for():
    workload = SloWorkload(rate=3.0, prompt_len=500, output_len=100)
    cands = SloCandidates(
        gpus=("h100-80gb",), max_gpus=1, max_num_seqs=(64, 128, 256), kv_dtypes=("auto",), max_meeting=10
    )
    slo = Slo(1.0, 0.05)
    result = plan_slo("llama-3.1-8b", workload, slo, cands)
    reused = [c for c in result.configs if c.reused_simulation]
    assert reused and result.num_reused == len(reused)
    for config in reused:
        cand = next(c for c in enumerate_candidates(LLAMA_8B, cands) if c.max_num_seqs == config.max_num_seqs)
        capacity = memory_plan(LLAMA_8B, cand, workload, cands)
        fresh = steady_prediction(
            cand.deployment(LLAMA_8B, cands),
            workload,
            step_model(LLAMA_8B, cand, result.step_time),
            int(capacity.kv_tokens),
            Question(slo.targets()),
        ).metrics
        assert all(getattr(config, key) == fresh.get(key) for key in metric_keys())


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Slo(ttft_p95_s=-1.0), "must be greater than 0"),
        (lambda: Slo(ttft_p95_s=0.0, tpot_p95_s=0.05), "must be greater than 0"),
        (lambda: Slo(tpot_p95_s=-0.05), "--tpot-p95 \\(seconds\\) must be greater than 0, got -0.05"),
        (lambda: Slo(ttft_p95_s=float("nan")), "must be a finite number, got nan"),
        (lambda: Slo(ttft_p95_s=1.0, tpot_p95_s=float("inf")), "--tpot-p95 .* finite"),
        (lambda: SloWorkload(rate=float("nan"), prompt_len=10, output_len=10), "rate .* finite"),
        (lambda: SloWorkload(rate=-2.0, prompt_len=10, output_len=10), "rate .* greater than 0"),
        (lambda: Slo(), "needs at least one latency target"),
        (lambda: Slo.of({"ttft_p97_s": 1.0}), "unknown target 'ttft_p97_s'"),
        (lambda: SloCandidates(engine="sglang"), "unknown engine 'sglang'; choose one of vllm, trtllm"),
        (lambda: SloWorkload(rate=0.0, prompt_len=10, output_len=10), "rate"),
        (lambda: SloCandidates(gpus=("h900",)), "unknown GPU"),
    ],
)
def test_bad_inputs_are_refused_with_what_is_allowed(build, message):
    with pytest.raises(InvalidArgumentError, match=message) as info:
        build()
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)  # errors travel between job workers


def test_slos_nothing_meets_say_what_and_by_how_much():
    workload = SloWorkload(rate=1000.0, prompt_len=2000, output_len=300)
    with pytest.raises(SloInfeasibleError) as info:
        plan_slo("llama-3.1-8b", workload, Slo(1.0, 0.05))
    error = info.value
    assert error.metric == "rate" and error.target == 1000.0 and error.shortfall > 1
    assert f"{error.shortfall:.2f}x short" in str(error) and error.plan.configs
    assert pickle.loads(pickle.dumps(error)).shortfall == error.shortfall
    with pytest.raises(SloInfeasibleError) as info:
        plan_slo("llama-3.1-8b", SloWorkload(rate=1.0, prompt_len=100, output_len=10), Slo(tpot_p95_s=1e-4))
    assert info.value.metric == "tpot_p95_s" and info.value.best > 1e-4
    assert f"{info.value.shortfall:.2f}x the target" in str(info.value)
    with pytest.raises(SloInfeasibleError) as info:  # TTFT: a 2,000-token prefill takes longer than 1 ms
        plan_slo("llama-3.1-8b", SloWorkload(rate=1.0, prompt_len=2000, output_len=10), Slo(ttft_p95_s=1e-3))
    assert info.value.metric == "ttft_p95_s" and info.value.shortfall > 1 and info.value.plan.configs
    assert "TTFT p95 <= 0.001 s cannot be met" in str(info.value)
    with pytest.raises(SloInfeasibleError) as info:
        plan_slo(
            "llama-3.1-405b",
            SloWorkload(rate=1.0, prompt_len=100, output_len=10),
            Slo(1.0),
            SloCandidates(gpus=("l40s",), max_gpus=2),
        )
    assert info.value.metric == "memory" and "in memory" in str(info.value)


def test_the_cli_prints_the_issue_keys_sorted(capsys):
    argv = [
        "slo",
        "--model",
        "llama-3.1-8b",
        "--rate",
        "12",
        "--prompt-len",
        "2000",
        "--output-len",
        "300",
        "--ttft-p99",
        "1",
        "--tpot-p99",
        "0.05",
        "--engine",
        "vllm",
        "--gpus",
        "h100-80gb",
        "h200-141gb",
        "--max-num-seqs",
        "1024",
        "--kv-dtypes",
        "fp8",
        "--max-meeting",
        "2",
    ]
    assert main(argv) == 0
    body = json.loads(capsys.readouterr().out)
    keys = {
        "gpu",
        "num_gpus",
        "tp",
        "pp",
        "max_num_seqs",
        "throughput_tokens_per_s",
        "meets_slo",
        "binding",
        "converged",
        "engine",
        *metric_keys(),
    }
    assert body["configs"] and all(keys <= set(c) for c in body["configs"])
    order = [(c["num_gpus"], c["cost_proxy_tb_per_s"]) for c in body["configs"]]
    assert order == sorted(order) and body["best"]["meets_slo"] and body["engine"] == "vllm"
    assert body["profile_check"] is None  # the single-model profile states no errors per GPU and model
    assert body["slo"]["ttft_p99_s"] == 1.0 and body["slo"]["tpot_p99_s"] == 0.05
    best = body["best"]
    assert best["ttft_p99_s"] <= 1.0 and best["tpot_p99_s"] <= 0.05 and best["stable"]
    for bad, message in (
        (["--ttft-p95", "-1"], "greater than 0"),
        (["--engine", "sglang"], "unknown engine"),
        (["--num-requests", "200"], "unrecognized arguments: --num-requests"),
        (["--rate", "nan"], "rate .* finite"),
    ):
        with pytest.raises(SystemExit) if bad[0] == "--num-requests" else contextlib.nullcontext() as exits:
            assert main([*argv, *bad]) == 2
        assert exits is None or exits.value.code == 2  # argparse's own refusal: one line, status 2
        err = capsys.readouterr().err
        assert re.search(message, err) and err.count("\n") == 1 and "Traceback" not in err, err
    assert (
        main(
            [
                "slo",
                "--model",
                "llama-3.1-8b",
                "--rate",
                "5000",
                "--prompt-len",
                "2000",
                "--output-len",
                "300",
                "--ttft-p95",
                "1",
            ]
        )
        == 2
    )
    out = capsys.readouterr()
    assert "no candidate can sustain" in out.err and json.loads(out.out)["error"]["metric"] == "rate"


def test_two_draws_of_the_load_give_the_same_answer():
    # the verdicts rest on steady-state intervals, not on one replay's luck: another seed, the same deployment
    answers = []
    for seed in (0, 1):
        best = plan_slo(
            "llama-3.1-8b", SloWorkload(12.0, 2000, 300, seed=seed), Slo(1.0, 0.05), SMALL_SPACE
        ).best
        answers.append((best.num_gpus, best.tp, best.replicas, best.max_num_seqs, best.kv_dtype))
    assert answers[0] == answers[1]


def test_a_row_is_the_deployment_predict_takes():
    workload = SloWorkload(rate=12.0, prompt_len=2000, output_len=300)
    result = plan_slo("llama-3.1-8b", workload, Slo(1.0, 0.05), SMALL_SPACE)
    best = result.best
    deployment = config_deployment("llama-3.1-8b", best, SMALL_SPACE)
    assert (deployment.tp, deployment.replicas, deployment.max_num_seqs, deployment.kv_dtype) == (
        best.tp,
        best.replicas,
        best.max_num_seqs,
        best.kv_dtype,
    )
    assert deployment.memory_plan(workload.max_len).kv_tokens == best.kv_tokens
    cand = next(c for c in enumerate_candidates(LLAMA_8B, SMALL_SPACE) if (c.tp, c.replicas) == (best.tp, 1))
    searched = step_model(LLAMA_8B, cand, result.step_time)
    assert deployment.step_model(SMALL_SPACE.step_time).decode_step_seconds(8, 2100) == pytest.approx(
        searched.decode_step_seconds(8, 2100), rel=1e-12
    )


def test_latency_curve_reevaluates_a_configuration_at_other_rates():
    workload = SloWorkload(rate=12.0, prompt_len=2000, output_len=300)
    result = plan_slo("llama-3.1-8b", workload, Slo(1.0, 0.05), SMALL_SPACE)
    best = result.best
    again, faster, far = latency_curve(
        "llama-3.1-8b", best, workload, Slo(1.0, 0.05), rates=[12.0, 14.0, 500.0], candidates=SMALL_SPACE
    )
    assert (again.ttft_p95_s, again.tpot_p95_s, again.meets_slo) == (best.ttft_p95_s, best.tpot_p95_s, True)
    assert faster.simulated and faster.tpot_p95_s > best.tpot_p95_s  # more load, slower decode steps
    assert (
        not far.simulated and far.limiting_metric == "rate"
    )  # past the throughput bound: the knee is behind
    with pytest.raises(InvalidArgumentError, match="not among"):
        latency_curve("llama-3.1-8b", best, workload, Slo(1.0), [1.0], SloCandidates(gpus=("l40s",)))
    assert pickle.loads(pickle.dumps(result)).best == best  # plans travel between job workers
