"""The SLO planner: a hand-checked answer, the exact planner behind every feasible configuration, the bounds it
prunes with against the simulator, and the errors for SLOs nothing can meet."""

import json
import pickle

import pytest

from core.errors import InvalidArgumentError, SloInfeasibleError
from core.planning.cli import main
from core.planning.hardware import GPUS
from core.planning.models import MODELS
from core.planning.plan import plan
from core.planning.slo import Slo, SloCandidates, SloWorkload, latency_curve, plan_slo
from core.planning.slo_candidates import enumerate_candidates
from core.planning.slo_eval import BINDINGS, analytic_bounds, memory_plan, run_simulation, step_model

STEP = {"bandwidth_efficiency": 0.5, "flops_efficiency": 0.5, "overhead_s": 0.002}
LLAMA_8B = MODELS["llama-3.1-8b"]


def _by_hand_prefill(tp: int) -> float:
    """One 1,000-token prefill step of Llama-3.1-8B bf16 on H100s: compute-bound."""
    flops = 2 * 8.03e9 / tp * 1000 + 4 * 32 * 4096 / tp * (1000 * 1001 / 2)
    memory = (8.03e9 * 2 / tp + 2 * 32 * (8 // tp) * 128 * 2 * 1000) / (3.35e12 * 0.5)
    comm = 0.0 if tp == 1 else 64 * 1e-5 + 2 * 32 * 4096 * 2 * 1000 / 450e9
    assert flops / (989e12 * 0.5) > memory
    return 0.002 + flops / (989e12 * 0.5) + comm


def test_a_tiny_search_answers_as_worked_by_hand():
    # 10 requests 100 s apart (never two at once): TTFT is one prefill alone. tp 1 takes 36.6 ms, tp 2 19.5 ms:
    # a 25 ms TTFT target needs tp 2, and replicas do not help one request.
    tp1, tp2 = _by_hand_prefill(1), _by_hand_prefill(2)
    assert tp2 < 0.025 < tp1
    workload = SloWorkload(rate=0.01, prompt_len=1000, output_len=11, num_requests=10)
    candidates = SloCandidates(gpus=("h100-80gb",), max_gpus=2, tensor_parallel=(1, 2), pipeline_parallel=(1,),
                               max_num_seqs=(8,), kv_dtypes=("auto",), step_time=STEP)  # fmt: skip
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
    workload = SloWorkload(rate=rate, prompt_len=2000, output_len=300)
    try:
        result = plan_slo(model, workload, Slo(1.0, 0.05))
    except SloInfeasibleError as error:  # 70B at 12 req/s needs more than 8 GPUs in bf16
        assert error.metric == "rate" and error.shortfall > 1
        result = error.plan
    assert result.configs
    spec = MODELS[model]
    for c in result.configs:
        capacity = plan(spec, GPUS[c.gpu], num_gpus=c.tp * c.pp, tensor_parallel=c.tp, pipeline_parallel=c.pp,
                        kv_dtype=c.kv_dtype, max_model_len=2300, max_num_seqs=c.max_num_seqs,
                        max_num_batched_tokens=8192)  # fmt: skip
        assert capacity.fits == c.feasible, c
        if c.feasible:
            assert c.kv_tokens == capacity.kv_tokens
        assert not c.meets_slo or (c.feasible and c.simulated)
        assert c.num_gpus == c.tp * c.pp * c.replicas <= 8 and c.binding in BINDINGS
    keys = [(c.num_gpus, c.cost_proxy_tb_per_s) for c in result.configs]
    assert keys == sorted(keys)


def test_the_bounds_it_prunes_with_hold_against_the_simulator():
    workload = SloWorkload(rate=1e6, prompt_len=1500, output_len=200, length_spread=0.5, num_requests=120)
    cands = SloCandidates(gpus=("h100-80gb", "l40s"), max_gpus=2, max_num_seqs=(32, 256))
    for cand in list(enumerate_candidates(LLAMA_8B, cands))[:12]:
        capacity = memory_plan(LLAMA_8B, cand, workload, cands)
        if not capacity.fits:
            continue
        step = step_model(LLAMA_8B, cand, STEP)
        requests = workload.requests(workload.rate)
        bounds = analytic_bounds(
            step, requests, cand.max_num_seqs, cands.max_num_batched_tokens, capacity.kv_tokens
        )
        s = run_simulation(step, requests, cand, capacity, cands, workload.max_len).summary
        assert s["request_throughput_per_s"] <= bounds.capacity_rps * 1.000001, cand
        assert (
            s["ttft_p95_s"] >= bounds.ttft_floor_s * 0.999999
            and s["tpot_p95_s"] >= bounds.tpot_floor_s * 0.999999
        )


def test_a_reused_simulation_is_the_run_it_stands_for():
    workload = SloWorkload(rate=3.0, prompt_len=500, output_len=100)
    cands = SloCandidates(gpus=("h100-80gb",), max_gpus=1, max_num_seqs=(64, 128, 256), kv_dtypes=("auto",),
                          max_meeting=10)  # fmt: skip
    result = plan_slo("llama-3.1-8b", workload, Slo(1.0, 0.05), cands)
    reused = [c for c in result.configs if c.reused_simulation]
    assert reused and result.num_reused == len(reused)
    for config in reused:
        cand = next(c for c in enumerate_candidates(LLAMA_8B, cands) if c.max_num_seqs == config.max_num_seqs)
        capacity = memory_plan(LLAMA_8B, cand, workload, cands)
        fresh = run_simulation(step_model(LLAMA_8B, cand, result.step_time), workload.requests(3.0), cand,
                               capacity, cands, workload.max_len).summary  # fmt: skip
        assert (config.ttft_p95_s, config.tpot_p95_s) == (fresh["ttft_p95_s"], fresh["tpot_p95_s"])


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Slo(ttft_p95_s=-1.0), "must be greater than 0"),
        (lambda: Slo(ttft_p95_s=0.0, tpot_p95_s=0.05), "must be greater than 0"),
        (lambda: Slo(tpot_p95_s=-0.05), "tpot_p95_s .* must be greater than 0, got -0.05"),
        (lambda: Slo(ttft_p95_s=float("nan")), "must be a finite number, got nan"),
        (lambda: Slo(ttft_p95_s=1.0, tpot_p95_s=float("inf")), "tpot_p95_s .* finite"),
        (lambda: SloWorkload(rate=float("nan"), prompt_len=10, output_len=10), "rate .* finite"),
        (lambda: SloWorkload(rate=-2.0, prompt_len=10, output_len=10), "rate .* greater than 0"),
        (lambda: Slo(), "needs a TTFT p95 or a TPOT p95"),
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
        plan_slo("llama-3.1-405b", SloWorkload(rate=1.0, prompt_len=100, output_len=10), Slo(1.0),
                 SloCandidates(gpus=("l40s",), max_gpus=2))  # fmt: skip
    assert info.value.metric == "memory" and "in memory" in str(info.value)


def test_the_cli_prints_the_issue_keys_sorted(capsys):
    argv = ["slo", "--model", "llama-3.1-8b", "--rate", "12", "--prompt-len", "2000", "--output-len", "300",
            "--ttft-p95", "1", "--tpot-p95", "0.05", "--gpus", "h100-80gb", "h200-141gb", "l40s"]  # fmt: skip
    assert main(argv) == 0
    body = json.loads(capsys.readouterr().out)
    keys = {"gpu", "num_gpus", "tp", "pp", "max_num_seqs", "ttft_p95_s", "tpot_p95_s", "throughput_tokens_per_s",
            "meets_slo", "binding"}  # fmt: skip
    assert body["configs"] and all(keys <= set(c) for c in body["configs"])
    order = [(c["num_gpus"], c["cost_proxy_tb_per_s"]) for c in body["configs"]]
    assert order == sorted(order) and body["best"]["meets_slo"]
    assert main([*argv[:-6], "--ttft-p95", "-1"]) == 2
    assert "greater than 0" in capsys.readouterr().err
    assert main(["slo", "--model", "llama-3.1-8b", "--rate", "5000", "--prompt-len", "2000", "--output-len",
                 "300", "--ttft-p95", "1"]) == 2  # fmt: skip
    out = capsys.readouterr()
    assert "no candidate can sustain" in out.err and json.loads(out.out)["error"]["metric"] == "rate"


def test_latency_curve_reevaluates_a_configuration_at_other_rates():
    workload = SloWorkload(rate=12.0, prompt_len=2000, output_len=300)
    result = plan_slo("llama-3.1-8b", workload, Slo(1.0, 0.05))
    best = result.best
    again, faster, far = latency_curve(
        "llama-3.1-8b", best, workload, Slo(1.0, 0.05), rates=[12.0, 18.0, 500.0]
    )
    assert (again.ttft_p95_s, again.tpot_p95_s, again.meets_slo) == (best.ttft_p95_s, best.tpot_p95_s, True)
    assert faster.simulated and faster.tpot_p95_s > best.tpot_p95_s  # more load, slower decode steps
    assert (
        not far.simulated and far.limiting_metric == "rate"
    )  # past the throughput bound: the knee is behind
    with pytest.raises(InvalidArgumentError, match="not among"):
        latency_curve("llama-3.1-8b", best, workload, Slo(1.0), [1.0], SloCandidates(gpus=("l40s",)))
    assert pickle.loads(pickle.dumps(result)).best == best  # plans travel between job workers
