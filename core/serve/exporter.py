"""Prometheus metrics of `core.serve` under vLLM's names and meanings (`core/live/names.py`), so the Live page,
Grafana dashboards made for vLLM and `parse_vllm_metrics` read our server as they read vLLM.

Every metric carries vLLM's labels `model_name` and `engine` ("0": one engine). Each server has its own
registry (no global state). Only the engine-loop thread writes the figures; `render()` may run on any thread.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from core.live.names import CACHE_CONFIG_INFO, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS


class ServerMetrics:
    def __init__(
        self, model_name: str, *, block_size: int, num_gpu_blocks: int, prefix_caching: bool, dtype: str
    ):
        self.registry = CollectorRegistry()
        names = ["model_name", "engine"]
        labels = (model_name, "0")
        reg = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, names, registry=reg).labels(*labels)

        def counter(name, doc):
            return Counter(name, doc, names, registry=reg).labels(*labels)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=reg).labels(*labels)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self._success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"],
            registry=reg,
        )  # fmt: skip
        self._labels = labels
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)  # fmt: skip
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)  # fmt: skip
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)  # fmt: skip
        info = Gauge(
            CACHE_CONFIG_INFO,
            "Information of the LLMEngine CacheConfig",
            [
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "gpu_memory_utilization",
                "num_gpu_blocks",
                "engine",
            ],
            registry=reg,
        )
        info.labels(str(block_size), dtype, str(prefix_caching), "1.0", str(num_gpu_blocks), "0").set(1)

    def request_finished(self, reason: str) -> None:
        self._success.labels(*self._labels, reason).inc()

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4), as /metrics serves it."""
        return generate_latest(self.registry)
