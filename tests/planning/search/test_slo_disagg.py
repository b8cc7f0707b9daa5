"""`slo --disagg` (issue 30, item 3): aggregated and disaggregated deployments ranked together, each
disaggregated row saying how its GPUs split and what its KV transfer costs (bytes and seconds worked by hand from
Llama-3.1-8B's config and the link figures of docs/figures.md, as tests/planning/predict/test_disagg.py does), the
search space enumerated by hand, every simulated row above its analytic floors, and without the flag the answer
exactly what plan_slo gives without it. Tiny searches: one H100 type, at most 3 GPUs, one max_num_seqs."""

import contextlib
import io
import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from core.errors import InvalidArgumentError, SloInfeasibleError
from core.planning.catalog.models import get_model
from core.planning.commands.dispatch import main
from core.planning.predict.disagg import predict_disagg
from core.planning.search.slo import (
    Slo,
    SloCandidates,
    SloConfig,
    SloPlan,
    SloWorkload,
    config_deployment,
    plan_slo,
)
from core.planning.search.slo_disagg import DisaggEvaluator, disagg_floors, enumerate_disagg, pool_deciders
from core.planning.search.slo_eval import Bounds
from core.planning.search.slo_infeasible import infeasible_error
from core.serving.steady_state import SteadyStateSettings

# Llama-3.1-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 head size x 2 bytes (bf16) = 131,072 bytes per token
LLAMA_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2
PROMPT, OUTPUT, RATE = 2000, 100, 4.0
WORKLOAD = SloWorkload(RATE, PROMPT, OUTPUT)
SLO = Slo(ttft_p95_s=1.0, tpot_p95_s=0.05)
SMALL = SloCandidates(
    gpus=("h100-80gb",),
    max_gpus=3,
    tensor_parallel=(1, 2),
    pipeline_parallel=(1,),
    max_num_seqs=(64,),
    kv_dtypes=("auto",),
    max_meeting=20,
)
ARGV = [
    "slo",
    "--model",
    "llama-3.1-8b",
    "--rate",
    str(RATE),
    "--prompt-len",
    str(PROMPT),
    "--output-len",
    str(OUTPUT),
    "--gpus",
    "h100-80gb",
    "--max-gpus",
    "3",
    "--tp",
    "1",
    "2",
    "--pp",
    "1",
    "--max-num-seqs",
    "64",
    "--kv-dtypes",
    "auto",
    "--max-meeting",
    "20",
    "--ttft-p95",
    "1",
    "--tpot-p95",
    "0.05",
]


@pytest.fixture(scope="module")
def mixed() -> dict:
    """The CLI's answer with --disagg (the whole space: max_meeting 20 > its 9 candidates)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*ARGV, "--disagg"]) == 0
    return json.loads(out.getvalue())


def test_disagg_ranks_both_kinds_together_and_says_how_gpus_split(mixed):
    rows = mixed["configs"]
    # by hand: aggregated tp 1 x 1, 2, 3 replicas and tp 2 x 1; disaggregated (x prefill of tp_p, y decode of
    # tp_d) with x tp_p + y tp_d <= 3: 1x1+1x1, 2x1+1x1, 1x1+2x1, 1x2+1x1, 1x1+1x2
    assert mixed["num_candidates"] == 9 and mixed["complete"] and len(rows) == 9
    layouts = {
        (c["prefill_workers"], c["prefill_tp"], c["decode_workers"], c["decode_tp"])
        for c in rows
        if c["mode"] == "disagg"
    }
    assert layouts == {(1, 1, 1, 1), (2, 1, 1, 1), (1, 1, 2, 1), (1, 2, 1, 1), (1, 1, 1, 2)}
    assert {c["mode"] for c in rows} == {"agg", "disagg"}
    keys = [(c["num_gpus"], c["cost_proxy_tb_per_s"], not c["meets_slo"], c["slo_ratio"]) for c in rows]
    assert keys == sorted(keys)
    assert mixed["best"] == next(c for c in rows if c["meets_slo"])
    for c in rows:
        if c["mode"] == "agg":
            assert c["prefill_gpus"] is None and c["decode_gpus"] is None and c["kv_transfer_s"] is None
            assert c["num_gpus"] == c["tp"] * c["pp"] * c["replicas"]
        else:
            assert c["prefill_gpus"] + c["decode_gpus"] == c["num_gpus"], c
            assert c["prefill_gpus"] == c["prefill_workers"] * c["prefill_tp"], c
            assert c["decode_gpus"] == c["decode_workers"] * c["decode_tp"], c
            assert c["max_num_seqs"] == 64 and "vllm serve" in c["serve_note"], c
        if c["simulated"]:
            assert c["tokens_per_s_per_gpu"] == pytest.approx(c["throughput_tokens_per_s"] / c["num_gpus"])
            # below capacity every deployment emits what arrives: rate x output tokens (a window's count)
            assert c["throughput_tokens_per_s"] == pytest.approx(RATE * OUTPUT, rel=0.25), c


def test_kv_bytes_and_transfer_time_of_a_row_worked_by_hand(mixed):
    # 2,000 prompt tokens x 131,072 bytes = 262,144,000 bytes; one node: NVLink 4's 900 GB/s bidirectional,
    # 450 GB/s one way, over min(prefill_tp, decode_tp) = 1 link: 0.5825 ms
    moved = PROMPT * LLAMA_KV_PER_TOKEN
    assert moved == 262_144_000
    for c in (c for c in mixed["configs"] if c["mode"] == "disagg"):
        assert c["kv_bytes_per_request"] == moved and c["kv_link"] == "nvlink"
        assert c["kv_transfer_s"] == pytest.approx(262_144_000 / 450e9) == pytest.approx(5.8254e-4, rel=1e-4)


def test_kv_transfer_across_nodes_and_in_fp8_worked_by_hand():
    """Pruned rows carry the transfer too: 8 + 8 GPUs at tp 8 span two nodes, eight ConnectX-7 NICs of 400 Gb/s
    (50 GB/s) each move the shards in parallel; an fp8 cache moves half the bytes. A TPOT no GPU reaches prunes
    every row, so nothing is simulated."""
    cands = SloCandidates(
        gpus=("h100-80gb",),
        max_gpus=16,
        tensor_parallel=(8,),
        pipeline_parallel=(1,),
        max_num_seqs=(64,),
        kv_dtypes=("auto", "fp8"),
        disagg=True,
    )
    with pytest.raises(SloInfeasibleError) as caught:
        plan_slo("llama-3.1-8b", WORKLOAD, Slo(tpot_p95_s=1e-4), cands)
    rows = [c for c in caught.value.plan.configs if c.mode == "disagg"]
    assert len(rows) == 2 and not any(c.simulated for c in rows)
    for c in rows:
        per_token = LLAMA_KV_PER_TOKEN // (2 if c.kv_dtype == "fp8" else 1)
        assert (c.prefill_gpus, c.decode_gpus, c.num_gpus, c.kv_link) == (8, 8, 16, "network")
        assert c.kv_bytes_per_request == PROMPT * per_token
        assert c.kv_transfer_s == pytest.approx(PROMPT * per_token / (8 * 50e9))
        assert c.limiting_metric == "tpot_p95_s" and c.slo_ratio > 1


def test_simulated_rows_are_above_their_analytic_floors(mixed):
    model = get_model("llama-3.1-8b")
    cands = replace(SMALL, disagg=True)
    evaluator = DisaggEvaluator(model, WORKLOAD, SLO, cands, cands.step_overrides(), 500)
    by_layout = {
        (c.prefill_workers, c.prefill_tp, c.decode_workers, c.decode_tp): c
        for c in enumerate_disagg(model, cands)
    }
    checked = 0
    for row in (c for c in mixed["configs"] if c["mode"] == "disagg" and c["simulated"]):
        cand = by_layout[(row["prefill_workers"], row["prefill_tp"], row["decode_workers"], row["decode_tp"])]
        pre, dec = evaluator._pool(cand, "prefill")[2], evaluator._pool(cand, "decode")[2]
        floors = disagg_floors(SLO.targets(), pre, dec, row["kv_transfer_s"])
        for key, floor in floors.items():
            assert row[key] >= floor, (key, row)
        assert row["capacity_requests_per_s"] >= RATE
        checked += 1
    assert checked >= 3


def test_without_disagg_the_answer_is_what_plan_slo_gives_without_it(mixed, capsys):
    plain = plan_slo("llama-3.1-8b", WORKLOAD, SLO, SMALL)
    assert main(ARGV) == 0
    body = json.loads(capsys.readouterr().out)
    expected = plain.to_dict()
    for answer in (body, expected):
        answer.pop("elapsed_s")
    assert body == expected
    assert all(c["mode"] == "agg" for c in body["configs"]) and body["num_candidates"] == 4
    # the aggregated rows of the mixed search are the same evaluations, in the same order
    assert [c for c in mixed["configs"] if c["mode"] == "agg"] == body["configs"]


def test_bad_disagg_input_exits_2_with_one_plain_line(mixed, capsys):
    assert main([*ARGV, "--disagg", "--max-gpus", "1"]) == 2
    with pytest.raises(SystemExit) as stopped:
        main([*ARGV, "--disagg", "yes"])
    assert stopped.value.code == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error:") for line in lines) and out.out == ""
    assert "--disagg needs --max-gpus of at least 2" in lines[0] and "unrecognized arguments: yes" in lines[1]
    with pytest.raises(InvalidArgumentError, match="at least 2 GPUs"):
        SloCandidates(max_gpus=1, disagg=True)
    with pytest.raises(InvalidArgumentError, match="disagg must be True or False"):
        SloCandidates(disagg="yes")
    row = SloConfig(**next(c for c in mixed["configs"] if c["mode"] == "disagg"))
    with pytest.raises(InvalidArgumentError, match="not one Deployment"):
        config_deployment("llama-3.1-8b", row, SMALL)


def test_each_pool_stops_only_on_a_verdict_the_sum_of_its_parts_keeps():
    """TTFT p95 target 1 s, transfer 0.1 s, the decode pool's first-token floor 0.05 s: the prefill pool's
    share is 0.85 s; the decode pool's is what the prefill pool's interval leaves (its low end for a miss, its
    high end for a met)."""
    dec = Bounds(
        0.05,
        0.01,
        10.0,
        "compute",
        {"ttft": np.full(4, 0.05), "tpot": np.full(4, 0.01), "e2e": np.full(4, 0.5)},
    )
    decided, focus = pool_deciders({"ttft_p95_s": 1.0, "tpot_p95_s": 0.02}, dec, 0.1)
    assert focus == {"prefill": ("ttft_p95_s",), "decode": ("ttft_p95_s", "tpot_p95_s")}

    def estimate(**intervals):
        metrics = {key: (low + high) / 2 for key, (low, high) in intervals.items()}
        return SimpleNamespace(long_enough=True, intervals=intervals, metrics=metrics)

    assert decided("prefill", estimate(ttft_p95_s=(0.86, 0.9)), None)  # over its 0.85 s share: a miss
    assert decided("prefill", estimate(ttft_p95_s=(0.5, 0.84)), None)  # under it
    assert not decided("prefill", estimate(ttft_p95_s=(0.8, 0.9)), None)  # straddles it
    prefill = estimate(ttft_p95_s=(0.5, 0.6))  # leaves the decode pool 0.3 to 0.4 s of TTFT
    assert decided("decode", estimate(ttft_p95_s=(0.41, 0.5), tpot_p95_s=(0.01, 0.015)), prefill)  # a miss
    assert decided("decode", estimate(ttft_p95_s=(0.1, 0.3), tpot_p95_s=(0.01, 0.015)), prefill)  # a met
    assert not decided("decode", estimate(ttft_p95_s=(0.1, 0.35), tpot_p95_s=(0.01, 0.015)), prefill)
    assert decided("decode", estimate(ttft_p95_s=(0.1, 0.2), tpot_p95_s=(0.021, 0.03)), prefill)  # TPOT miss


def test_an_unmeetable_slo_names_a_disaggregated_closest_by_its_split(mixed):
    """The error's closest configuration, when disaggregated, is named by its split, not by a tp / pp it lacks."""
    rows = tuple(SloConfig(**c) for c in mixed["configs"] if c["mode"] == "disagg")
    plan = SloPlan(
        "Llama-3.1-8B",
        SLO,
        WORKLOAD,
        replace(SMALL, disagg=True),
        rows,
        len(rows),
        len(rows),
        0,
        0,
        True,
        {},
        0.0,
    )
    closest = min(rows, key=lambda c: c.slo_ratio)
    error = infeasible_error(plan)
    split = (
        f"{closest.num_gpus} x H100 SXM 80GB ({closest.prefill_workers} prefill x tp {closest.prefill_tp} + "
        f"{closest.decode_workers} decode x tp {closest.decode_tp}, max_num_seqs 64"
    )
    assert error.metric == closest.limiting_metric and split in str(error), str(error)
    assert error.best == pytest.approx(getattr(closest, error.metric))


def test_the_decode_pool_bound_holds_an_overloaded_decode_worker():
    """256-token prompts and outputs at 80 req/s on 1 + 1 H100s, max_num_seqs 64: the decode worker cannot keep
    up; the output tokens it serves per second, / 256, stay under decode_pool_bounds' capacity (and near it: the
    bound is a useful one); the prefill pool's bound is far above the decode pool's, so it prunes nothing here."""
    load = SloWorkload(80.0, 256, 256)
    cands = replace(SMALL, max_gpus=2, tensor_parallel=(1,), disagg=True)
    model = get_model("llama-3.1-8b")
    evaluator = DisaggEvaluator(model, load, SLO, cands, cands.step_overrides(), 500)
    (cand,) = enumerate_disagg(model, cands)
    pre, dec = evaluator._pool(cand, "prefill")[2], evaluator._pool(cand, "decode")[2]
    settings = SteadyStateSettings(
        tolerance=0.2, initial_measured=100, max_requests=400, warmup_lifetimes=2.0
    )
    prediction = predict_disagg(cand.deployment(model, cands), load, cands.step_time, settings)
    assert not prediction.decode.stable and prediction.prefill.stable
    served = prediction.decode.metrics["throughput_tokens_per_s"] / 256
    # a window's throughput counts the tokens of every step that ended in it, the one that straddles its start
    # too: a saturated worker's can read up to a step's tokens over the bound (0.1 % here with the cross-model
    # profile, whose full-batch step the bound prices exactly)
    assert 0.8 * dec.capacity_rps <= served <= 1.01 * dec.capacity_rps < pre.capacity_rps / 2
