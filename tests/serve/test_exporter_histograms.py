"""The vLLM histograms `core.serve` exports, read off the wire with prometheus_client's own parser: names, HELP,
label sets and bucket bounds as vLLM V1 defines them (the literals below are copied by hand from
vllm/v1/metrics/loggers.py, independently of core/metric_names.py), and counts and sums consistent with the
requests served (token counts known exactly; timings related by their definitions, e.g. TTFT = queue + prefill).
"""

import math
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.inproc import InProcessServer

LATENCY = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
ITL = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
VLLM_HISTOGRAMS = {  # name -> (HELP, upper bounds without +Inf)
    "vllm:iteration_tokens_total": (
        "Histogram of number of tokens per engine_step.",
        [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    ),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", LATENCY),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", LATENCY),
    "vllm:request_inference_time_seconds": ("Histogram of time spent in RUNNING phase for request.", LATENCY),
    "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", LATENCY),
    "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", LATENCY),
    "vllm:request_time_per_output_token_seconds": (
        "Histogram of time_per_output_token_seconds per request.",
        ITL,
    ),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL),
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", None),  # 1-2-5 up to max_model_len
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", None),
}
REQUESTS = [([1 + i] * (3 + 5 * i), 2 + 3 * i) for i in range(6)]  # (prompt, max_tokens): 3..28 and 2..17


def one_two_five(limit: int) -> list[float]:
    return [float(m * 10**e) for e in range(12) for m in (1, 2, 5) if m * 10**e <= limit]


@pytest.fixture(scope="module")
def scraped():
    server = InProcessServer("tiny", num_blocks=128)
    try:
        threads = [
            threading.Thread(
                target=server.post,
                args=(
                    "/v1/completions",
                    {"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True},
                ),
            )
            for p, n in REQUESTS
        ]
        for t in threads:  # concurrent: some steps batch several requests
            t.start()
        for t in threads:
            t.join()
        assert server.wait_idle()
        _, _, body = server.request("GET", "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        yield families, server.loop.steps, server.served.max_model_len
    finally:
        server.stop()


def histogram(families, name) -> tuple[list[float], list[float], float, float]:
    """(bounds, cumulative counts, sum, count) of the one series of `name`, after checking its labels."""
    family = families[name]
    assert family.type == "histogram"
    buckets = [s for s in family.samples if s.name == name + "_bucket"]
    for s in family.samples:
        keys = set(s.labels) - {"le"}
        assert (
            keys == {"model_name", "engine"}
            and s.labels["model_name"] == "tiny"
            and s.labels["engine"] == "0"
        )
    bounds = [float(s.labels["le"]) for s in buckets]
    (total,) = [s.value for s in family.samples if s.name == name + "_sum"]
    (count,) = [s.value for s in family.samples if s.name == name + "_count"]
    return bounds, [s.value for s in buckets], total, count


def test_names_help_and_buckets_are_vllms(scraped):
    families, _, max_model_len = scraped
    for name, (doc, bounds) in VLLM_HISTOGRAMS.items():
        assert families[name].documentation == doc, name
        expected = bounds if bounds is not None else one_two_five(max_model_len)
        got, cumulative, _, count = histogram(families, name)
        assert got == [*map(float, expected), math.inf], name
        assert cumulative == sorted(cumulative) and cumulative[-1] == count


def test_counts_and_sums_match_the_requests_served(scraped):
    families, steps, _ = scraped
    n = len(REQUESTS)
    prompts, outputs = sum(len(p) for p, _ in REQUESTS), sum(k for _, k in REQUESTS)
    per_request = [
        k
        for k in VLLM_HISTOGRAMS
        if k not in ("vllm:iteration_tokens_total", "vllm:inter_token_latency_seconds")
    ]
    for name in per_request:
        assert histogram(families, name)[3] == n, name
    assert histogram(families, "vllm:request_prompt_tokens")[2] == prompts
    assert histogram(families, "vllm:request_generation_tokens")[2] == outputs
    _, _, iter_sum, iter_count = histogram(families, "vllm:iteration_tokens_total")
    assert (
        iter_count == steps and iter_sum == prompts + outputs
    )  # each step observed once; tokens as vLLM counts
    assert histogram(families, "vllm:inter_token_latency_seconds")[3] == outputs - n

    def total(name):
        return histogram(families, name)[2]

    ttft = total("vllm:time_to_first_token_seconds")
    queue, prefill = total("vllm:request_queue_time_seconds"), total("vllm:request_prefill_time_seconds")
    decode, inference = (
        total("vllm:request_decode_time_seconds"),
        total("vllm:request_inference_time_seconds"),
    )
    assert ttft == pytest.approx(queue + prefill, rel=1e-9)  # first token - arrival, split at first scheduled
    assert inference == pytest.approx(prefill + decode, rel=1e-9)
    assert total("vllm:e2e_request_latency_seconds") == pytest.approx(queue + inference, rel=1e-9)
    assert decode == pytest.approx(
        total("vllm:inter_token_latency_seconds"), rel=1e-9
    )  # the ITLs tile decode
    assert min(queue, prefill, decode) >= 0 and prefill > 0 and decode > 0
