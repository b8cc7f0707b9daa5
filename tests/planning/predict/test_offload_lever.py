"""The host KV tier as a lever (docs/levers.md, section 4): the rows of its side-by-side table against the
published llm-d and vLLM figures, in direction and size. Small simulations: llama-3.1-8b on an H100 at 30%
memory (58,496 KV slots), 40 prefixes of 2,900 tokens (116,000 tokens: twice HBM), 3,000-token prompts, a few
hundred requests."""

import json

import pytest

from core.planning.commands.predict_cli import predict_main
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.steady_state import SteadyStateSettings

SMALL = SteadyStateSettings(tolerance=0.2, initial_measured=100, max_requests=400, warmup_lifetimes=2.0)
HBM_GIB = 58_496 * 131_072 / 2**30  # the tier no larger than HBM: 7.14 GiB (llama-3.1-8b: 128 KiB a token)


def run(rate, gib=0.0, bandwidth=50.0, reuse=True):
    deployment = Deployment(
        "llama-3.1-8b",
        "h100-80gb",
        max_num_seqs=32,
        gpu_memory_utilization=0.3,
        kv_offload_gib=gib,
        offload_bandwidth_gbps=bandwidth,
    )
    load = Load(rate, 3000, 64, shared_prefix_len=2900, num_prefixes=40) if reuse else Load(rate, 3000, 64)
    return predict(deployment, load, settings=SMALL).to_dict()


def test_the_gain_grows_with_load():
    """llm-d: +11% output throughput at 5 QPS, +36.5% at 10 (the baseline saturates first). Here: a tie at 2
    req/s (the engine's part of TTFT still halves: the front end's fixed time, the same with or without the
    tier, taken out), over +20% at 16 req/s where only the tiered replica keeps up."""
    low, low_tier = run(2.0), run(2.0, 20)
    assert low_tier["throughput_tokens_per_s"] == pytest.approx(low["throughput_tokens_per_s"], rel=0.02)
    front_end = Deployment("llama-3.1-8b", "h100-80gb").request_overhead_s()  # a Poisson load: the fixed time
    assert low_tier["mean_ttft_s"] - front_end < 0.5 * (low["mean_ttft_s"] - front_end)
    high, high_tier = run(16.0), run(16.0, 20)
    assert high_tier["stable"] and not high["stable"]
    assert high_tier["throughput_tokens_per_s"] > 1.2 * high["throughput_tokens_per_s"]
    assert high_tier["mean_ttft_s"] < 0.2 * high["mean_ttft_s"]  # llm-d at 10 QPS: 8.08 s -> 0.41 s


def test_hits_per_tier_add_up_and_stay_under_the_full_blocks():
    tier = run(4.0, 20)
    assert tier["prefix_hit_rate"] == pytest.approx(tier["gpu_hit_rate"] + tier["host_hit_rate"])
    assert tier["host_hit_rate"] > 0.3  # the prefixes HBM lost, from the host
    assert tier["prefix_hit_rate"] <= 181 * 16 / 3000  # 181 full blocks of the 2,900-token prefix
    assert tier["deployment"]["vllm_serve_flags"] == "--kv-offloading-size 20 --kv-offloading-backend native"


def test_no_reuse_no_gain():
    """A random-prompt workload (gpt-oss-120b guide): a tie."""
    none, tier = run(4.0, reuse=False), run(4.0, 20, reuse=False)
    assert tier["host_hit_rate"] == 0.0
    assert tier["mean_ttft_s"] == pytest.approx(none["mean_ttft_s"], rel=0.01)
    assert tier["throughput_tokens_per_s"] == pytest.approx(none["throughput_tokens_per_s"], rel=0.01)


def test_a_tier_no_larger_than_hbm_adds_little():
    """The tier is inclusive: of HBM's size it mostly holds what HBM holds (an older guide whose prompt fits HBM:
    no gain)."""
    none, same, big = run(4.0), run(4.0, HBM_GIB), run(4.0, 20)
    assert same["host_hit_rate"] < 0.15 * big["host_hit_rate"]
    assert same["mean_ttft_s"] == pytest.approx(none["mean_ttft_s"], rel=0.1)


def test_a_link_slower_than_recomputing_is_a_loss():
    """0.2 GB/s: 2,900 tokens x 128 KiB take ~1.9 s to load against ~0.2 s to prefill."""
    none, slow = run(4.0), run(4.0, 20, bandwidth=0.2)
    assert slow["mean_ttft_s"] > 3 * none["mean_ttft_s"]


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--kv-offload-gib", "nan", "kv_offload_gib must be a finite number"),
        ("--kv-offload-gib", "-2", "kv_offload_gib must be between 0"),
        ("--offload-policy", "mru", "offload policy must be one of lru, arc"),
        ("--offload-bandwidth-gbps", "0", "--offload-bandwidth-gbps must be greater than 0"),
    ],
)
def test_bad_tier_flags_exit_2_with_one_line(flag, value, says, capsys):
    args = [
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--rate",
        "1",
        "--prompt-len",
        "100",
        "--output-len",
        "8",
        flag,
        value,
    ]
    assert predict_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_predict_cli_prints_hits_per_tier(capsys):
    args = [
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-80gb",
        "--rate",
        "1",
        "--prompt-len",
        "300",
        "--output-len",
        "8",
        "--shared-prefix-len",
        "200",
        "--kv-offload-gib",
        "1",
        "--offload-policy",
        "arc",
    ]
    assert predict_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"prefix_hit_rate", "gpu_hit_rate", "host_hit_rate"} <= out.keys()
    assert out["deployment"]["offload_policy"] == "arc"


def test_each_replica_of_a_routed_fleet_has_its_own_tier():
    """Two replicas behind prefix-aware routing, 80 prefixes (twice what their HBM holds): each replica's host
    tier serves what its HBM lost, and TTFT falls."""

    def fleet(gib):
        deployment = Deployment(
            "llama-3.1-8b",
            "h100-80gb",
            replicas=2,
            routing="prefix-aware",
            max_num_seqs=32,
            gpu_memory_utilization=0.3,
            kv_offload_gib=gib,
        )
        load = Load(8.0, 3000, 64, shared_prefix_len=2900, num_prefixes=80)
        return predict(deployment, load, settings=SMALL).to_dict()

    none, tier = fleet(0), fleet(20)
    assert none["host_hit_rate"] == 0 and tier["host_hit_rate"] > 0.1
    assert tier["prefix_hit_rate"] > none["prefix_hit_rate"] + 0.1
    assert tier["mean_ttft_s"] < none["mean_ttft_s"]
