"""End to end: planned vs observed on a live `python -m core.serve --model smollm2-135m-instruct` (the real model,
float32 on this CPU) on loopback. A seeded Poisson load (stops by itself) runs between two scrapes of /metrics;
core.live fits the step-time model to the server's own histograms and plans the window's TTFT / TPOT p50 / p95
with the simulator; the planned figures must land within BOUNDS of the observed ones.

BOUNDS (docs/live-planned.md): measured on the 2-core shared machine (other sessions running), seven runs:
TTFT p50 0.1-6%, TPOT p50 0.7-19%, TTFT p95 5-51%, TPOT p95 0.2-22% (one more run did not converge before the
fit was given headroom over the sampled CPU roof). The buckets set the scale: TPOT's run 100, 150, 200 ms, so a p50 near
150 ms reads 10-15% low on one side of the bound and high on the other (one bucket is 33% there); a p95 of 30
requests is the 2nd-largest value, and TTFT's buckets jump from 1 s to 2.5 s, so interpolation inside that bucket
alone can move it by a factor 2.5. So: p50s within 40% (a bucket plus margin), p95s within a factor 2 (relative
error < 1). Either still fails a plan off by a factor (a wrong unit, a workload read wrong, a fit that does not
converge: asserted too), which is what the test is for."""

import threading
import time

import numpy as np
import pytest

from core.live.metrics import parse_vllm_metrics
from core.live.window import observe_window
from core.planning.cost.cpu_roofline import measure_roofs
from core.planning.observed.planned import MEASURED_ROOF_HEADROOM, FitSettings, plan_against_observed
from core.planning.observed.planned_model import core_serve_step_model, limits_from_metrics
from core.serve.launcher import LoopbackServer
from tests.real_model import REAL_MODEL, real_model_path

BOUNDS = {"ttft_p50_s": 0.4, "tpot_p50_s": 0.4, "ttft_p95_s": 1.0, "tpot_p95_s": 1.0}
REQUESTS, RATE = 30, 1.0  # requests, per second: about half of what the server can take at 8 sequences
MAX_NUM_SEQS = 8


def poisson_load(server: LoopbackServer, seed: int = 0) -> list[int]:
    """Send REQUESTS completions (random token prompts of 16-96 tokens, 8-40 output tokens, greedy, EOS ignored)
    at Poisson arrivals; returns the HTTP statuses once every request finished."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / RATE, REQUESTS)
    prompts = [rng.integers(100, 40_000, int(rng.integers(16, 97))).tolist() for _ in range(REQUESTS)]
    outputs = rng.integers(8, 41, REQUESTS).tolist()
    statuses: list[int] = []

    def send(prompt, tokens):
        body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        statuses.append(server.post("/v1/completions", body, timeout=300)[0])

    threads = []
    for gap, prompt, tokens in zip(gaps, prompts, outputs, strict=True):
        time.sleep(gap)
        threads.append(threading.Thread(target=send, args=(prompt, tokens), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(300)
    return statuses


@pytest.fixture(scope="module")
def server():
    real_model_path()  # skips outside CI when the model cannot be fetched
    s = LoopbackServer(
        REAL_MODEL,
        num_blocks=256,
        events=False,
        startup_s=300,
        extra_args=("--max-num-seqs", str(MAX_NUM_SEQS)),
    )
    yield s
    s.stop()


def test_planned_matches_observed_on_core_serve(server):
    for _ in range(3):  # warm-up: the first steps of a fresh process are slow
        server.post("/v1/completions", {"prompt": list(range(100, 164)), "max_tokens": 8, "temperature": 0})
    before = parse_vllm_metrics(server.get("/metrics")[1].decode())
    started = time.monotonic()
    statuses = poisson_load(server)
    seconds = time.monotonic() - started
    after = parse_vllm_metrics(server.get("/metrics")[1].decode())
    assert statuses == [200] * REQUESTS
    window = observe_window(before, after, seconds)
    assert window.requests == REQUESTS and window.tpot_source == "request_tpot"
    roofs = measure_roofs()
    base = core_serve_step_model(REAL_MODEL, roofs, after.cache_setting("cache_dtype") or "float32")
    limits = limits_from_metrics(
        after, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=2048, max_model_len=2048
    )
    result = plan_against_observed(window, base, limits, FitSettings(flops_headroom=MEASURED_ROOF_HEADROOM))
    print(result.to_dict())  # the measured errors, for docs/live-planned.md (pytest -s)
    assert result.fit.converged, result.fit.to_dict()
    for key, err in result.rel_errors.items():
        assert err is not None and err < BOUNDS[key], (key, result.planned, result.observed)
