"""parse_vllm_metrics on exposition text prometheus_client itself renders with vLLM's names and labels."""

import math
import pickle
import random

import pytest

from core.errors import MetricsFormatError
from core.live.histogram import Histogram
from core.live.metrics import VllmMetrics, combine_metrics, parse_vllm_engines, parse_vllm_metrics
from tests.live.exposition import EngineState, vllm_exposition


@pytest.mark.parametrize("legacy", [False, True])
def test_one_engine_every_field(legacy):
    s = EngineState()
    m = parse_vllm_metrics(vllm_exposition({"0": s}, legacy=legacy))
    assert m.kv_cache_usage == pytest.approx(0.25)
    assert (m.num_requests_running, m.num_requests_waiting) == (3, 1)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (1000, 400)
    assert m.prefix_cache_hit_rate == pytest.approx(0.4)
    assert (m.num_preemptions, m.prompt_tokens, m.generation_tokens) == (2, 1200, 800)
    assert m.request_success == 10  # two finished_reason series summed
    assert (m.num_gpu_blocks, m.block_size) == (1000, 16)
    assert m.cache_setting("cache_dtype") == "auto" and m.cache_setting("gpu_memory_utilization") == "0.9"
    assert m.ttft.count == 4 and m.ttft.sum == pytest.approx(sum(s.ttft))
    assert m.itl.count == 5 and m.itl.sum == pytest.approx(sum(s.itl))
    assert m.e2e.count == 2
    assert m.engines == ("0",) and m.model_names == ("meta-llama/Llama-3.1-8B",)
    assert m.legacy_names is legacy


def test_counters_are_read_from_total_and_created_is_ignored():
    text = vllm_exposition({"0": EngineState(preemptions=7)})
    assert "vllm:num_preemptions_total{" in text and "vllm:num_preemptions_created{" in text
    assert parse_vllm_metrics(text).num_preemptions == 7  # not 7 + a Unix time


def test_several_engines_summed_usage_averaged():
    a = EngineState(usage=0.2, running=2, waiting=0, queries=100, hits=10, num_gpu_blocks=500, ttft=[0.03])
    b = EngineState(
        usage=0.6, running=5, waiting=4, queries=300, hits=150, num_gpu_blocks=500, ttft=[0.3, 3.0]
    )
    text = vllm_exposition({"0": a, "1": b})
    per_engine = parse_vllm_engines(text)
    assert list(per_engine) == ["0", "1"]
    assert per_engine["1"].num_requests_running == 5 and per_engine["0"].kv_cache_usage == pytest.approx(0.2)
    m = parse_vllm_metrics(text)
    assert m.kv_cache_usage == pytest.approx(0.4)
    assert (m.num_requests_running, m.num_requests_waiting) == (7, 4)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (400, 160)
    assert m.num_gpu_blocks == 1000 and m.block_size == 16
    assert m.ttft.count == 3 and m.ttft.sum == pytest.approx(3.33)
    assert m.engines == ("0", "1")


def test_usage_weighted_by_blocks_when_pools_differ():
    a, b = EngineState(usage=0.5, num_gpu_blocks=100), EngineState(usage=0.0, num_gpu_blocks=300)
    assert parse_vllm_metrics(vllm_exposition({"0": a, "1": b})).kv_cache_usage == pytest.approx(50 / 400)


def test_fleet_of_servers_old_and_new_combined():
    new = parse_vllm_metrics(vllm_exposition({"0": EngineState(hits=100)}))
    old = parse_vllm_metrics(vllm_exposition({"0": EngineState(hits=300)}, legacy=True))
    fleet = combine_metrics([new, old])
    assert fleet.prefix_cache_hits == 400 and fleet.prefix_cache_queries == 2000
    assert fleet.legacy_names and fleet.num_gpu_blocks == 2000
    assert combine_metrics([]) == VllmMetrics()


def test_block_size_none_when_engines_disagree():
    text = vllm_exposition({"0": EngineState(block_size=16), "1": EngineState(block_size=32)})
    assert parse_vllm_metrics(text).block_size is None


def test_missing_metrics_are_none():
    text = (
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 4.0\n'
    )
    m = parse_vllm_metrics(text)
    assert m.num_requests_running == 4
    assert m.kv_cache_usage is None and m.prefix_cache_hit_rate is None and m.ttft is None


def test_histogram_percentiles_bracket_the_true_quantile():
    rng = random.Random(3)
    observed = sorted(rng.lognormvariate(-2.5, 1.0) for _ in range(500))
    m = parse_vllm_metrics(vllm_exposition({"0": EngineState(ttft=observed)}))
    bounds = [0.0, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
    for q in (0.5, 0.9, 0.99):
        true = observed[math.ceil(q * len(observed)) - 1]
        estimate = m.ttft.quantile(q)
        lower = max(b for b in bounds if b < true)
        upper = min(b for b in bounds if b >= true)
        assert lower <= estimate <= upper, (q, true, estimate)


def test_quantile_hand_worked():
    # 10 observations: 2 in (0, 1], 6 in (1, 2], 2 in (2, 4]; the median has rank 5: 3 into the (1, 2] bucket
    h = Histogram.from_buckets([(1.0, 2), (2.0, 8), (4.0, 10), (math.inf, 10)], 15.0, 10)
    assert h.quantile(0.5) == pytest.approx(1 + 3 / 6)
    assert h.quantile(0.1) == pytest.approx(0.5)
    assert h.quantile(0.9) == pytest.approx(3.0)
    assert h.mean == 1.5
    over = Histogram.from_buckets([(1.0, 1), (math.inf, 4)], 9.0, 4)
    assert over.quantile(0.99) == 1.0  # in the +Inf bucket: the highest finite bound, as Prometheus
    assert Histogram.from_buckets([(1.0, 0)], 0.0, 0).quantile(0.5) is None


def test_window_is_the_difference_of_two_scrapes():
    before = parse_vllm_metrics(vllm_exposition({"0": EngineState(ttft=[0.03, 0.03])})).ttft
    after = parse_vllm_metrics(vllm_exposition({"0": EngineState(ttft=[0.03, 0.03, 5.5, 6.0])})).ttft
    window = after.minus(before)
    assert window.count == 2 and window.sum == pytest.approx(11.5)
    assert 5.0 <= window.quantile(0.5) <= 7.5
    assert before.minus(after) == before  # a restart (counts went down): the whole scrape


@pytest.mark.parametrize(
    ("body", "line", "match"),
    [
        ("<html><body><h1>502 Bad Gateway</h1></body></html>", 1, "HTML"),
        ("<!DOCTYPE html>\n<html></html>", 1, "HTML"),
        ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"', 2, "line 2"),
        ("vllm:num_requests_running 1.0\nhello world\n", 2, "line 2"),
        ("", None, "no vllm: metric"),
        ("process_open_fds 12.0\n", None, "no vllm: metric"),
    ],
)
def test_not_metrics_is_a_typed_error_naming_the_problem(body, line, match):
    with pytest.raises(MetricsFormatError, match=match) as caught:
        parse_vllm_metrics(body)
    assert caught.value.line_number == line
    again = pickle.loads(pickle.dumps(caught.value))
    assert again.line_number == line and str(again) == str(caught.value)


def test_truncated_body_names_the_cut_line():
    text = vllm_exposition({"0": EngineState()})
    cut = text[: text.index("vllm:num_preemptions_total{") + 30]
    with pytest.raises(MetricsFormatError) as caught:
        parse_vllm_metrics(cut)
    assert caught.value.line_number == cut.count("\n") + 1
