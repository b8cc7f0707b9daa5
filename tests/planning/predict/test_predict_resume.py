"""`predict` grows its steady-state window by continuing its last simulation (`core.serving.resume`); its answer
is the same JSON, to the last digit, as when every growth step replays the requests from scratch through
`simulate` / `simulate_fleet` (the reference: the path `replica_steady_state` took before sessions), on a
routed fleet with speculative decoding, a prefix-aware fleet, a replica with a host KV tier, a closed loop with
the request-side term, and a draw with a length spread (which starts over)."""

import json
from typing import ClassVar

import pandas.testing as pd_testing
import pytest

from core.planning.cost.fits.engine_profiles import REQUEST_TERM
from core.planning.cost.speculative import Speculation
from core.planning.predict import prediction
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.fleet import simulate_fleet
from core.serving.resume import SimulationSession
from core.serving.simulator import simulate
from core.serving.steady_state import SteadyStateSettings

SETTINGS = SteadyStateSettings(tolerance=0.05, initial_measured=100, max_requests=900, warmup_lifetimes=2.0)


class _FreshRuns:
    """The reference: every run from scratch, as `replica_steady_state` ran them before sessions."""

    def __init__(self, policy, config, concurrency=None, fleet=None):
        self.policy, self.config, self.concurrency, self.fleet = policy, config, concurrency, fleet

    def run(self, requests, until):
        if self.fleet is not None:
            return simulate_fleet(requests, self.policy, self.config, self.fleet, until_finished=until)
        return simulate(
            requests, self.policy, self.config, until_finished=until, concurrency=self.concurrency
        )


class _Counted(SimulationSession):
    sessions: ClassVar[list] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Counted.sessions.append(self)


CASES = {
    "fleet-eagle": (
        Deployment(
            "llama-3.1-8b", "h100-80gb", replicas=2, speculation=Speculation(3, (0.8, 0.6, 0.4), "eagle")
        ),
        Load(rate=8.0, prompt_len=1500, output_len=64, shared_prefix_len=1200, num_prefixes=8),
        None,
        True,
    ),
    "fleet-prefix-aware": (
        Deployment("llama-3.1-8b", "h100-80gb", replicas=2, routing="prefix-aware"),
        Load(rate=10.0, prompt_len=1000, output_len=48, shared_prefix_len=800, num_prefixes=6, seed=3),
        None,
        True,
    ),
    "host-tier": (
        Deployment(
            "llama-3.1-8b", "h100-80gb", max_num_seqs=32, gpu_memory_utilization=0.3, kv_offload_gib=20
        ),
        Load(rate=6.0, prompt_len=3000, output_len=64, shared_prefix_len=2900, num_prefixes=40),
        None,
        True,
    ),
    "closed-loop-request-term": (
        Deployment("llama-3.1-8b", "h100-80gb", max_num_seqs=32),
        Load(None, prompt_len=800, output_len=64, concurrency=24),
        {REQUEST_TERM: 0.004},
        True,  # every stop left no finish without a request to send
    ),
    "length-spread": (
        Deployment("llama-3.1-8b", "h100-80gb"),
        Load(rate=4.0, prompt_len=1000, output_len=64, length_spread=0.5),
        None,
        False,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_predict_answers_as_replaying_every_run_from_scratch(case, monkeypatch):
    deployment, load, step_time, resumes = CASES[case]
    monkeypatch.setattr(prediction, "SimulationSession", _FreshRuns)
    reference = predict(deployment, load, step_time, settings=SETTINGS)
    _Counted.sessions = []
    monkeypatch.setattr(prediction, "SimulationSession", _Counted)
    ours = predict(deployment, load, step_time, settings=SETTINGS)
    assert json.dumps(ours.to_dict()) == json.dumps(reference.to_dict())
    pd_testing.assert_frame_equal(ours.state.result.steps, reference.state.result.steps, check_exact=True)
    pd_testing.assert_frame_equal(
        ours.state.result.requests, reference.state.result.requests, check_exact=True
    )
    (session,) = _Counted.sessions
    assert session.fresh + session.resumed >= 2  # the window grew
    assert (session.resumed > 0) == resumes
