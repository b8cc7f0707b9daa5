"""Prometheus metrics of `core.serve` under vLLM's names and meanings (`core/live/names.py`), so the Live page,
Grafana dashboards made for vLLM and `parse_vllm_metrics` read our server as they read vLLM.

Histograms, with vLLM V1's names, HELP texts and buckets (`vllm/v1/metrics/loggers.py`): per token
time_to_first_token_seconds and inter_token_latency_seconds; per engine step iteration_tokens_total (the prompt
tokens of the requests whose first token the step produced + the tokens it generated, as vLLM counts an
iteration); per finished request (`request_finished`) e2e_request_latency_seconds, request_queue_time_seconds
(arrival -> first scheduled), request_prefill_time_seconds (first scheduled -> first token),
request_decode_time_seconds (first -> last token), request_inference_time_seconds (first scheduled -> last
token), request_time_per_output_token_seconds (decode / (output tokens - 1); 0 for one token, as vLLM),
request_prompt_tokens and request_generation_tokens (buckets 1, 2, 5, 10, ... up to max_model_len).

Every metric carries vLLM's labels `model_name` and `engine` ("0": one engine). Each server has its own
registry (no global state). Only the engine-loop thread writes the figures; `render()` may run on any thread.
"""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from core.live.names import (
    CACHE_CONFIG_INFO,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    request_token_buckets,
)


@dataclass(frozen=True)
class FinishedRequest:
    """One request's times (seconds, one clock) and token counts, as vLLM's FinishedRequestStats derives them:
    arrival (submitted), scheduled (first scheduled; a preemption does not move it), first and last token."""

    arrival: float
    scheduled: float
    first_token: float
    last_token: float
    prompt_tokens: int
    generation_tokens: int


class ServerMetrics:
    def __init__(
        self, model_name: str, *, block_size: int, num_gpu_blocks: int, prefix_caching: bool, dtype: str,
        max_model_len: int = 2048,
    ):  # fmt: skip
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
        self.request_tpot = histogram("vllm:request_time_per_output_token_seconds",
                                      "Histogram of time_per_output_token_seconds per request.",
                                      ITL_BUCKETS)  # fmt: skip
        phase = "Histogram of time spent in {} phase for request."
        self.queue_time = histogram("vllm:request_queue_time_seconds", phase.format("WAITING"),
                                    REQUEST_LATENCY_BUCKETS)  # fmt: skip
        self.inference_time = histogram("vllm:request_inference_time_seconds", phase.format("RUNNING"),
                                        REQUEST_LATENCY_BUCKETS)  # fmt: skip
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", phase.format("PREFILL"),
                                      REQUEST_LATENCY_BUCKETS)  # fmt: skip
        self.decode_time = histogram("vllm:request_decode_time_seconds", phase.format("DECODE"),
                                     REQUEST_LATENCY_BUCKETS)  # fmt: skip
        token_buckets = request_token_buckets(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)  # fmt: skip
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)  # fmt: skip
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKENS_BUCKETS)  # fmt: skip
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

    def request_finished(self, reason: str, times: FinishedRequest | None = None) -> None:
        """Count a finished request; with its `times`, observe the per-request histograms (e2e at last_token)."""
        self._success.labels(*self._labels, reason).inc()
        if times is None:
            return
        decode = times.last_token - times.first_token
        self.e2e.observe(times.last_token - times.arrival)
        self.queue_time.observe(times.scheduled - times.arrival)
        self.prefill_time.observe(times.first_token - times.scheduled)
        self.decode_time.observe(decode)
        self.inference_time.observe(times.last_token - times.scheduled)
        gen = times.generation_tokens
        self.request_tpot.observe(decode / (gen - 1) if gen > 1 else 0.0)
        self.request_prompt_tokens.observe(times.prompt_tokens)
        self.request_generation_tokens.observe(gen)

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4), as /metrics serves it."""
        return generate_latest(self.registry)
