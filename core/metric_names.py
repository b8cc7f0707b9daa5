"""vLLM's Prometheus metric vocabulary (names, labels, histogram buckets): the one place both the client
(`core.live.metrics` parses a server's /metrics) and our server (`core.serve.exporter` publishes them) read.

Names are the metric names as registered (prometheus_client appends `_total` to a counter's samples and adds a
`_created` gauge; a histogram's samples end in `_bucket`, `_sum`, `_count`). Every field the lab reads has the
name vLLM publishes today first, then the names it published before (pre-0.9 V1 and V0), tried in that order.
Labels on every metric: `model_name` and `engine` (the data-parallel index, as a string).
Bucket bounds are vLLM V1's (`vllm/v1/metrics/loggers.py`), so our server's histograms bin like vLLM's: seconds for
the timings, tokens for `ITERATION_TOKENS_BUCKETS` and `request_token_buckets(max_model_len)`.
"""

MODEL_NAME_LABEL = "model_name"
ENGINE_LABEL = "engine"  # the data-parallel index, as a string ("0" for one engine)
LABELS = (MODEL_NAME_LABEL, ENGINE_LABEL)  # on every metric, in this order
FINISHED_REASON_LABEL = "finished_reason"  # request_success's own label, after LABELS
CACHE_CONFIG_LABELS = (
    "block_size",
    "cache_dtype",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "num_gpu_blocks",
    ENGINE_LABEL,
)

GAUGES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    ),  # a fraction 0..1 despite "perc"
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
}

COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),  # tokens
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),  # tokens
    "num_preemptions": ("vllm:num_preemptions",),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "request_success": ("vllm:request_success",),
}

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue_time": ("vllm:request_queue_time_seconds",),
    "request_tpot": ("vllm:request_time_per_output_token_seconds",),  # per request: decode / (tokens - 1)
    "prefill_time": ("vllm:request_prefill_time_seconds",),  # first scheduled -> first token
    "decode_time": ("vllm:request_decode_time_seconds",),  # first token -> last token
    "inference_time": ("vllm:request_inference_time_seconds",),  # first scheduled -> last token
    "request_prompt_tokens": ("vllm:request_prompt_tokens",),  # tokens per finished request
    "request_generation_tokens": ("vllm:request_generation_tokens",),
    "iteration_tokens": ("vllm:iteration_tokens_total",),  # a histogram despite the name: tokens per step
}

CACHE_CONFIG_INFO = "vllm:cache_config_info"  # a gauge of value 1 whose labels carry the cache config

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
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
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
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
)
REQUEST_LATENCY_BUCKETS = (
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
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "request_tpot": ITL_BUCKETS,
    "e2e": REQUEST_LATENCY_BUCKETS,
    "queue_time": REQUEST_LATENCY_BUCKETS,
    "prefill_time": REQUEST_LATENCY_BUCKETS,
    "decode_time": REQUEST_LATENCY_BUCKETS,
    "inference_time": REQUEST_LATENCY_BUCKETS,
    "iteration_tokens": ITERATION_TOKENS_BUCKETS,
}  # the fixed bounds of each HISTOGRAMS field; the per-request token ones: `request_token_buckets`


def current_name(field: str) -> str:
    """The name vLLM publishes today for a field of GAUGES, COUNTERS or HISTOGRAMS (the first of its names):
    current_name("itl") == "vllm:inter_token_latency_seconds". Raises KeyError for another field."""
    for table in (GAUGES, COUNTERS, HISTOGRAMS):
        if field in table:
            return table[field][0]
    raise KeyError(field)


def request_token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's buckets of the per-request token histograms (request_prompt_tokens, request_generation_tokens):
    1, 2, 5, 10, 20, 50, ... up to and including max_model_len (its `build_1_2_5_buckets`)."""
    out, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(out)
            out.append(mantissa * scale)
        scale *= 10
