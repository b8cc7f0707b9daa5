"""`predict --replicas N --routing POLICY`: one replica keeps its numbers under every policy, a routed fleet's
throughput obeys Little's law below capacity and its per-replica breakdown adds up to the fleet's, and bad
values are one plain error each (typed in core, exit 2 with one line in the CLI)."""

import json
import subprocess
import sys

import pytest

from core.errors import RoutingError
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.router import ROUTING_POLICIES
from core.serving.steady_state import SteadyStateSettings

SMALL = SteadyStateSettings(tolerance=0.3, initial_measured=200, max_requests=1500)
CHAT = Load(rate=6.0, prompt_len=600, output_len=40, shared_prefix_len=500, num_prefixes=8, seed=1)


def _strip(body: dict) -> dict:
    body = dict(body)
    body["deployment"] = {k: v for k, v in body["deployment"].items() if k != "routing"}
    return body


def test_one_replica_keeps_its_numbers_under_every_routing():
    base = predict(Deployment("llama-3.1-8b", "h100-80gb"), CHAT, settings=SMALL).to_dict()
    assert base["deployment"]["routing"] == "round-robin"
    assert base["per_replica"][0]["load_share"] == 1.0
    assert base["per_replica"][0]["prefix_hit_rate"] == pytest.approx(base["prefix_hit_rate"])
    for routing in ROUTING_POLICIES[1:]:
        other = predict(Deployment("llama-3.1-8b", "h100-80gb", routing=routing), CHAT, settings=SMALL)
        assert _strip(other.to_dict()) == _strip(base)


@pytest.mark.parametrize("routing", ["round-robin", "prefix-aware"])
def test_a_routed_fleet_serves_the_whole_rate(routing):
    """Below capacity the fleet's output rate is the arrival rate x the output length (Little's law), the
    per-replica shares sum to 1 and their prompt-weighted hit rates to the fleet's."""
    load = Load(rate=24.0, prompt_len=600, output_len=40, shared_prefix_len=500, num_prefixes=8, seed=1)
    p = predict(Deployment("llama-3.1-8b", "h100-80gb", replicas=3, routing=routing), load, settings=SMALL)
    assert p.stable
    assert p.metrics["throughput_tokens_per_s"] == pytest.approx(24.0 * 40, rel=0.1)
    parts = p.per_replica
    assert len(parts) == 3 and sum(part["load_share"] for part in parts) == pytest.approx(1.0)
    hits = sum(part["prefix_hit_rate"] * part["requests"] for part in parts) / sum(
        part["requests"] for part in parts
    )
    assert hits == pytest.approx(p.metrics["prefix_hit_rate"], rel=1e-9)  # equal prompts: weights are counts
    assert p.to_dict()["deployment"]["routing"] == routing


def test_bad_routing_and_no_replica_are_plain_errors():
    with pytest.raises(RoutingError, match="unknown routing policy 'sticky'"):
        Deployment("llama-3.1-8b", "h100-80gb", replicas=2, routing="sticky")
    with pytest.raises(ValueError, match="replicas"):
        Deployment("llama-3.1-8b", "h100-80gb", replicas=0)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "core.planning", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("command", "bad", "word"),
    [
        ("predict", ["--routing", "sticky", "--rate", "1"], "unknown routing policy 'sticky'"),
        ("predict", ["--replicas", "0", "--rate", "1"], "replicas"),
        ("max-rate", ["--routing", "nearest", "--ttft-p99", "1"], "unknown routing policy 'nearest'"),
    ],
)
def test_cli_bad_values_exit_2_with_one_line(command, bad, word):
    run = _cli(
        command,
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--prompt-len",
        "10",
        "--output-len",
        "10",
        *bad,
    )
    assert run.returncode == 2 and word in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_cli_prints_the_fleet():
    run = _cli(
        "predict",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--replicas",
        "2",
        "--routing",
        "prefix-aware",
        "--rate",
        "4",
        "--prompt-len",
        "300",
        "--output-len",
        "8",
        "--shared-prefix-len",
        "256",
        "--num-prefixes",
        "4",
    )
    assert run.returncode == 0, run.stderr
    body = json.loads(run.stdout)
    assert body["deployment"]["routing"] == "prefix-aware" and len(body["per_replica"]) == 2
    assert 0.5 < body["prefix_hit_rate"] <= 256 / 300
    assert {"prefix_hit_rate", "load_share", "kv_usage"} <= set(body["per_replica"][0])
