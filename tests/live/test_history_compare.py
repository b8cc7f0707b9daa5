"""Fleet history (per server + fleet, window hit rates) and the plan-vs-server comparison, hand-worked."""

import pytest

from core.live.history import FLEET, LiveHistory, window_hit_rate
from core.live.metrics import VllmMetrics, parse_vllm_metrics
from core.planning.catalog.hardware import get_gpu
from core.planning.catalog.models import get_model
from core.planning.memory.plan import PlanInputs
from core.planning.observed.compare import compare_with_server
from tests.live.exposition import EngineState, vllm_exposition


def scrape(**kw):
    return parse_vllm_metrics(vllm_exposition({"0": EngineState(**kw)}))


def test_fleet_rows_and_window_hit_rates():
    h = LiveHistory()
    h.record(0.0, {"a": scrape(queries=100, hits=10, usage=0.5), "b": scrape(queries=0, hits=0, usage=0.1)})
    h.record(2.0, {"a": scrape(queries=300, hits=110, usage=0.7), "b": None})  # b failed this poll
    h.record(4.0, {"a": scrape(queries=20, hits=5, usage=0.2), "b": scrape(queries=50, hits=50, usage=0.3)})
    df = h.frame()
    a = df[df.source == "a"]
    assert list(a.window_hit_rate.isna()) == [True, False, False]
    assert a.window_hit_rate.iloc[1] == pytest.approx(100 / 200)
    assert a.window_hit_rate.iloc[2] == pytest.approx(5 / 20)  # a restarted: the new totals
    b = df[df.source == "b"]
    assert list(b.t) == [0.0, 4.0] and b.window_hit_rate.iloc[1] == pytest.approx(1.0)
    fleet = df[df.source == FLEET]
    assert list(fleet.t) == [0.0, 2.0, 4.0]
    assert fleet.kv_cache_usage.iloc[0] == pytest.approx(0.3)  # equal pools: the mean
    assert fleet.running.iloc[0] == 6 and fleet.running.iloc[1] == 3
    assert fleet.hit_rate.iloc[0] == pytest.approx(10 / 100)
    assert h.latest("b").kv_cache_usage == pytest.approx(0.3)


def test_one_source_has_no_fleet_rows_and_a_latency_window():
    h = LiveHistory(max_polls=2)
    for i, ttft in enumerate(([0.03], [0.03, 0.5], [0.03, 0.5, 7.0, 7.0])):
        h.record(float(i), {"only": scrape(ttft=ttft)})
    assert set(h.frame().source) == {"only"} and len(h.polls) == 2
    window = h.latency_window("only", "ttft")
    assert window.count == 2 and 5.0 <= window.quantile(0.5) <= 7.5
    assert window_hit_rate(None, VllmMetrics()) is None


LLAMA_8B_BLOCK = 16 * 8 * 128 * 32 * 2 * 2  # tokens x kv heads x head dim x layers x (K, V) x bf16 bytes


def test_compare_takes_the_servers_settings_and_explains():
    inputs = PlanInputs(get_model("llama-3.1-8b"), get_gpu("h100-80gb"))
    planned = compare_with_server(inputs, scrape(num_gpu_blocks=1), 4096).planned_blocks
    assert planned > 0
    agree = compare_with_server(inputs, scrape(num_gpu_blocks=planned), 4096)
    assert agree.plan.block_bytes == LLAMA_8B_BLOCK
    assert agree.relative_difference == 0 and "agree" in agree.explanations[0]
    assert agree.planned_concurrency == agree.observed_concurrency == planned // 256
    more = compare_with_server(inputs, scrape(num_gpu_blocks=int(planned * 1.2)), 4096)
    assert more.relative_difference == pytest.approx(0.2, abs=1e-3) and "more" in more.explanations[0]
    assert any("activation" in e for e in more.explanations[1:])
    less = compare_with_server(inputs, scrape(num_gpu_blocks=planned // 2), 4096)
    assert "less" in less.explanations[0] and any("Other processes" in e for e in less.explanations)
    # two engines (data parallel): blocks per replica
    two = parse_vllm_metrics(
        vllm_exposition({"0": EngineState(num_gpu_blocks=planned), "1": EngineState(num_gpu_blocks=planned)})
    )
    assert compare_with_server(inputs, two, 4096).observed_blocks == planned
    # the server's block size 32 is planned with: blocks twice as large, half as many
    big = compare_with_server(inputs, scrape(num_gpu_blocks=planned // 2, block_size=32), 4096)
    assert big.plan.block_bytes == 2 * LLAMA_8B_BLOCK and big.planned_blocks == planned // 2
    assert "block_size 32" in big.settings_from_server
    assert compare_with_server(inputs, VllmMetrics(), 4096).observed_blocks is None
    # the fixture's server says meta-llama/Llama-3.1-8B: no warning; a tiny model's name is flagged first
    assert not any("The server says" in e for e in agree.explanations)
    tiny = parse_vllm_metrics(vllm_exposition({"0": EngineState(num_gpu_blocks=256)}, model="tiny"))
    assert compare_with_server(inputs, tiny, 4096).explanations[0].startswith("The server says it runs tiny")
