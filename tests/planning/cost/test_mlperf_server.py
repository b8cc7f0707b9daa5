"""Issue 40's outside check (`core.planning.cost.fits.mlperf_server`): Red Hat's MLPerf v5.1 Llama-3.1-8B Server run
on one H100 with vLLM 0.10.0, never fitted on. The run's own arithmetic, the bound worked by hand for one split of
the step, and the figures docs/slo.md states and bench/results/mlperf-check.json saved."""

import json

import pytest

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.fits import mlperf_server as ms
from core.planning.cost.fits.engine_profiles import engine_step_defaults
from core.planning.cost.step_time import from_specs
from tests.conftest import ROOT

RUN = ms.REDHAT_H100


def test_the_runs_own_arithmetic():
    # Little's law: 39.56 queries/s x 3.318 s = 131.25 requests in the server; ~129 output tokens a query (5,103.99
    # tokens/s over 39.56 queries/s), the harness's max_tokens of 128 nearly always reached
    assert RUN.running == pytest.approx(131.25, abs=0.01) and ms.RUNNING == 131
    assert RUN.output_tokens_per_s / RUN.completed_qps == pytest.approx(129.0, abs=0.05)
    # within the Server targets: TTFT p99 <= 2 s, TPOT p99 <= 100 ms
    assert RUN.ttft_s["p99"] <= RUN.targets_s["ttft_p99"] and RUN.tpot_s["p99"] <= RUN.targets_s["tpot_p99"]


def test_the_bound_is_the_longest_split_worked_by_hand():
    """At 256-token prompts: 1,024 - d prefill tokens in chunks of 256 (the last one c < 256 tokens, the end of its
    prompt: 256 - c tokens before it read and attended), a chunk's pairs c x prior + c (c + 1) / 2; d decodes each
    read 256 + 128 tokens. The bound is the longest of those steps, and a longer prompt never shortens it."""
    step = from_specs(
        MODELS["llama-3.1-8b"], GPUS["h100-80gb"], 1, "fp8", "auto", **engine_step_defaults("vllm")
    )
    by_hand = []
    for d in range(ms.RUNNING + 1):
        chunks = [256] * ((1024 - d) // 256) + ([(1024 - d) % 256] if (1024 - d) % 256 else [])
        prior = [256 - c for c in chunks]
        pairs = d * 384 + sum(c * p + c * (c + 1) / 2 for c, p in zip(chunks, prior, strict=True))
        by_hand.append(step.step_seconds(1024, d * 384 + sum(prior), pairs, output_tokens=d + len(chunks)))
    assert ms.full_step_seconds("vllm", 256) == pytest.approx(max(by_hand), rel=1e-12)
    bounds = [ms.full_step_seconds("vllm-cross-model", n) for n in (256, 1024, 2048, 4096)]
    assert bounds == sorted(bounds)
    # twice the average running requests: the same bound at 1,024-token prompts (compute-bound), longer at 2,048
    assert ms.full_step_seconds("vllm-cross-model", 1024, running=262) == pytest.approx(bounds[1], abs=2e-5)
    assert ms.full_step_seconds("vllm-cross-model", 2048, running=200) == pytest.approx(0.02162, abs=1e-5)


def test_the_stated_figures_are_computed_and_saved():
    """docs/slo.md 2 and the README: the cross-model profile's full step 19.98 / 20.56 ms (prompts up to 1,024 /
    2,048 tokens) against the measured TPOT p50 of 23.64 ms, under by at least 13 %; the single-model profile 42.49 /
    43.15 ms, over by 80 % (issue 40's first finding, "about 1.8x"); bench/results/mlperf-check.json holds them."""
    check = ms.outside_check()
    cross, single = check["profiles"]["vllm-cross-model"], check["profiles"]["vllm"]
    assert (cross["1024"]["full_step_ms"], cross["2048"]["full_step_ms"]) == pytest.approx(
        (19.98, 20.56), abs=0.01
    )
    assert cross["2048"]["vs_measured_tpot_p50"] == pytest.approx(-0.13, abs=0.001)
    assert (single["1024"]["full_step_ms"], single["2048"]["full_step_ms"]) == pytest.approx(
        (42.49, 43.15), abs=0.01
    )
    assert single["1024"]["vs_measured_tpot_p50"] == pytest.approx(0.797, abs=0.001)
    saved = json.loads((ROOT / "bench" / "results" / "mlperf-check.json").read_text())
    saved.pop("elapsed_s")
    assert saved == check
