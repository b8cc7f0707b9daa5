"""The SLO search with a router in front of the replicas (issue 39, build item 2): a deployment of several
replicas is evaluated as a routed fleet (`core.serving.fleet`) under each policy asked, and the (deployment,
routing) pairs are ranked cheapest first, the better metric breaking ties. Checked against `predict` run on the
same deployment and policy (its own path from a `Deployment` to a fleet), and one replica (no router) gives the
same rows under every policy."""

import json

import pytest

from core.errors import RoutingError
from core.planning.commands.dispatch import main
from core.planning.predict.early_stop import SEARCH_SETTINGS, verdict_decider
from core.planning.predict.prediction import Load, predict
from core.planning.search.slo import Slo, SloCandidates, SloWorkload, config_deployment, plan_slo
from core.serving.router import ROUTING_POLICIES

MODEL = "llama-3.1-8b"


def _space(max_gpus: int, routing) -> SloCandidates:
    return SloCandidates(
        gpus=("h100-80gb",),
        max_gpus=max_gpus,
        tensor_parallel=(1,),
        pipeline_parallel=(1,),
        max_num_seqs=(256,),
        kv_dtypes=("auto",),
        routing=routing,
    )


def test_one_replica_gives_the_same_rows_under_every_routing():
    workload = SloWorkload(rate=2.0, prompt_len=1000, output_len=50, length_spread=0.5, seed=0)
    rows = []
    for policy in ROUTING_POLICIES:
        result = plan_slo(MODEL, workload, Slo(ttft_p99_s=0.5), _space(1, (policy,)))
        rows.append([c.to_dict() for c in result.configs])
    assert all(row == rows[0] for row in rows)
    assert rows[0] and all(c["replicas"] == 1 and c["routing"] is None for c in rows[0])
    assert all(c["routing_note"] is None for c in rows[0])


def test_least_loaded_beats_random_on_the_ttft_tail_as_predict_says():
    """2 x H100 at 18 req/s of widely spread prompts (200-3,800 tokens): random routing piles long prompts on one
    replica now and then, least-loaded sends each to the shorter queue, so its TTFT p99 is well under random's.
    The search ranks least-loaded first (same GPUs and cost, it meets the target, random misses it), and each
    row is what `predict` gives the same deployment behind the same router."""
    workload = SloWorkload(rate=18.0, prompt_len=2000, output_len=50, length_spread=0.9, seed=0)
    slo = Slo(ttft_p99_s=0.6)
    cands = _space(2, ("random", "least-loaded"))
    result = plan_slo(MODEL, workload, slo, cands)
    routed = [c for c in result.configs if c.replicas == 2]
    assert [c.routing for c in routed] == ["least-loaded", "random"]
    best, rand = routed
    assert result.best == best and best.meets_slo and not rand.meets_slo
    assert best.ttft_p99_s < 0.6 < rand.ttft_p99_s
    assert "plain load balancer" in best.routing_note and "load-aware" in best.routing_note
    for row in routed:
        deployment = config_deployment(MODEL, row, cands)
        assert deployment.routing == row.routing and deployment.replicas == 2
        load = Load(rate=18.0, prompt_len=2000, output_len=50, length_spread=0.9, seed=0)
        p = predict(
            deployment,
            load,
            settings=SEARCH_SETTINGS,
            decided=verdict_decider(slo.targets()),
            focus=tuple(slo.targets()),
        )
        assert p.deployment.flags()["routing"] == row.routing
        assert p.metrics["ttft_p99_s"] == pytest.approx(row.ttft_p99_s, rel=1e-9)
        # the fleet's throughput, not replicas x a replica's: the offered output tokens/s when it keeps up
        assert row.throughput_tokens_per_s == pytest.approx(p.metrics["throughput_tokens_per_s"], rel=1e-9)
        assert row.throughput_tokens_per_s == pytest.approx(18.0 * 50, rel=0.1)
        assert len(p.per_replica) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--routing", "sticky"], "unknown routing policy 'sticky'; choose one of round-robin, random"),
        (["--routing-candidates", "round-robin,bogus"], "unknown routing policy 'bogus'"),
        (["--routing-candidates", "round-robin,,random"], "--routing-candidates must be comma-separated"),
        (["--routing", "random", "--routing-candidates", "random"], "not both"),
    ],
)
def test_the_cli_refuses_bad_routing_with_one_line(capsys, argv, message):
    code = main(
        [
            "slo",
            "--model",
            MODEL,
            "--rate",
            "2",
            "--prompt-len",
            "1000",
            "--output-len",
            "50",
            "--ttft-p99",
            "0.5",
            "--gpus",
            "h100-80gb",
            "--max-gpus",
            "2",
            *argv,
        ]
    )
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


@pytest.mark.parametrize("routing", [("least-loaded", "nope"), "nope", (None,)])
def test_bad_routing_candidates_raise_a_routing_error(routing):
    with pytest.raises(RoutingError) as info:
        SloCandidates(routing=routing)
    assert "round-robin" in str(info.value)


def test_the_cli_rows_carry_the_routing_asked(capsys):
    code = main(
        [
            "slo",
            "--model",
            MODEL,
            "--rate",
            "8",
            "--prompt-len",
            "2000",
            "--output-len",
            "50",
            "--length-spread",
            "0.9",
            "--ttft-p99",
            "0.6",
            "--gpus",
            "h100-80gb",
            "--max-gpus",
            "2",
            "--tp",
            "1",
            "--pp",
            "1",
            "--max-num-seqs",
            "256",
            "--kv-dtypes",
            "auto",
            "--routing",
            "least-loaded",
        ]
    )
    assert code == 0
    body = json.loads(capsys.readouterr().out)
    assert [(c["replicas"], c["routing"]) for c in body["configs"]] == [(1, None), (2, "least-loaded")]
    assert body["best"]["routing"] == "least-loaded" and body["best"]["meets_slo"]
    note = body["best"]["routing_note"]
    assert (
        note.startswith("2 `vllm serve` replicas behind a load-aware router")
        and "plain load balancer" in note
    )
    assert SloCandidates(routing="random").routing == ("random",)


def test_without_routing_the_replicas_split_the_load_as_before():
    """No --routing: every row of several replicas is one replica at 1 / N of the load (no router, no fleet)."""
    plan = plan_slo(MODEL, SloWorkload(8.0, 2000, 50, 0.9, 0), Slo(ttft_p99_s=5.0), _space(2, ()))
    assert SloCandidates().routing == ()
    assert [(c.replicas, c.routing, c.routing_note) for c in plan.configs] == [
        (1, None, None),
        (2, None, None),
    ]


def test_prefix_aware_beats_round_robin_on_a_shared_prefix_load_as_predict_says():
    """2 x L40S, Llama-3.1-8B, 4 req/s of 6,000-token prompts opening with one of 60 shared 5,000-token prefixes:
    300k prefix tokens, more than one replica's ~194k KV slots but less than two's. Round-robin scatters every
    prefix over both replicas (each caches what it can of all 60), prefix-aware partitions them (the fleet's
    cache is the sum), so its hit rate and TTFT p99 are better: it meets 2 s where round-robin misses. The rows
    are `predict`'s for the same deployment and policy; the load is simulated though the capacity bound (every
    prompt token computed) would have pruned it."""
    load = Load(rate=4.0, prompt_len=6000, output_len=50, seed=0, shared_prefix_len=5000, num_prefixes=60)
    slo = Slo(ttft_p99_s=2.0)
    cands = SloCandidates(
        gpus=("l40s",),
        max_gpus=2,
        tensor_parallel=(1,),
        pipeline_parallel=(1,),
        max_num_seqs=(256,),
        kv_dtypes=("auto",),
        routing=("round-robin", "prefix-aware"),
    )
    result = plan_slo(MODEL, load, slo, cands)
    routed = [c for c in result.configs if c.replicas == 2]
    assert [c.routing for c in routed] == ["prefix-aware", "round-robin"]
    assert result.best == routed[0] and not routed[1].meets_slo
    assert all(c.simulated for c in result.configs)
    hits = {}
    for row in routed:
        p = predict(
            config_deployment(MODEL, row, cands),
            load,
            settings=SEARCH_SETTINGS,
            decided=verdict_decider(slo.targets()),
            focus=tuple(slo.targets()),
        )
        assert p.metrics["ttft_p99_s"] == pytest.approx(row.ttft_p99_s, rel=1e-9)
        hits[row.routing] = p.metrics["prefix_hit_rate"]
    assert hits["prefix-aware"] > hits["round-robin"] + 0.1, hits


@pytest.mark.parametrize("routing", ["round-robin", "random"])
def test_a_reused_fleet_run_is_the_run_predict_gives(routing):
    """Behind a router blind to the replicas' state a fleet's run with a larger max_num_seqs stands for a smaller
    one when `reusable` holds on every replica's rows: each reused row equals `predict` of its own deployment."""
    workload = SloWorkload(rate=6.0, prompt_len=500, output_len=100)
    cands = SloCandidates(
        gpus=("h100-80gb",),
        max_gpus=2,
        tensor_parallel=(1,),
        pipeline_parallel=(1,),
        max_num_seqs=(64, 128, 256),
        kv_dtypes=("auto",),
        max_meeting=10,
        routing=(routing,),
    )
    slo = Slo(1.0, 0.05)
    result = plan_slo(MODEL, workload, slo, cands)
    reused = [c for c in result.configs if c.reused_simulation and c.replicas == 2]
    assert reused and all(c.routing == routing for c in reused)
    for row in reused:
        p = predict(
            config_deployment(MODEL, row, cands),
            workload,
            settings=SEARCH_SETTINGS,
            decided=verdict_decider(slo.targets()),
            focus=tuple(slo.targets()),
        )
        assert all(
            getattr(row, key) == p.metrics.get(key) for key in ("ttft_p95_s", "tpot_p95_s", "e2e_p99_s")
        )
