"""Metric text as a vLLM server exposes it, made by prometheus_client itself (the library vLLM uses): a registry
with vLLM's metric names, types and label sets (model_name, engine) and vLLM's buckets, rendered by
`generate_latest`. Independent of core/live: the names here are written out, not imported.
"""

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0]


@dataclass
class EngineState:
    """What one engine (data-parallel rank) has done; the expected values of the parse."""

    usage: float = 0.25
    running: int = 3
    waiting: int = 1
    queries: int = 1000
    hits: int = 400
    preemptions: int = 2
    prompt_tokens: int = 1200
    generation_tokens: int = 800
    success: int = 10
    num_gpu_blocks: int = 1000
    block_size: int = 16
    ttft: list[float] = field(default_factory=lambda: [0.03, 0.07, 0.2, 0.9])
    itl: list[float] = field(default_factory=lambda: [0.012, 0.02, 0.03, 0.06, 0.11])
    e2e: list[float] = field(default_factory=lambda: [1.2, 2.2])


def vllm_exposition(
    engines: dict[str, EngineState], *, legacy: bool = False, model: str = "meta-llama/Llama-3.1-8B"
) -> str:
    """The /metrics body of a vLLM server with these engines. legacy: the pre-0.9 names (gpu_cache_usage_perc,
    gpu_prefix_cache_queries/hits, time_per_output_token_seconds)."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    usage_name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    prefix = "vllm:gpu_prefix_cache_" if legacy else "vllm:prefix_cache_"
    itl_name = "vllm:time_per_output_token_seconds" if legacy else "vllm:inter_token_latency_seconds"
    running = Gauge("vllm:num_requests_running", "Running requests.", labels, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Waiting requests.", labels, registry=reg)
    usage = Gauge(usage_name, "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg)
    queries = Counter(prefix + "queries", "Prefix cache queries, in terms of tokens.", labels, registry=reg)
    hits = Counter(prefix + "hits", "Prefix cache hits, in terms of tokens.", labels, registry=reg)
    preempt = Counter("vllm:num_preemptions", "Cumulative preemptions.", labels, registry=reg)
    prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=reg)
    gen = Counter("vllm:generation_tokens", "Generation tokens processed.", labels, registry=reg)
    success = Counter(
        "vllm:request_success", "Successful requests.", [*labels, "finished_reason"], registry=reg
    )
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", labels, buckets=TTFT_BUCKETS, registry=reg)
    itl = Histogram(itl_name, "ITL.", labels, buckets=ITL_BUCKETS, registry=reg)
    e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E.", labels, buckets=E2E_BUCKETS, registry=reg)
    # an unrelated histogram whose name ends in _total, as vLLM's iteration_tokens_total does
    iteration = Histogram(
        "vllm:iteration_tokens_total", "Tokens per step.", labels, buckets=[1, 8, 64], registry=reg
    )
    info_labels = [
        "block_size",
        "cache_dtype",
        "enable_prefix_caching",
        "gpu_memory_utilization",
        "num_gpu_blocks",
    ]
    info = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        [*info_labels, "engine"],
        registry=reg,
    )
    for engine, s in engines.items():
        ls = (model, engine)
        running.labels(*ls).set(s.running)
        waiting.labels(*ls).set(s.waiting)
        usage.labels(*ls).set(s.usage)
        queries.labels(*ls).inc(s.queries)
        hits.labels(*ls).inc(s.hits)
        preempt.labels(*ls).inc(s.preemptions)
        prompt.labels(*ls).inc(s.prompt_tokens)
        gen.labels(*ls).inc(s.generation_tokens)
        success.labels(*ls, "stop").inc(s.success - 1)
        success.labels(*ls, "length").inc(1)
        for x in s.ttft:
            ttft.labels(*ls).observe(x)
        for x in s.itl:
            itl.labels(*ls).observe(x)
        for x in s.e2e:
            e2e.labels(*ls).observe(x)
        iteration.labels(*ls).observe(5)
        info.labels(str(s.block_size), "auto", "True", "0.9", str(s.num_gpu_blocks), engine).set(1)
    Gauge("process_open_fds", "Not vLLM's.", registry=reg).set(12)
    return generate_latest(reg).decode()
