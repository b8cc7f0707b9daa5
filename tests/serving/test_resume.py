"""A resumed simulation (`core.serving.resume.SimulationSession`) equals a fresh one to the bit: every step row,
request row and sampled snapshot of a run continued over more requests and a later stop is what `simulate` /
`simulate_fleet` give from scratch on the same requests (the reference), through decode-only batches, chunked
prefills, prefix caching, a host tier, speculative steps, a closed loop and a round-robin fleet whose replicas'
batches run past the arrivals routed elsewhere. A draw whose first requests change (length spread) and a run
whose clock passed the next arrival start over, and still equal the reference."""

import numpy as np
import pandas.testing as pd_testing
import pytest

from core.errors import InvalidArgumentError
from core.planning.cost.speculative import Speculation, SpeculativeStepTime, eagle_head_model
from core.planning.cost.step_model import StepTimeModel
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.serving.fleet import Fleet, simulate_fleet
from core.serving.host_offload import HostOffload
from core.serving.memory_policies import paged
from core.serving.resume import SimulationSession
from core.serving.simulator import SimulatorConfig, _Simulation, simulate
from core.serving.workload import Request

SLOPED = StepTimeModel(0.0, 1000.0, 1e9, 0.0, 1e12, 1e15, overhead_s=0.004, per_token_overhead_s=2e-5)
CACHING = paged(16, enable_prefix_caching=True)
# (requests, until) as a steady state grows its window: the first run, then longer ones stopping later
GROWTH = ((160, 120), (420, 360), (900, 820))


def _config(capacity=6000, step=SLOPED, offload=None, snapshots=8):
    return SimulatorConfig(
        kv_capacity_tokens=capacity,
        max_seq_len=2048,
        step_time=step,
        max_snapshots=snapshots,
        offload=offload,
        max_num_batched_tokens=512,
    )


def _same(ours, fresh):
    pd_testing.assert_frame_equal(ours.steps, fresh.steps, check_exact=True)
    pd_testing.assert_frame_equal(ours.requests, fresh.requests, check_exact=True)
    assert [(s.step, s.time_s) for s in ours.snapshots] == [(s.step, s.time_s) for s in fresh.snapshots]


def _replay(session, draw, fresh, growth=GROWTH):
    """Each (n, until) of `growth` through the session and from scratch; both results, the session's last."""
    for n, until in growth:
        ours, theirs = session.run(draw(n), until), fresh(draw(n), until)
        _same(ours, theirs)
        for mine, its in zip(
            getattr(ours, "replica_results", []), getattr(theirs, "replica_results", []), strict=True
        ):
            _same(mine, its)
    return ours


PREFIXED = Load(rate=40.0, prompt_len=600, output_len=60, shared_prefix_len=400, num_prefixes=4, seed=2)


def test_an_open_loop_replica_with_prefix_caching_continues_to_the_bit():
    config = _config()
    session = SimulationSession(CACHING, config)
    last = _replay(
        session,
        PREFIXED.requests,
        lambda reqs, until: simulate(reqs, CACHING, config, until_finished=until),
    )
    assert session.resumed == 2 and session.fresh == 1
    assert (last.requests["prefix_hit_tokens"] > 0).mean() > 0.5  # the shared prefixes hit
    assert (last.steps["prefill_tokens"] == 0).mean() > 0.5 and len(last.snapshots) > 1  # decode-only runs


def test_a_counted_replica_under_load_preempts_and_continues_to_the_bit():
    """A small cache: preemptions and a queue, decode runs cut by memory rather than arrivals."""
    config, policy = _config(capacity=3000), paged(16, counted=True)
    load = Load(rate=10.0, prompt_len=300, output_len=120, seed=5)
    session = SimulationSession(policy, config)
    last = _replay(
        session, load.requests, lambda reqs, until: simulate(reqs, policy, config, until_finished=until)
    )
    assert session.resumed == 2
    assert last.requests["preemptions"].sum() > 0


def test_a_closed_loop_continues_to_the_bit():
    config, clients = _config(), 12
    load = Load(
        None, concurrency=clients, prompt_len=500, output_len=80, shared_prefix_len=300, num_prefixes=2
    )
    session = SimulationSession(CACHING, config, concurrency=clients)
    growth = tuple((total + clients + 1, total) for total in (100, 260, 600))  # the steady state's tail
    _replay(
        session,
        load.requests,
        lambda reqs, until: simulate(reqs, CACHING, config, until_finished=until, concurrency=clients),
        growth,
    )
    assert session.resumed >= 1


@pytest.mark.parametrize("routing", ["round-robin", "prefix-aware", "approximate-prefix"])
def test_a_two_replica_fleet_continues_to_the_bit(routing, monkeypatch):
    spans = []  # round-robin: decode-only batches with an arrival (routed elsewhere) before their last step
    own_cut = _Simulation._own_cut

    def spy(sim, dts, capped):
        k, ends, ms = own_cut(sim, dts, capped)
        inside = np.searchsorted(sim.arrivals, ends[:-1], side="right") > np.searchsorted(
            sim.arrivals, sim.now, "right"
        )
        spans.append(bool(inside.any()))
        return k, ends, ms

    monkeypatch.setattr(_Simulation, "_own_cut", spy)
    config, fleet = _config(capacity=4000), Fleet(2, routing)
    session = SimulationSession(CACHING, config, fleet=fleet)
    load = Load(rate=50.0, prompt_len=600, output_len=60, shared_prefix_len=400, num_prefixes=4, seed=2)
    last = _replay(
        session,
        load.requests,
        lambda reqs, until: simulate_fleet(reqs, CACHING, config, fleet, until_finished=until),
    )
    assert session.resumed == 2
    assert set(last.requests["replica"][:800]) == {0, 1}
    assert any(spans) == (routing == "round-robin")


def test_speculative_steps_continue_to_the_bit():
    deployment = Deployment("llama-3.1-8b", "h100-80gb")
    target = deployment.step_model()
    cost = SpeculativeStepTime(
        target, Speculation(3, (0.8, 0.6, 0.4), "eagle"), eagle_head_model(target, deployment.model_spec)
    )
    config, fleet = _config(capacity=20_000, step=cost), Fleet(2)
    load = Load(rate=12.0, prompt_len=1200, output_len=100, shared_prefix_len=1000, num_prefixes=4, seed=1)
    session = SimulationSession(CACHING, config, fleet=fleet)
    _replay(
        session,
        load.requests,
        lambda reqs, until: simulate_fleet(reqs, CACHING, config, fleet, until_finished=until),
        ((120, 90), (300, 260)),
    )
    assert session.resumed == 1


def test_a_host_tier_continues_to_the_bit():
    """A cache that holds a few of the 8 prefixes' blocks and a host tier behind it: loads on the host link in flight."""
    config = _config(capacity=4000, offload=HostOffload(12_000, bandwidth_bytes_per_s=2e11))
    load = Load(rate=20.0, prompt_len=600, output_len=60, shared_prefix_len=400, num_prefixes=8, seed=2)
    session = SimulationSession(CACHING, config)
    last = _replay(
        session,
        load.requests,
        lambda reqs, until: simulate(reqs, CACHING, config, until_finished=until),
    )
    assert session.resumed == 2
    assert last.requests["host_hit_tokens"].sum() > 0


def test_a_draw_that_is_not_prefix_stable_starts_over():
    config = _config()
    session = SimulationSession(CACHING, config)
    spread = Load(rate=40.0, prompt_len=600, output_len=60, length_spread=0.5, seed=2)
    assert spread.requests(160) != spread.requests(420)[:160]
    _replay(
        session, spread.requests, lambda reqs, until: simulate(reqs, CACHING, config, until_finished=until)
    )
    assert session.resumed == 0 and session.fresh == 3


def test_a_run_past_the_next_arrival_starts_over_and_continuing_it_would_differ(monkeypatch):
    """Run to the last request (no tail): the clock passes the next request's arrival, which a run on more
    requests would have admitted earlier, so the session starts over; forced to continue, the rows differ."""
    config = _config()
    growth = ((200, 200), (420, 360))

    def fresh(reqs, until):
        return simulate(reqs, CACHING, config, until_finished=until)

    session = SimulationSession(CACHING, config)
    _replay(session, PREFIXED.requests, fresh, growth)
    assert session.resumed == 0 and session.fresh == 2
    forced = SimulationSession(CACHING, config)
    monkeypatch.setattr(SimulationSession, "_continues", lambda self, reqs, until: self._run is not None)
    forced.run(PREFIXED.requests(200), 200)
    ours = forced.run(PREFIXED.requests(420), 360)
    assert forced.resumed == 1
    with pytest.raises(AssertionError):
        _same(ours, fresh(PREFIXED.requests(420), 360))


def test_fewer_requests_or_an_earlier_stop_start_over_and_bad_input_is_refused():
    config = _config()
    session = SimulationSession(CACHING, config)
    draw = PREFIXED.requests
    _replay(
        session,
        draw,
        lambda reqs, until: simulate(reqs, CACHING, config, until_finished=until),
        ((420, 360), (300, 250), (300, 200)),
    )
    assert session.resumed == 0 and session.fresh == 3
    with pytest.raises(InvalidArgumentError, match="until_finished"):
        session.run(draw(10), 11)
    with pytest.raises(InvalidArgumentError, match="open-loop"):
        SimulationSession(CACHING, config, concurrency=4, fleet=Fleet(2))


def test_a_run_that_fails_part_way_is_not_continued():
    """A later request that never fits the cache (2,000 tokens in 1,500 slots) raises as `simulate` does; the
    session then starts over instead of continuing the run it had begun to extend."""
    config = _config(capacity=1500)
    fresh = lambda reqs, until: simulate(reqs, CACHING, config, until_finished=until)  # noqa: E731
    session = SimulationSession(CACHING, config)
    _replay(session, PREFIXED.requests, fresh, ((160, 120),))
    too_long = [*PREFIXED.requests(160), Request(160, 1e6, 1900, 100)]
    for run in (session.run, fresh):
        with pytest.raises(InvalidArgumentError, match="request 160"):
            run(too_long, 120)
    _replay(session, PREFIXED.requests, fresh, ((420, 360),))
    assert session.resumed == 0 and session.fresh == 2
