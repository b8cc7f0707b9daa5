"""Prometheus metrics of `core.serve` under vLLM's names and meanings (`core/metric_names.py`), so the Live page,
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

from core.metric_names import (
    CACHE_CONFIG_INFO,
    CACHE_CONFIG_LABELS,
    FINISHED_REASON_LABEL,
    HISTOGRAM_BUCKETS,
    LABELS,
    current_name,
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
        self,
        model_name: str,
        *,
        block_size: int,
        num_gpu_blocks: int,
        prefix_caching: bool,
        dtype: str,
        max_model_len: int = 2048,
    ):
        self.registry = CollectorRegistry()
        names = list(LABELS)
        labels = (model_name, "0")
        reg = self.registry

        def gauge(field, doc):
            return Gauge(current_name(field), doc, names, registry=reg).labels(*labels)

        def counter(field, doc):
            return Counter(current_name(field), doc, names, registry=reg).labels(*labels)

        def histogram(field, doc, buckets=None):
            buckets = buckets or HISTOGRAM_BUCKETS[field]
            return Histogram(current_name(field), doc, names, buckets=buckets, registry=reg).labels(*labels)

        self.running = gauge("num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("kv_cache_usage", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter("num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self._success = Counter(
            current_name("request_success"),
            "Count of successfully processed requests.",
            [*names, FINISHED_REASON_LABEL],
            registry=reg,
        )
        self._labels = labels
        self.ttft = histogram("ttft", "Histogram of time to first token in seconds.")
        self.itl = histogram("itl", "Histogram of inter-token latency in seconds.")
        self.e2e = histogram("e2e", "Histogram of e2e request latency in seconds.")
        self.request_tpot = histogram(
            "request_tpot", "Histogram of time_per_output_token_seconds per request."
        )
        phase = "Histogram of time spent in {} phase for request."
        self.queue_time = histogram("queue_time", phase.format("WAITING"))
        self.inference_time = histogram("inference_time", phase.format("RUNNING"))
        self.prefill_time = histogram("prefill_time", phase.format("PREFILL"))
        self.decode_time = histogram("decode_time", phase.format("DECODE"))
        token_buckets = request_token_buckets(max_model_len)
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.iteration_tokens = histogram(
            "iteration_tokens", "Histogram of number of tokens per engine_step."
        )
        info = Gauge(
            CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig", CACHE_CONFIG_LABELS, registry=reg
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
