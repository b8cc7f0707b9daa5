"""A window of a server's traffic read from two scrapes of its /metrics: what it served between them.

`observe_window(before, after, seconds)` subtracts the histograms and counters (`Histogram.minus`: a server that
restarted in between gives the later scrape whole) and derives the observed workload and latency:

- request_rate = finished requests (the e2e histogram's count delta) / seconds;
- mean prompt / output tokens per finished request: exact (the request_prompt_tokens / request_generation_tokens
  sums over their counts); their distributions only to vLLM's 1-2-5 buckets;
- TTFT, TPOT percentiles: Prometheus's histogram_quantile over the window's bucket deltas (linear inside a
  bucket, so only as fine as vLLM's buckets: e.g. a TPOT between 50 and 75 ms is placed by interpolation).
  TPOT is vLLM's per-request `request_time_per_output_token_seconds` (decode time / (output tokens - 1), 0 for
  one-token outputs) when the server publishes it, else the per-token inter-token latency histogram (`tpot_source`).

What two scrapes cannot say: anything per request (which prompt had which latency), the order of arrivals (the
rate is a mean: bursts are invisible), requests still running at the second scrape (only finished ones count).
"""

import math
from dataclasses import dataclass

from core.errors import InvalidArgumentError
from core.live.histogram import Histogram
from core.live.metrics import VllmMetrics

REQUIRED = ("ttft", "itl", "e2e", "prefill_time", "request_prompt_tokens", "request_generation_tokens")
LATENCY_KEYS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")


@dataclass(frozen=True)
class ObservedWindow:
    """The window's histograms (deltas) and what they say. requests: finished in the window; request_rate: per
    second; mean_prompt_tokens / mean_output_tokens: per finished request; tpot: the histogram TPOT is read from,
    tpot_source its metric ("request_tpot" or "itl"). Histograms a server does not publish are None."""

    seconds: float
    requests: float
    request_rate: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    prefill_time: Histogram
    prompt_tokens: Histogram
    output_tokens: Histogram
    tpot: Histogram
    tpot_source: str
    decode_time: Histogram | None = None
    queue_time: Histogram | None = None
    iteration_tokens: Histogram | None = None

    @property
    def steps(self) -> float | None:
        """Engine steps in the window (iteration_tokens_total's count), None when not published."""
        return self.iteration_tokens.count if self.iteration_tokens is not None else None

    def latency(self) -> dict[str, float | None]:
        """LATENCY_KEYS -> seconds, by histogram_quantile over the window's buckets (None with no observation)."""
        return {
            "ttft_p50_s": self.ttft.quantile(0.5),
            "ttft_p95_s": self.ttft.quantile(0.95),
            "tpot_p50_s": self.tpot.quantile(0.5),
            "tpot_p95_s": self.tpot.quantile(0.95),
        }


def _delta(before: VllmMetrics, after: VllmMetrics, name: str) -> Histogram | None:
    new = getattr(after, name)
    if new is None:
        return None
    old = getattr(before, name)
    return new if old is None else new.minus(old)


def observe_window(before: VllmMetrics, after: VllmMetrics, seconds: float) -> ObservedWindow:
    """The traffic between two scrapes of one server taken `seconds` apart. Raises InvalidArgumentError when
    seconds is not positive or the server lacks a histogram the comparison needs (REQUIRED; vLLM V1 and
    core.serve publish them all)."""
    if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
        raise InvalidArgumentError(f"the window must last a positive number of seconds, got {seconds!r}")
    parts = {
        name: _delta(before, after, name)
        for name in (*REQUIRED, "request_tpot", "decode_time", "queue_time", "iteration_tokens")
    }
    missing = [name for name in REQUIRED if parts[name] is None]
    if missing:
        raise InvalidArgumentError(
            f"the server's /metrics lacks {', '.join(missing)}: planned vs observed needs vLLM V1's request "
            "histograms (vllm:request_prefill_time_seconds, vllm:request_prompt_tokens, ...)"
        )
    requests = parts["e2e"].count
    prompts, outputs = parts["request_prompt_tokens"], parts["request_generation_tokens"]
    tpot_source = "request_tpot" if parts["request_tpot"] is not None else "itl"
    return ObservedWindow(
        seconds=float(seconds),
        requests=requests,
        request_rate=requests / seconds,
        mean_prompt_tokens=prompts.mean or 0.0,
        mean_output_tokens=outputs.mean or 0.0,
        ttft=parts["ttft"],
        itl=parts["itl"],
        e2e=parts["e2e"],
        prefill_time=parts["prefill_time"],
        prompt_tokens=prompts,
        output_tokens=outputs,
        tpot=parts[tpot_source],
        tpot_source=tpot_source,
        decode_time=parts["decode_time"],
        queue_time=parts["queue_time"],
        iteration_tokens=parts["iteration_tokens"],
    )


def bucketed(values, bounds: tuple[float, ...]) -> Histogram:
    """`values` (seconds, or tokens) counted into cumulative buckets of upper `bounds` (+inf appended) as
    Prometheus would: so that planned figures are read with the same histogram_quantile as observed ones."""
    edges = (*bounds, math.inf)
    values = [float(v) for v in values]
    cumulative = tuple(float(sum(1 for v in values if v <= b)) for b in edges)
    return Histogram(edges, cumulative, float(sum(values)), float(len(values)))
