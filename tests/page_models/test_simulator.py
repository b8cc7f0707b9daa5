"""The page's parameter set: capacity sources, the step-time model from the model + GPU presets, the memo."""

import math

import pytest

from core.errors import InvalidArgumentError
from core.page_models.simulator import (
    DEFAULT_PARAMS,
    SimulatorParams,
    run_comparison,
    steady_summary,
)
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.step_time import from_specs, opt_13b_a100
from core.planning.memory.plan import plan


def test_paper_preset_step_model_is_the_documented_one():
    assert from_specs(MODELS["opt-13b"], GPUS["a100-40gb"]) == opt_13b_a100()
    assert DEFAULT_PARAMS.config().step_time == opt_13b_a100()
    assert DEFAULT_PARAMS.kv_capacity_tokens() == 15_728


def test_capacity_from_the_planner_and_raw():
    params = SimulatorParams(capacity_source="model", model="llama-3.1-8b", gpu="h100-80gb")
    expected = plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], max_model_len=2048).kv_tokens
    assert params.kv_capacity_tokens() == expected
    assert SimulatorParams(capacity_source="raw", raw_capacity_tokens=4096).kv_capacity_tokens() == 4096
    with pytest.raises(InvalidArgumentError):
        SimulatorParams(capacity_source="guess").kv_capacity_tokens()


def test_run_comparison_reports_progress_and_steady_summary():
    params = SimulatorParams(num_requests=60, rate=4.0, policies=("paged", "orca-pow2"))
    seen = []
    results = run_comparison(params, progress=lambda f, name: seen.append((f, name)))
    assert list(results) == ["paged", "orca-pow2"]
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    summary = steady_summary(results["paged"], params.requests())
    assert 0 < summary["num_steps"] < len(results["paged"].steps)
    with pytest.raises(InvalidArgumentError, match="at least one policy"):
        run_comparison(SimulatorParams(policies=()))


def test_a_burst_is_summarised_until_half_the_requests_have_finished():
    """300 requests at t = 0 on the paper's cache under Orca (Max): 7 run at once (7 x 2,048 <= 15,728), the rest
    wait. The summary covers the steps up to the 150th finish (the lower median), where exactly 7 always run; the
    whole run's average is lower (the drain)."""
    params = SimulatorParams(num_requests=300, rate=math.inf, policies=("orca-max",))
    result = run_comparison(params)["orca-max"]
    summary = steady_summary(result, params.requests())
    half = sorted(result.requests["finish_time"])[149]
    assert summary["num_steps"] == int((result.steps["time_s"] <= half).sum()) < len(result.steps)
    assert summary["avg_batched_requests"] == 7.0 and result.summary["avg_batched_requests"] < 7.0
