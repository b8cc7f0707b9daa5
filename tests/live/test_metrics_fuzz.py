"""Property: the Prometheus parser, given a real exposition mutated at random (characters deleted, inserted,
flipped, lines duplicated, swapped, replaced, the body cut), either returns figures the Live page can use (every
derived figure computes: hit rate, percentiles, windows, fleet sums) or raises MetricsFormatError; never another
exception, and its message never quotes the body.

Seeds: expositions written by prometheus_client (the library vLLM uses) with vLLM's names, types, labels and
buckets: tests/live/exposition.py (current and pre-0.9 names, two engines) and core.serve's own /metrics after
real requests. No capture of a running vLLM process is available offline, so these stand in for one."""

import functools
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.engine import Engine, SamplingParams
from core.engine.config import TINY_LLAMA
from core.errors import MetricsFormatError
from core.live.metrics import VllmMetrics, combine_metrics, parse_vllm_engines, parse_vllm_metrics
from core.serve.exporter import ServerMetrics
from core.serve.loop import EngineLoop
from tests.live.exposition import EngineState, vllm_exposition

MARKER = "SECRETXYZ"  # inserted text the error messages must never repeat
SYNTAX = st.sampled_from(
    [*list('{}"=,#\n\\ .-+eE0123456789_:abcxyzInfNa'), "+Inf", "NaN", "le=", "_total", MARKER]
)
INSERT = st.lists(SYNTAX | st.characters(exclude_categories=()), min_size=1, max_size=12).map("".join)


def _served_exposition() -> str:
    """core.serve's /metrics after three real requests through its engine loop (the tiny model)."""
    engine = Engine.from_config(
        TINY_LLAMA, num_blocks=32, block_size=4, device="cpu", warmup=False, enable_prefix_caching=True
    )
    metrics = ServerMetrics("tiny", block_size=4, num_gpu_blocks=32, prefix_caching=True, dtype="float32")
    loop = EngineLoop(engine, metrics)
    loop.start()
    try:
        done = []
        for i in range(3):
            loop.submit(
                f"r{i}",
                list(range(1, 12)),
                SamplingParams(4, temperature=0.0, ignore_eos=True),
                lambda out, err: done.append(out) if out is not None and out.finished else None,
            )
        deadline = time.monotonic() + 30
        while len(done) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
    return metrics.render().decode()


@functools.cache
def seeds() -> tuple[str, str, str]:
    """Two engines with current names, one server with pre-0.9 names, core.serve's own /metrics."""
    return (
        vllm_exposition({"0": EngineState(), "1": EngineState(usage=0.7, running=9, num_gpu_blocks=500)}),
        vllm_exposition({"": EngineState()}, legacy=True),
        _served_exposition(),
    )


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(seeds()))
    for op in draw(
        st.lists(
            st.sampled_from(["delete", "insert", "flip", "dup", "swap", "replace", "cut"]),
            min_size=1,
            max_size=4,
        )
    ):
        i = draw(st.integers(0, len(text)))
        j = min(len(text), i + draw(st.integers(1, 40)))
        lines = text.split("\n")
        k, m = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "insert":
            text = text[:i] + draw(INSERT) + text[i:]
        elif op == "flip" and i < len(text):
            text = text[:i] + chr(ord(text[i]) ^ (1 << draw(st.integers(0, 6)))) + text[i + 1 :]
        elif op == "dup":
            text = "\n".join([*lines[: k + 1], lines[k], *lines[k + 1 :]])
        elif op == "swap":
            lines[k], lines[m] = lines[m], lines[k]
            text = "\n".join(lines)
        elif op == "replace":
            lines[k] = draw(INSERT)
            text = "\n".join(lines)
        elif op == "cut":
            text = text[:i]
    return text


def _use(m: VllmMetrics) -> None:
    """Everything the Live page derives from one scrape."""
    assert isinstance(m, VllmMetrics)
    _ = m.prefix_cache_hit_rate, m.cache_setting("block_size")
    for h in (m.ttft, m.itl, m.e2e, m.queue_time):
        if h is not None:
            for q in (0.0, 0.5, 0.9, 0.99, 1.0):
                h.quantile(q)
            _ = h.mean
            h.minus(h)
    combine_metrics([m, m])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated())
def test_mutated_expositions_parse_or_are_refused_cleanly(text):
    try:
        m = parse_vllm_metrics(text)
    except MetricsFormatError as err:
        assert MARKER not in str(err) and str(err)
        assert err.line_number is None or 1 <= err.line_number <= text.count("\n") + 1
        return
    _use(m)
    for engine in parse_vllm_engines(text).values():
        _use(engine)


def test_the_seeds_parse_as_they_are():
    """The unmutated seeds are real expositions: every one parses, with the figures written into it."""
    two, legacy, served = seeds()
    assert parse_vllm_metrics(two).num_requests_running == 3 + 9
    assert parse_vllm_metrics(legacy).legacy_names
    m = parse_vllm_metrics(served)
    assert (m.num_gpu_blocks, m.block_size, m.request_success, m.generation_tokens) == (32, 4, 3, 12)
