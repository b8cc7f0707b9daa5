"""A ramp run as inference-perf runs it (`core.serving.staged_run`): each stage starts a fixed gap after the last
request of the stage before finished; the run equals one fresh fleet simulation of the requests at those times;
a client timeout in `ramp_report` worked by hand."""

import numpy as np
import pandas as pd
import pytest

from core.errors import InvalidArgumentError
from core.planning.cost.step_model import StepTimeModel
from core.serving.fleet import Fleet, simulate_fleet
from core.serving.memory_policies import paged
from core.serving.resume import SimulationSession
from core.serving.simulator import SimulatorConfig
from core.serving.staged_run import STAGE_GAP_S, drained_ramp
from core.serving.staged_workload import SharedPrefixPrompts, Stage, ramp_report, staged_requests

SLOPED = StepTimeModel(0.0, 0.0, 0.0, 0.0, 1e12, 1e15, overhead_s=0.004, per_token_overhead_s=2e-5)
CONFIG = SimulatorConfig(
    kv_capacity_tokens=2400, max_seq_len=2048, step_time=SLOPED, max_snapshots=1, max_num_batched_tokens=512
)
PROMPTS = SharedPrefixPrompts(6, 3, 400, 100, 30)
RAMP = [Stage(30, 2), Stage(200, 1), Stage(30, 1)]


def _drained(routing="prefix-aware", gap=STAGE_GAP_S):
    session = SimulationSession(paged(16, enable_prefix_caching=True), CONFIG, fleet=Fleet(2, routing))
    return drained_ramp(RAMP, PROMPTS, session, 0, gap)


@pytest.mark.parametrize("routing", ["prefix-aware", "round-robin"])
def test_each_stage_starts_a_gap_after_the_last_one_finished(routing):
    """Stage k + 1's first arrival is 2 s + its own first gap after stage k's last finish; within a stage the
    gaps are the back-to-back ramp's; no request of a stage arrives before the last stage's requests finished
    (the 200 req/s stage's requests run past its sends: they must end first)."""
    result, stage_of = _drained(routing)
    frame = result.requests
    planned = staged_requests(RAMP, PROMPTS, 0)
    planned_at = np.array([r.arrival_time for r in planned])
    assert np.bincount(stage_of).tolist() == [60, 200, 30]
    assert frame["finish_time"].notna().all()
    arrival, finish = frame["arrival_time"].to_numpy(), frame["finish_time"].to_numpy()
    start = 0.0
    bounds = [0.0, 2.0, 3.0, 4.0]
    for k in range(3):
        mine = stage_of == k
        assert arrival[mine] - start == pytest.approx(planned_at[mine] - bounds[k], abs=1e-9)
        last = finish[mine].max()
        if k < 2:
            assert arrival[stage_of == k + 1].min() > last + STAGE_GAP_S
        start = last + STAGE_GAP_S
    overloaded = finish[stage_of == 1].max() - arrival[stage_of == 1].min()
    assert overloaded > 1.0  # its requests ran past its 1 s of sends, and the next stage waited for them


def test_the_drained_run_equals_one_fresh_simulation_of_its_requests():
    """Continuing one fleet stage by stage gives what one simulation of every request at the drained times
    gives, request by request (times and prefix hits), caches carried from stage to stage."""
    result, _ = _drained("prefix-aware")
    frame = result.requests
    planned = staged_requests(RAMP, PROMPTS, 0)
    shifted = [
        type(r)(
            r.request_id,
            float(at),
            r.prompt_len,
            r.output_len,
            r.n,
            r.prefix_group,
            r.prefix_len,
            r.conversation,
        )
        for r, at in zip(planned, frame["arrival_time"], strict=True)
    ]
    fresh = simulate_fleet(shifted, paged(16, enable_prefix_caching=True), CONFIG, Fleet(2, "prefix-aware"))
    cols = ["arrival_time", "first_token_time", "finish_time", "prefix_hit_tokens", "replica"]
    pd.testing.assert_frame_equal(frame[cols], fresh.requests[cols])
    assert frame["prefix_hit_tokens"].sum() > 0


def test_a_zero_gap_and_bad_gaps():
    result, stage_of = _drained(gap=0.0)
    frame = result.requests
    assert frame["arrival_time"][stage_of == 1].min() > frame["finish_time"][stage_of == 0].max()
    with pytest.raises(InvalidArgumentError):
        _drained(gap=-1.0)
    one_replica = SimulationSession(paged(16, enable_prefix_caching=True), CONFIG)
    with pytest.raises(InvalidArgumentError):
        drained_ramp(RAMP, PROMPTS, one_replica)


def test_ramp_report_counts_a_timed_out_request_as_failed_hand_worked():
    """Stage 0: arrivals 0 and 1, the second finishes at 9 (8 s > a 5 s timeout): failed at 1 + 5 = 6, so the
    stage's span is 6 - 0 and its tokens only the first's 10: 10 / 6 tok/s; its TTFT p90 the first's alone (0.5).
    Stage 1 (given by stage_of, not by time): one request, 10 tokens over 2 s. Without the timeout both count."""
    frame = pd.DataFrame(
        {
            "arrival_time": [0.0, 1.0, 20.0],
            "first_token_time": [0.5, 2.0, 20.5],
            "finish_time": [3.0, 9.0, 22.0],
            "output_len": [10, 10, 10],
            "prompt_len": [100, 100, 100],
            "prefix_hit_tokens": [0, 0, 50],
        }
    )
    stages = [Stage(2, 1), Stage(1, 1)]
    stage_of = np.array([0, 0, 1])
    report = ramp_report(frame, stages, stage_of=stage_of, timeout_s=5.0)
    assert report["timed_out"] == 1 and report["unfinished"] == 0
    assert [s["timed_out"] for s in report["stages"]] == [1, 0]
    assert report["stages"][0]["output_tokens_per_s"] == pytest.approx(10 / 6)
    assert report["stages"][0]["ttft_p90_s"] == pytest.approx(0.5)
    assert report["stages"][1]["output_tokens_per_s"] == pytest.approx(10 / 2)
    assert report["prefix_hit_rate"] == pytest.approx(50 / 200)
    plain = ramp_report(frame, stages, stage_of=stage_of)
    assert plain["timed_out"] == 0 and plain["stages"][0]["output_tokens_per_s"] == pytest.approx(20 / 9)
    with pytest.raises(InvalidArgumentError):
        ramp_report(frame, stages, stage_of=np.array([0, 2, 1]))
    with pytest.raises(InvalidArgumentError):
        ramp_report(frame, stages, stage_of=stage_of, timeout_s=0.0)
