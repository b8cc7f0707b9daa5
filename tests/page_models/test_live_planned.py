"""The Live page's planned vs observed: the window it takes from the poll history, what it reports without enough
traffic or with a model it cannot plan, and a full plan of a simulated server read as scrapes."""

from dataclasses import replace

import pytest

from core.live.history import LiveHistory
from core.live.metrics import VllmMetrics
from core.page_models.live_planned import PlanCache, live_plan, window_scrapes
from tests.planning.observed.simulated_server import simulated_server
from tests.real_model import SMOLLM2_CONFIG

VALUES = {
    "pvo_window": 120.0,
    "pvo_seqs": 8,
    "pvo_tokens": 2048,
    "model": "none",
    "gpu": "h100-80gb",
    "tp": 1,
}
ROOFS = {"memory_bandwidth": 26e9, "peak_flops": 80e9}


def scrape(window, name="tiny", blocks=64) -> VllmMetrics:
    return VllmMetrics(
        ttft=window.ttft,
        itl=window.itl,
        e2e=window.e2e,
        prefill_time=window.prefill_time,
        request_prompt_tokens=window.prompt_tokens,
        request_generation_tokens=window.output_tokens,
        request_tpot=window.tpot,
        num_gpu_blocks=blocks,
        block_size=16,
        model_names=(name,),
    )


def history_of(*polls) -> LiveHistory:
    h = LiveHistory()
    for t, m in polls:
        h.record(t, {"srv": m})
    return h


def test_window_is_the_last_poll_against_the_earliest_within_the_window():
    a, b, c = VllmMetrics(num_preemptions=1), VllmMetrics(num_preemptions=2), VllmMetrics(num_preemptions=3)
    h = history_of((0.0, a), (100.0, b), (150.0, c))
    assert window_scrapes(h, "srv", 60.0) == (b, c, 50.0)
    assert window_scrapes(h, "srv", 1000.0) == (a, c, 150.0)
    assert window_scrapes(h, "srv", 10.0) == (b, c, 50.0)  # the window holds one poll: the previous one
    assert window_scrapes(history_of((0.0, a)), "srv", 60.0) is None


def empty_like(window) -> VllmMetrics:
    """A scrape before any traffic: every histogram of the window with zero counts."""

    def zero(h):
        return replace(h, cumulative=tuple(0.0 for _ in h.cumulative), sum=0.0, count=0.0)

    return scrape(
        replace(
            window,
            ttft=zero(window.ttft),
            itl=zero(window.itl),
            e2e=zero(window.e2e),
            prefill_time=zero(window.prefill_time),
            prompt_tokens=zero(window.prompt_tokens),
            output_tokens=zero(window.output_tokens),
            tpot=zero(window.tpot),
        )
    )


def test_reasons_without_enough_traffic_or_a_plannable_model():
    _, small = simulated_server(n=10)
    plan = live_plan(
        history_of((0.0, empty_like(small)), (60.0, scrape(small))), "srv", VALUES, lambda: ROOFS
    )
    assert plan.result is None and not plan.problem and "10 request(s)" in plan.reason
    _, window = simulated_server(n=30)
    h = history_of((0.0, empty_like(window)), (60.0, scrape(window, name="someone/unknown-7b")))
    plan = live_plan(h, "srv", VALUES, lambda: ROOFS)
    assert plan.result is None and plan.problem and "not a planner preset" in plan.reason


def test_a_core_serve_window_is_planned_on_the_cpu_roofs():
    """The simulated server has SmolLM2-135M's shapes (tests.live.test_planned.BASE): planned as the real model
    it converges; planned as the tiny model (a 0.6 MB roofline) no FLOP/s efficiency in (0, 1] explains its
    prefill times, and the fit says it did not converge rather than pretending."""
    from core.engine.fetch import cached_model

    _, window = simulated_server(n=40)
    calls = []
    tiny = live_plan(
        history_of((0.0, empty_like(window)), (window.seconds, scrape(window))),
        "srv",
        VALUES,
        lambda: calls.append(1) or ROOFS,
    )
    assert tiny.planned_with == "tiny (float32) on this machine's CPU" and calls == [1]
    assert tiny.result is not None and not tiny.result.fit.converged
    assert tiny.result.fit.at_bound == ("flops_efficiency",)  # held at 1e-3: said, as the page shows it
    if cached_model("smollm2-135m-instruct") is None:
        pytest.skip("the real model is not in the model cache")
    h = history_of((0.0, empty_like(window)), (window.seconds, scrape(window, "smollm2-135m-instruct")))
    plan = live_plan(h, "srv", VALUES, lambda: ROOFS)
    assert plan.result is not None and plan.result.fit.converged and plan.result.window.requests == 40
    # the bandwidth efficiency is held at 1 (the truth has 0.8) and not identifiable from histograms: the fitted
    # overhead absorbs it on average, but the TPOT tail moves (measured: p50s <= 17%, TPOT p95 31%)
    assert max(plan.result.rel_errors.values()) < 0.5
    cache = PlanCache()
    first = cache.get("k", 0.0, lambda: plan)
    assert cache.get("k", 30.0, lambda: pytest.fail("recomputed within REFRESH_S")) is first
    assert cache.get("k", 61.0, lambda: replace(plan, planned_with="again")).planned_with == "again"


def test_a_vllm_model_that_is_no_preset_is_planned_from_its_config(tmp_path):
    """A vLLM serving "smollm2" (no preset) on this machine: planned from the config.json its /v1/models root
    names, on the CPU roofs, in bfloat16 (vLLM's CPU dtype for a float32 checkpoint), with vLLM's CPU limits."""
    from core.live.served_model import ServedModel
    from core.page_models.live_planned import served_config

    (tmp_path / "config.json").write_text(__import__("json").dumps(SMOLLM2_CONFIG))
    served = ServedModel("smollm2", str(tmp_path), 2048)
    config = served_config("127.0.0.1", served, gpu_here=False)
    assert config.on_this_cpu and config.max_model_len == 2048 and config.config == SMOLLM2_CONFIG
    assert served_config("10.1.2.3", served, gpu_here=False) is None  # a remote folder is not read
    given = served_config("10.1.2.3", served, SMOLLM2_CONFIG, gpu_here=False)
    assert given.origin == "the config.json given" and not given.on_this_cpu
    assert not served_config("127.0.0.1", served, gpu_here=True).on_this_cpu

    _, window = simulated_server(n=30)
    h = history_of((0.0, empty_like(window)), (window.seconds, scrape(window, name="smollm2")))
    refused = live_plan(h, "srv", VALUES, lambda: ROOFS)
    assert refused.problem and "not a planner preset" in refused.reason
    plan = live_plan(h, "srv", {**VALUES, "pvo_seqs": 0, "pvo_tokens": 0}, lambda: ROOFS, config)
    assert plan.result is not None, plan.reason
    assert plan.planned_with == f"smollm2 (bfloat16, {tmp_path}/config.json) on this machine's CPU"
    assert plan.roof == "the matmul roof sampled on this CPU"  # what the caption's FLOP/s share is of
    assert plan.result.prior is None
    # a server started with --dtype float32: told so, the plan's weights and KV are float32 (twice the bytes)
    values = {**VALUES, "pvo_seqs": 0, "pvo_tokens": 0, "dtype": "float32"}
    f32 = live_plan(h, "srv", values, lambda: ROOFS, config)
    assert f32.planned_with == f"smollm2 (float32, {tmp_path}/config.json) on this machine's CPU"
    assert f32.result.fit.model.weight_bytes == 2 * plan.result.fit.model.weight_bytes
    on_gpu = live_plan(h, "srv", VALUES, lambda: ROOFS, given)
    assert on_gpu.planned_with == "smollm2 (the config.json given) on 1 x h100-80gb", on_gpu.reason
    assert on_gpu.roof == "the GPU's datasheet peak"
    broken = live_plan(h, "srv", VALUES, lambda: ROOFS, replace(given, config={"model_type": "llama"}))
    assert broken.problem and "cannot run" in broken.reason  # a config that names no model: said, not raised
