"""Read a vLLM server's `/metrics` body (Prometheus text exposition) into the KV-cache figures the Live page draws.

`parse_vllm_engines(text)` gives one `VllmMetrics` per engine (vLLM's `engine` label: the data-parallel index);
`parse_vllm_metrics(text)` their sum for the server; `combine_metrics` sums servers of a fleet the same way.
Summing: gauges of requests and counters add up; `kv_cache_usage` is averaged, weighted by each engine's
`num_gpu_blocks` when every engine publishes it (equal pools: the plain mean), so it stays the fraction of all
blocks in use; histograms add bucket by bucket. A field the server does not publish is None, never 0.

Parsing uses prometheus_client's parser and keys every value by its *sample* name: a counter registered as
`vllm:prompt_tokens` is read from `vllm:prompt_tokens_total`; its `vllm:prompt_tokens_created` gauge (a Unix
time) and histograms' `_created` are ignored. Both the current names and the pre-0.9 ones are read
(`core/metric_names.py`), the current one winning when a server publishes both.
"""

import math
from collections import defaultdict
from dataclasses import dataclass, fields

from prometheus_client.parser import text_string_to_metric_families

from core.errors import MetricsFormatError
from core.live.histogram import Histogram, merge_histograms
from core.metric_names import CACHE_CONFIG_INFO, COUNTERS, ENGINE_LABEL, GAUGES, HISTOGRAMS, MODEL_NAME_LABEL

NO_ENGINE = ""  # the `engine` label value of a server that publishes none (vLLM V0)


@dataclass(frozen=True)
class VllmMetrics:
    """One scrape of one engine, server or fleet. Token counters count tokens; all counters are totals since
    the server started (compare two scrapes for a rate). `prefix_cache_hit_rate` = hits / queries overall."""

    kv_cache_usage: float | None = None  # fraction 0..1 of the KV blocks in use
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    prefix_cache_queries: float | None = None  # tokens looked up in the prefix cache
    prefix_cache_hits: float | None = None  # tokens found there
    num_preemptions: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    request_success: float | None = None
    num_gpu_blocks: int | None = None  # from vllm:cache_config_info (summed over engines)
    block_size: int | None = None  # tokens per block; None when engines disagree or none says
    ttft: Histogram | None = None  # time to first token, seconds
    itl: Histogram | None = None  # inter-token latency, seconds
    e2e: Histogram | None = None  # end-to-end request latency, seconds
    queue_time: Histogram | None = None  # seconds waiting before scheduled
    request_tpot: Histogram | None = None  # per finished request: decode time / (output tokens - 1), seconds
    prefill_time: Histogram | None = None  # per finished request: first scheduled -> first token, seconds
    decode_time: Histogram | None = None  # per finished request: first token -> last token, seconds
    inference_time: Histogram | None = None  # per finished request: first scheduled -> last token, seconds
    request_prompt_tokens: Histogram | None = None  # prompt tokens per finished request
    request_generation_tokens: Histogram | None = None  # output tokens per finished request
    iteration_tokens: Histogram | None = None  # tokens per engine step (prompts counted at their first token)
    cache_config: tuple[tuple[str, str], ...] = ()  # all of vllm:cache_config_info's labels (first engine's)
    engines: tuple[str, ...] = ()  # `engine` label values summed here
    model_names: tuple[str, ...] = ()
    legacy_names: bool = False  # some value came from a pre-0.9 name

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hits / queries since the server started (None before any query or when not published)."""
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    def cache_setting(self, key: str) -> str | None:
        """One label of vllm:cache_config_info (e.g. "cache_dtype", "gpu_memory_utilization"), None if absent."""
        return dict(self.cache_config).get(key)


def parse_vllm_metrics(text: str) -> VllmMetrics:
    """The server's figures, its engines summed (see the module doc). Raises MetricsFormatError when `text` is
    not Prometheus exposition text or holds no `vllm:` metric."""
    return combine_metrics(list(parse_vllm_engines(text).values()))


def parse_vllm_engines(text: str) -> dict[str, VllmMetrics]:
    """engine label -> that engine's figures, in engine order ("0", "1", ...; "" for a server without the label).
    Raises MetricsFormatError as `parse_vllm_metrics`."""
    samples = _samples(text)
    if not any(name.startswith("vllm:") for name, _, _ in samples):
        raise MetricsFormatError(
            "the body is Prometheus text but has no vllm: metric: is this the /metrics of a vLLM server?"
        )
    by_engine: dict[str, dict[str, list[tuple[dict[str, str], float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for name, labels, value in samples:
        if name.startswith("vllm:"):
            by_engine[labels.get(ENGINE_LABEL, NO_ENGINE)][name].append((labels, value))
    order = sorted(by_engine, key=lambda e: (not e.isdigit(), int(e) if e.isdigit() else 0, e))
    return {engine: _engine_metrics(engine, by_engine[engine]) for engine in order}


def combine_metrics(parts: list[VllmMetrics]) -> VllmMetrics:
    """The sum of engines or servers (see the module doc). An empty list gives an all-None VllmMetrics."""
    if not parts:
        return VllmMetrics()
    values: dict[str, object] = {}
    for f in fields(VllmMetrics):
        present = [getattr(p, f.name) for p in parts if getattr(p, f.name) is not None]
        if f.name in ("engines", "model_names"):
            values[f.name] = tuple(dict.fromkeys(v for p in parts for v in getattr(p, f.name)))
        elif f.name == "legacy_names":
            values[f.name] = any(p.legacy_names for p in parts)
        elif f.name == "kv_cache_usage":
            values[f.name] = _mean_usage(parts)
        elif f.name == "cache_config":
            values[f.name] = next((p.cache_config for p in parts if p.cache_config), ())
        elif f.name == "block_size":
            values[f.name] = present[0] if present and len(set(present)) == 1 else None
        elif not present:
            values[f.name] = None
        elif isinstance(present[0], Histogram):
            values[f.name] = merge_histograms(present)
        else:
            values[f.name] = sum(present)
    return VllmMetrics(**values)


def _mean_usage(parts: list[VllmMetrics]) -> float | None:
    usable = [p for p in parts if p.kv_cache_usage is not None]
    if not usable:
        return None
    if all(p.num_gpu_blocks for p in usable):
        total = sum(p.num_gpu_blocks for p in usable)
        return sum(p.kv_cache_usage * p.num_gpu_blocks for p in usable) / total
    return sum(p.kv_cache_usage for p in usable) / len(usable)


def _engine_metrics(engine: str, series: dict[str, list[tuple[dict[str, str], float]]]) -> VllmMetrics:
    values: dict[str, object] = {}
    legacy = False

    def first_name(names: tuple[str, ...], suffix: str) -> str | None:
        nonlocal legacy
        for i, name in enumerate(names):
            if name + suffix in series:
                legacy = legacy or i > 0
                return name
        return None

    for field_name, names in GAUGES.items():
        if (name := first_name(names, "")) is not None:
            values[field_name] = sum(v for _, v in series[name])
    for field_name, names in COUNTERS.items():
        if (name := first_name(names, "_total")) is not None:
            values[field_name] = sum(v for _, v in series[name + "_total"])
    for field_name, names in HISTOGRAMS.items():
        if (name := first_name(names, "_bucket")) is not None:
            values[field_name] = _histogram(name, series)
    if "kv_cache_usage" in values:  # one engine, several model_name series: the mean, not the sum
        name = first_name(GAUGES["kv_cache_usage"], "")
        values["kv_cache_usage"] = values["kv_cache_usage"] / len(series[name])
    for labels, _ in series.get(CACHE_CONFIG_INFO, []):
        values["num_gpu_blocks"] = _int_label(labels, "num_gpu_blocks")
        values["block_size"] = _int_label(labels, "block_size")
        values["cache_config"] = tuple(sorted((k, v) for k, v in labels.items() if k != ENGINE_LABEL))
    models = tuple(
        dict.fromkeys(lb[MODEL_NAME_LABEL] for s in series.values() for lb, _ in s if MODEL_NAME_LABEL in lb)
    )
    return VllmMetrics(**values, engines=(engine,), model_names=models, legacy_names=legacy)


def _histogram(name: str, series: dict[str, list[tuple[dict[str, str], float]]]) -> Histogram:
    """One histogram per label set (minus `le`), then their sum."""
    buckets: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for labels, value in series[name + "_bucket"]:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        try:
            bound = float(labels.get("le", "+Inf"))
        except ValueError:
            raise MetricsFormatError(
                f"not a Prometheus exposition: {name}_bucket has an `le` label that is not a number"
            ) from None
        buckets[key].append((bound, value))
    sums = {tuple(sorted(lb.items())): v for lb, v in series.get(name + "_sum", [])}
    counts = {tuple(sorted(lb.items())): v for lb, v in series.get(name + "_count", [])}
    parts = []
    for key, pairs in buckets.items():
        count = counts.get(key, max(c for _, c in pairs))
        parts.append(Histogram.from_buckets(pairs, sums.get(key, math.nan), count))
    return merge_histograms(parts)


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(float(labels[key]))
    except (KeyError, ValueError, OverflowError):  # absent, "None" before profiling, "inf"
        return None


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample; MetricsFormatError naming the first bad line. Messages name
    the line number and what was expected, never the body's content (it may be a service nobody meant to show)."""
    if not isinstance(text, str):
        raise MetricsFormatError(f"metrics must be text, got {type(text).__name__}")
    head = text.lstrip()[:200].lower()
    if head.startswith(("<!doctype", "<html", "<?xml", "<")):
        raise MetricsFormatError(
            "not a Prometheus exposition: the body is an HTML/XML page; the URL may point at a proxy's error page "
            "or the wrong path (vLLM serves /metrics)",
            1,
        )
    try:
        return [
            (s.name, dict(s.labels), float(s.value))
            for f in text_string_to_metric_families(text)
            for s in f.samples
        ]
    except Exception:  # the parser's errors quote the line; any of them means the same: not an exposition
        number = _first_bad_line(text)
        raise MetricsFormatError(
            f"not a Prometheus exposition: line {number:,} is not a sample; expected `name{{labels}} value` lines "
            "and # comments, as vLLM's /metrics serves them",
            number,
        ) from None


def _first_bad_line(text: str) -> int:
    """The 1-based number of the first line the parser refuses on its own (the last line when none does: the
    text as a whole is cut or inconsistent)."""
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except Exception:
            return number
    return len(lines)
