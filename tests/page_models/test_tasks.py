"""The job entry points the pages submit: same numbers as calling core directly (the simulator, the kernels, the
engine and its sharing measurement), limits checked before anything is allocated, and the limit errors arrive
intact through a worker."""

import pickle
import time

import pandas as pd
import pytest

from core.device import default_device
from core.engine import TIMED_COLUMNS, Engine, ModelConfig, SamplingParams
from core.engine.config import TINY_LLAMA
from core.engine.engine import engine_bytes
from core.engine.sharing import measure_sharing
from core.errors import InvalidArgumentError, LimitExceededError, MemoryBudgetError
from core.jobs import JobPool
from core.kernels.timing import KernelConfig, correctness, sweep_contexts
from core.limits import Limits
from core.page_models import engines
from core.page_models.simulator import SimulatorParams, run_comparison, steady_summary
from core.page_models.tasks import (
    MAX_ENGINE_SEQUENCES,
    compare_policies,
    engine_sharing,
    generate_outputs,
    kernel_correctness,
    kernel_sweep,
)

SMALL = SimulatorParams(num_requests=40, rate=8.0, policies=("paged", "orca-max"))
TINY_KERNEL = KernelConfig(batch=2, context_len=64, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16)


def test_compare_policies_is_run_comparison_with_steady_summaries():
    results, summaries = compare_policies(SMALL)
    requests = SMALL.requests()
    reference = run_comparison(SMALL, requests)
    assert set(results) == set(reference) == {"paged", "orca-max"}
    for name, result in reference.items():
        assert summaries[name] == steady_summary(result, requests)
        assert len(results[name].steps) == len(result.steps)


def test_simulated_requests_are_checked_before_generating(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MAX_REQUESTS", "39")
    with pytest.raises(LimitExceededError, match=r"40 requests.*39.*PAGED_LAB_MAX_REQUESTS"):
        compare_policies(SMALL)


def test_kernel_jobs_match_timing_and_refuse_over_budget(monkeypatch):
    assert (
        kernel_correctness(TINY_KERNEL, ("torch",), "cpu").keys()
        == correctness(TINY_KERNEL, ["torch"]).keys()
    )
    sweep = kernel_sweep(TINY_KERNEL, ("torch",), "cpu", 1)
    assert sweep["contexts"] == sweep_contexts(64, 16) == [16, 32, 64]
    assert [row["context_len"] for row in sweep["rows"]] == [16, 32, 64] and sweep["copy_gbps"] > 0
    assert all(row["max_abs_err"] < 1e-4 for row in sweep["rows"])
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", str(TINY_KERNEL.footprint_bytes - 1))
    with pytest.raises(MemoryBudgetError):
        kernel_sweep(TINY_KERNEL, ("torch",), "cpu", 1)


@pytest.fixture(scope="module")
def worker_pool():
    """One spawned worker for the tests that go through a pool (starting one, which imports torch, took ~4 s per
    test). Its limit of 10 simulated requests is what the limit test trips; the Engine jobs count no requests."""
    pool = JobPool.from_limits(Limits(max_simulated_requests=10, workers=1))
    yield pool
    pool.close()


def test_a_limit_error_travels_back_from_the_worker_intact(worker_pool):
    pool = worker_pool
    pool.submit("limit", compare_policies, SMALL, None)
    deadline = time.monotonic() + 120
    while not (status := pool.poll("limit")).finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert isinstance(status.error, LimitExceededError)
    assert status.error.variable == "PAGED_LAB_MAX_REQUESTS" and "over this server's limit of 10" in str(
        status.error
    )


# ---- the Engine page's jobs ----------------------------------------------------------------------------------
ENGINE_PROMPTS = "1 17 42 7 99 3\n5 9 200 31\n400, 2, 88"
PROMPT_IDS = [[1, 17, 42, 7, 99, 3], [5, 9, 200, 31], [400, 2, 88]]


def _direct(params: SamplingParams, num_blocks: int = 48, block_size: int = 16) -> Engine:
    engine = Engine.from_config(
        TINY_LLAMA, seed=0, num_blocks=num_blocks, block_size=block_size, device=default_device()
    )
    engine.generate(PROMPT_IDS, params)
    return engine


def _completions(outputs) -> list:
    return [
        [(c.token_ids, round(c.cumulative_logprob, 5), c.finish_reason) for c in o.outputs] for o in outputs
    ]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(12, temperature=0.8, top_p=0.95, n=2, seed=0, ignore_eos=True),
        SamplingParams(6, beam_width=3, ignore_eos=True),
    ],
    ids=["sampling", "beams"],
)
def test_generate_outputs_is_a_direct_engine_generate(params):
    generation = generate_outputs("tiny", "", 48, 16, False, ENGINE_PROMPTS, params)
    engine = Engine.from_config(TINY_LLAMA, seed=0, num_blocks=48, block_size=16, device=default_device())
    reference = engine.generate(PROMPT_IDS, params)
    assert generation.prompt_token_ids == tuple(map(tuple, PROMPT_IDS))
    assert _completions(generation.outputs) == _completions(reference)
    untimed = [c for c in generation.run.steps.columns if c not in TIMED_COLUMNS]
    pd.testing.assert_frame_equal(generation.run.steps[untimed], engine.last_run.steps[untimed])
    assert generation.texts is None  # the tiny model has no tokenizer
    # it travels from a worker: the result pickles whole
    again = pickle.loads(pickle.dumps(generation))
    assert _completions(again.outputs) == _completions(reference)
    assert [s.step for s in again.run.snapshots] == [s.step for s in engine.last_run.snapshots]


def test_engine_bytes_is_what_the_engine_allocates():
    engine = _direct(SamplingParams(2, ignore_eos=True), num_blocks=40, block_size=8)
    allocated = engine.model.weight_bytes + sum(
        t.numel() * t.element_size() for t in (*engine.cache.key_cache, *engine.cache.value_cache)
    )
    config = ModelConfig.from_dict(TINY_LLAMA)
    assert engine_bytes(config, 40, 8, default_device()) == allocated


def test_engine_over_the_byte_limit_is_refused_before_anything_is_built(monkeypatch):
    class NoEngine:
        @staticmethod
        def from_config(*args, **kwargs):
            raise AssertionError("the engine was built before the limits were checked")

        from_pretrained = from_config

    needed = engine_bytes(ModelConfig.from_dict(TINY_LLAMA), 48, 16, default_device())
    params = SamplingParams(4, n=2, seed=0, ignore_eos=True)
    monkeypatch.setattr(engines, "Engine", NoEngine)
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", str(needed - 1))
    with pytest.raises(MemoryBudgetError, match=rf"{needed:,} bytes.*PAGED_LAB_MAX_BYTES"):
        generate_outputs("tiny", "", 48, 16, False, ENGINE_PROMPTS, params)
    # prompts x n over the cap, and no prompt at all: refused before the engine too (under any byte limit)
    monkeypatch.delenv("PAGED_LAB_MAX_BYTES")
    many = "\n".join(["1 2 3"] * (MAX_ENGINE_SEQUENCES // 16 + 1))
    with pytest.raises(InvalidArgumentError, match=r"65 prompts x 16 outputs each = 1,040 sequences"):
        generate_outputs("tiny", "", 48, 16, False, many, SamplingParams(4, n=16))
    with pytest.raises(InvalidArgumentError, match="at least one prompt"):
        generate_outputs("tiny", "", 48, 16, False, " \n\n", params)
    # exactly at the limit it runs
    monkeypatch.undo()
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", str(needed))
    assert len(generate_outputs("tiny", "", 48, 16, False, ENGINE_PROMPTS, params).outputs) == 3


def test_engine_sharing_is_measure_sharing_and_checks_the_budget_first(monkeypatch):
    small = (4, (2,), 16)
    fractions = []
    table = engine_sharing(*small, progress=lambda f, message: fractions.append(f))
    reference = measure_sharing(4, (2,), max_output_len=16)
    columns = ["mode", "width", "saving_pct", "mean_blocks_in_use", "mean_blocks_without_sharing", "steps"]
    pd.testing.assert_frame_equal(table[columns], reference[columns])
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 2  # per step
    monkeypatch.setattr("core.engine.sharing.Engine", None)  # building it would fail (AttributeError)
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", "100000")  # the weights alone take more
    with pytest.raises(MemoryBudgetError, match=r"sharing measurement.*PAGED_LAB_MAX_BYTES"):
        engine_sharing(*small)


def test_an_engine_run_through_the_pool_matches_the_direct_run(worker_pool):
    params = SamplingParams(8, n=2, seed=3, ignore_eos=True)
    pool = worker_pool
    pool.submit("engine", generate_outputs, "tiny", "", 48, 16, False, ENGINE_PROMPTS, params)
    deadline = time.monotonic() + 120
    while not (status := pool.poll("engine")).finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status.state == "done", status.error
    assert _completions(status.result.outputs) == _completions(
        Engine.from_config(
            TINY_LLAMA, seed=0, num_blocks=48, block_size=16, device=default_device()
        ).generate(PROMPT_IDS, params)
    )
    pool.submit("engine", generate_outputs, "tiny", "", 2_000_000, 16, False, ENGINE_PROMPTS, params)
    while not (status := pool.poll("engine")).finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status.state == "failed" and "PAGED_LAB_MAX_BYTES" in str(status.error)
    assert (
        isinstance(status.error, MemoryBudgetError)
        and status.error.requested_bytes > status.error.allowed_bytes
    )
