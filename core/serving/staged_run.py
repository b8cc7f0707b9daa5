"""A staged ramp run as inference-perf runs it: each stage starts once every request of the one before has ended.

inference-perf's load generator (kubernetes-sigs/inference-perf, `loadgen/load_generator.py`, multi-process mode,
its default since June 2025: `num_workers` defaults to the CPU count) puts a stage's requests on its queue with
their scheduled times, then waits until every one of them has ended (finished or failed: its workers call
`task_done` after the response) before the next stage; the next stage is scheduled `interval` seconds later (the
load config's default 1.0 s) plus the 1 s lead it gives its workers (`start_time = perf_counter() + 1`). So a
stage never meets the previous stage's queue: a saturated stage lasts until its own backlog drains, and the next
one starts on an idle fleet with warm caches. (`core.serving.staged_workload.staged_requests` places the stages
back to back instead: a saturated policy's queue then carries from stage to stage through the ramp.)

A request's time to first token is measured from when it was sent (`start` in the tool's `process_request`). The
tool holds at most `num_workers x worker_max_concurrency` requests at once (100 a worker by default): it is not
modelled (every request is sent at its scheduled time); the published per-stage send rates equal the requested
ones, so the cap did not bind there. The tool's HTTP session keeps aiohttp's default 300 s total timeout, after
which a request fails; `TIMEOUT_S` and `ramp_report`'s `timeout_s` count such requests as failed (left out of the
figures, as the tool leaves failed requests out), but the simulated server still serves them to the end (vLLM
aborts a request whose client went away: a fleet with many of them is slower here than the published one was).

    result, stage_of = drained_ramp(stages, prompts, SimulationSession(policy, config, fleet=fleet))
    report = ramp_report(result.requests, stages, first_stage=1, stage_of=stage_of)
"""

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from core.common import check_float
from core.errors import InvalidArgumentError
from core.serving.fleet import FleetResult
from core.serving.resume import SimulationSession
from core.serving.staged_workload import SharedPrefixPrompts, Stage, stage_bounds, staged_requests

__all__ = ["STAGE_GAP_S", "TIMEOUT_S", "drained_ramp"]

STAGE_GAP_S = (
    2.0  # inference-perf: the load config's interval (1.0 s) + the 1 s lead before a stage's first send
)
TIMEOUT_S = 300.0  # aiohttp's default ClientTimeout(total=300): the tool's session sets none of its own


def drained_ramp(
    stages: Sequence[Stage],
    prompts: SharedPrefixPrompts,
    session: SimulationSession,
    seed: int = 0,
    stage_gap_s: float = STAGE_GAP_S,
) -> tuple[FleetResult, np.ndarray]:
    """The ramp's requests (`staged_requests`: the same prompts and, within each stage, the same gaps) run
    stage after stage on `session`'s fleet (`SimulationSession(policy, config, fleet=fleet)`, not run yet), whose
    caches carry over: stage k + 1's schedule starts `stage_gap_s` after the last of stage k's requests finished.
    Returns (the fleet's result over every request, in arrival order; each request's stage index). Raises
    InvalidArgumentError for a session without a fleet or one that ran, and as `staged_requests` and
    `simulate_fleet` do."""
    gap = check_float(stage_gap_s, "stage_gap_s (s)", minimum=0.0)
    if not isinstance(session, SimulationSession) or session.fleet is None or session.resumed + session.fresh:
        raise InvalidArgumentError("drained_ramp needs a new SimulationSession(policy, config, fleet=fleet)")
    planned = staged_requests(stages, prompts, seed)
    bounds = stage_bounds(stages)
    arrival = np.array([r.arrival_time for r in planned])
    stage_of = np.clip(np.searchsorted(bounds, arrival, side="left") - 1, 0, len(bounds) - 2)
    sent: list = []
    start = 0.0
    result = None
    for k in range(len(bounds) - 1):
        mine = [r for r, s in zip(planned, stage_of, strict=True) if s == k]
        if not mine:
            continue
        sent += [replace(r, arrival_time=start + r.arrival_time - bounds[k]) for r in mine]
        result = session.run(sent, len(sent))
        start = float(result.requests["finish_time"].max()) + gap
    return result, stage_of
