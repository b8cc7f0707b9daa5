"""Disaggregated prefill and decode (`core.planning.predict.disagg`): the KV bytes a request moves and the time they take,
worked by hand from Llama-3.1-8B's config and the link figures of docs/figures.md; in simulation the decode pool
free of prefill interference, TTFT the sum of its parts, an overloaded prefill pool not a steady state; bad
deployments refused with one line."""

import json
from dataclasses import fields

import pytest

from core.errors import InvalidArgumentError
from core.planning.commands.predict_cli import predict_main
from core.planning.predict.deployment import Deployment
from core.planning.predict.disagg import DisaggDeployment, predict_disagg
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.steady_state import SteadyStateSettings

SMALL = SteadyStateSettings(tolerance=0.2, initial_measured=100, max_requests=400, warmup_lifetimes=2.0)
# Llama-3.1-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 head size x 2 bytes (bf16) = 131,072 bytes per token
LLAMA_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def test_kv_bytes_and_time_worked_by_hand():
    prompt = 2048
    moved = prompt * LLAMA_KV_PER_TOKEN  # 268,435,456 bytes
    # one prefill + one decode worker of one H100 each: one node, NVLink 4's 900 GB/s bidirectional, 450 one way
    near = DisaggDeployment.of("llama-3.1-8b", "h100-80gb")
    assert near.link == "nvlink" and near.kv_bytes_per_request(prompt) == moved == 268_435_456
    assert near.kv_transfer_seconds(prompt) == pytest.approx(268_435_456 / 450e9)  # 0.597 ms
    # 8 + 8 workers span two nodes: each GPU's ConnectX-7 at 400 Gb/s = 50 GB/s
    far = DisaggDeployment.of("llama-3.1-8b", "h100-80gb", prefill=(8, 1), decode=(8, 1))
    assert far.link == "network" and far.kv_transfer_seconds(prompt) == pytest.approx(268_435_456 / 50e9)
    assert far.kv_transfer_seconds(prompt) == pytest.approx(5.36870912e-3)
    # prefill tp 2 to decode tp 4: two shards move in parallel, over two NICs
    wide = DisaggDeployment.of("llama-3.1-8b", "h100-80gb", prefill=(2, 2), decode=(2, 4))
    assert wide.num_gpus == 12 and wide.kv_transfer_seconds(prompt) == pytest.approx(268_435_456 / 100e9)
    # an fp8 KV cache moves half the bytes
    fp8 = DisaggDeployment.of("llama-3.1-8b", "h100-80gb", kv_dtype="fp8")
    assert fp8.kv_bytes_per_request(prompt) == moved // 2


def test_decode_pool_is_free_of_prefill_interference():
    """Two GPUs either way, 4k prompts at 2 req/s: aggregated replicas stall their decodes behind 4k-token
    prefill chunks; the decode worker only reads the arrived K/V, so its TPOT p99 stays near its median."""
    load = Load(2.0, 4000, 256)
    agg = predict(Deployment("llama-3.1-8b", "h100-80gb", replicas=2), load, settings=SMALL)
    dis = predict_disagg(DisaggDeployment.of("llama-3.1-8b", "h100-80gb"), load, settings=SMALL)
    body = dis.to_dict()
    assert dis.stable and agg.stable
    assert body["mode"] == "disagg" and agg.to_dict()["mode"] == "agg"
    assert (body["prefill_gpus"], body["decode_gpus"]) == (1, 1)
    assert body["tpot_p99_s"] < 0.8 * agg.metrics["tpot_p99_s"]
    transfer = 4000 * LLAMA_KV_PER_TOKEN / 450e9
    assert body["kv_transfer_s"] == pytest.approx(transfer)
    assert body["ttft_p50_s"] == pytest.approx(
        dis.prefill.metrics["ttft_p50_s"] + transfer + dis.decode.metrics["ttft_p50_s"]
    )
    assert body["tokens_per_s_per_gpu"] == pytest.approx(body["throughput_tokens_per_s"] / 2)
    assert body["throughput_tokens_per_s"] == pytest.approx(2.0 * 256, rel=0.2)  # a short window's count


def test_an_overloaded_prefill_pool_is_not_a_steady_state():
    # one H100 prefills a 4k prompt in ~0.2 s: 10 req/s is twice what one prefill worker serves
    dis = predict_disagg(
        DisaggDeployment.of("llama-3.1-8b", "h100-80gb"), Load(10.0, 4000, 64), settings=SMALL
    )
    assert not dis.stable and not dis.prefill.stable


def test_bad_disaggregated_deployments_are_refused():
    with pytest.raises(InvalidArgumentError, match="network bandwidth"):
        DisaggDeployment.of("llama-3.1-8b", "l4", prefill=(8, 1), decode=(8, 1))
    with pytest.raises(InvalidArgumentError, match="kv_link"):
        DisaggDeployment.of("llama-3.1-8b", "h100-80gb", kv_link="carrier-pigeon")
    with pytest.raises(InvalidArgumentError):
        DisaggDeployment.of("llama-3.1-8b", "h100-80gb", prefill=(1, 3))


def test_cli_disagg(capsys):
    base = [
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--prompt-len",
        "512",
        "--output-len",
        "4",
        "--rate",
        "1",
        "--disagg",
    ]
    assert predict_main(base) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["mode"] == "disagg" and body["kv_transfer_s"] == pytest.approx(
        512 * LLAMA_KV_PER_TOKEN / 450e9
    )
    for bad in (["--prefill-tp", "3"], ["--kv-link", "x"], ["--spec-tokens", "1", "--spec-acceptance", "1"]):
        assert predict_main([*base, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error:"), err


def test_a_disaggregated_deployment_holds_its_two_pools_and_its_link():
    """No copied settings: the two pools (Deployments) and the link are all it holds; `of` builds both pools from
    one set of settings, and pools that differ in more than tp and workers are refused."""
    assert [f.name for f in fields(DisaggDeployment)] == ["prefill", "decode", "kv_link"]
    d = DisaggDeployment.of("llama-3.1-8b", "h100-80gb", (2, 1), (1, 4), "network", max_num_seqs=64)
    assert d.prefill == Deployment("llama-3.1-8b", "h100-80gb", tp=1, replicas=2, max_num_seqs=64)
    assert d.decode == Deployment("llama-3.1-8b", "h100-80gb", tp=4, replicas=1, max_num_seqs=64)
    assert (d.prefill_workers, d.prefill_tp, d.decode_workers, d.decode_tp, d.num_gpus) == (2, 1, 1, 4, 6)
    assert d == DisaggDeployment(d.prefill, d.decode, "network") and d.link == "network"
    with pytest.raises(InvalidArgumentError, match="differ only in tp and replicas"):
        DisaggDeployment(d.prefill, Deployment("llama-3.1-8b", "h100-80gb", max_num_seqs=128))
    with pytest.raises(InvalidArgumentError, match="tp-only"):
        DisaggDeployment(Deployment("llama-3.1-8b", "h100-80gb", pp=2), d.decode)
    with pytest.raises(InvalidArgumentError, match="workers, tp"):
        DisaggDeployment.of("llama-3.1-8b", "h100-80gb", prefill=2)
