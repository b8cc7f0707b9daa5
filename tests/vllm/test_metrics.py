"""vLLM's own `/metrics` (a running vLLM 0.32, its CPU build) read by the Live page's parser: every field the parser
gives equals the value written in the text, read here line by line without prometheus_client."""

import math
import re

from core.live.metrics import parse_vllm_metrics

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if line.startswith("#") or not match:
            continue
        labels = dict(LABEL.findall(match["labels"] or ""))
        out.setdefault(match["name"], []).append((labels, float(match["value"])))
    return out


def _total(samples, name: str) -> float:
    return sum(value for _, value in samples[name])


def test_every_parsed_metric_equals_the_text(real_vllm):
    shared = list(range(1000, 1100))  # 3 full blocks of 32 shared by the prompts below
    for tail in range(4):
        real_vllm.complete([*shared, 2000 + tail, 3000 + tail], max_tokens=4)
    text = real_vllm.get("/metrics").decode()
    samples = _samples(text)
    parsed = parse_vllm_metrics(text)

    assert parsed.prompt_tokens == _total(samples, "vllm:prompt_tokens_total")
    assert parsed.generation_tokens == _total(samples, "vllm:generation_tokens_total")
    assert parsed.prefix_cache_queries == _total(samples, "vllm:prefix_cache_queries_total")
    assert parsed.prefix_cache_hits == _total(samples, "vllm:prefix_cache_hits_total")
    assert parsed.num_preemptions == _total(samples, "vllm:num_preemptions_total")
    assert parsed.request_success == _total(samples, "vllm:request_success_total")
    assert parsed.num_requests_running == _total(samples, "vllm:num_requests_running")
    assert parsed.num_requests_waiting == _total(samples, "vllm:num_requests_waiting")
    assert math.isclose(parsed.kv_cache_usage, _total(samples, "vllm:kv_cache_usage_perc"))
    ((info_labels, _),) = samples["vllm:cache_config_info"]
    assert parsed.block_size == int(info_labels["block_size"]) == real_vllm.block_size
    assert parsed.num_gpu_blocks == int(info_labels["num_gpu_blocks"]) == real_vllm.num_gpu_blocks_override
    # the four requests: 4 x 102 prompt tokens, 3 x 96 of them hits (the first request found nothing)
    assert parsed.prompt_tokens >= 4 * 102 and parsed.prefix_cache_hits >= 3 * 96
    for name, histogram in (("time_to_first_token", parsed.ttft), ("e2e_request_latency", parsed.e2e)):
        count = _total(samples, f"vllm:{name}_seconds_count")
        assert histogram is not None and histogram.count == count >= 4
        assert math.isclose(histogram.sum, _total(samples, f"vllm:{name}_seconds_sum"))
