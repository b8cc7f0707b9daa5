"""One run driver: the engine and the serving simulator both step through `core.sched.driver.run_step` (spied on
here), and their step rows are one record (`StepRows` over `COLUMNS`): on a trace they both run, the shared
columns hold the same values, worked by hand in `tests/engine/test_metrics.py`."""

import pytest

from core.engine import Engine, SamplingParams
from core.engine.config import TINY_LLAMA
from core.errors import SchedulerStuckError
from core.planning.cost.step_time import opt_13b_a100
from core.sched import ScheduledStep, StepOutcome, driver
from core.sched.step_columns import COLUMNS, FLOAT_COLUMNS
from core.sched.step_load import step_load
from core.serving.memory_policies import Policy, paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request


def _same_record(ours, theirs) -> None:
    """Every step column alike: the counted ones equal; the timed ones (wall clock for the engine, the modeled
    clock for the simulator) by what they mean: steps end in order and each lasts > 0 ms within its span."""
    assert tuple(ours.columns[: len(COLUMNS)]) == tuple(theirs.columns) == COLUMNS
    assert (ours.dtypes[list(COLUMNS)] == theirs.dtypes).all()
    counted = [c for c in COLUMNS if c not in FLOAT_COLUMNS]
    assert len(counted) + len(FLOAT_COLUMNS) == len(COLUMNS)
    assert ours[counted].equals(theirs[counted])
    for frame in (ours, theirs):
        ends, ms = frame["time_s"].to_numpy(), frame["step_time_ms"].to_numpy()
        assert (ms > 0).all() and (ends[1:] > ends[:-1]).all()
        assert (ends[1:] - ms[1:] / 1e3 >= ends[:-1] - 1e-9).all()  # a step starts after the last one ended


def test_engine_and_simulator_step_through_the_same_driver(monkeypatch):
    """Prompts of 5 and 9 tokens, 3 output tokens each, blocks of 4 tokens, 32 blocks: both sides."""
    calls = []
    real = driver.run_step

    def spy(scheduler, executor, observer):
        calls.append((type(executor).__name__, type(observer).__name__))
        return real(scheduler, executor, observer)

    monkeypatch.setattr(driver, "run_step", spy)
    engine = Engine.from_config(TINY_LLAMA, num_blocks=32, block_size=4, device="cpu", warmup=False)
    engine.generate([list(range(5)), list(range(9))], SamplingParams(3, temperature=0.0, ignore_eos=True))
    engine_calls, calls[:] = list(calls), []
    requests = [Request(0, 0.0, 5, 3), Request(1, 0.0, 9, 3)]
    result = simulate(
        requests, paged(4), SimulatorConfig(kv_capacity_tokens=32 * 4, step_time=opt_13b_a100())
    )
    assert engine_calls == [("EngineExecutor", "StepObserver")] * 3  # one per step: prefill, two decodes
    assert calls == [("_Simulation", "_SimRecord")] * 3

    ours, theirs = engine.last_run.steps, result.steps
    _same_record(ours, theirs)
    assert ours["token_states"].tolist() == [14, 16, 0] and ours["free_blocks"].tolist() == [27, 27, 32]
    # kv_tokens_read (`core.sched.step_load`): keys read besides the step's own tokens: none on the prefill
    # step, then each decode's context before the step
    assert theirs["kv_tokens_read"].tolist() == [0, 5 + 9, 6 + 10]


def test_engine_and_simulator_record_prefix_hits_and_decode_runs_alike():
    """One sequence at a time (max_num_seqs 1), two 9- and 11-token prompts sharing 8 tokens, prefix caching,
    blocks of 4: the second prompt finds 2 cached blocks (8 tokens) once the first finished, and prefills 3
    tokens that read those 8. Four snapshots at most: the simulator replays decode-only steps in batches."""
    shape = {"num_blocks": 16, "block_size": 4, "max_num_seqs": 1, "max_snapshots": 4}
    engine = Engine.from_config(TINY_LLAMA, device="cpu", warmup=False, enable_prefix_caching=True, **shape)
    prefix = list(range(8))
    engine.generate(
        [[*prefix, 50], [*prefix, 60, 61, 62]], SamplingParams(6, temperature=0.0, ignore_eos=True)
    )
    requests = [Request(i, 0.0, p, 6, prefix_group=0, prefix_len=8) for i, p in enumerate((9, 11))]
    config = SimulatorConfig(
        kv_capacity_tokens=16 * 4, max_num_seqs=1, step_time=opt_13b_a100(), max_snapshots=4
    )
    result = simulate(requests, paged(4, enable_prefix_caching=True), config)
    ours, theirs = engine.last_run.steps, result.steps
    _same_record(ours, theirs)
    assert theirs["prefix_hit_tokens"].tolist() == [0] * 6 + [8] + [0] * 5
    # the first prompt's decodes read 9..13 keys; the second prefill reads the 8 cached ones; its decodes 11..15
    assert theirs["kv_tokens_read"].tolist() == [0, 9, 10, 11, 12, 13, 8, 11, 12, 13, 14, 15]
    assert len(result.snapshots) < len(theirs)  # some decode steps ran as one batch
    # one sampler, one snapshot type: the same steps (the engine's last step forced in too), the same state
    sim_snaps = {snap.step: snap for snap in result.snapshots}
    engine_snaps = {snap.step: snap for snap in engine.last_run.snapshots}
    assert sorted(sim_snaps) == [0, 4, 8] and sorted(engine_snaps) == [0, 4, 8, len(ours) - 1]
    for step, snap in sim_snaps.items():
        mine = engine_snaps[step]
        assert type(mine) is type(snap) and mine.context_lens.tolist() == snap.context_lens.tolist()
        assert mine.owner_request.tolist() == snap.owner_request.tolist()
        assert mine.pool.ref_count.tolist() == snap.pool.ref_count.tolist()


def test_the_window_rule_is_asked_through_the_memory():
    """4 layers alternating a sliding window of 6 and full attention, blocks of 4, chunks of 8 tokens: prompts of
    5 and 13 tokens, 9 outputs each. A span starting at position s reads s keys before itself in a full layer and
    min(s, 5) in a window layer; the step's count is the mean over the 4 layers, rounded down, the same for the
    engine (its KV cache manager's groups) and the simulator (the hybrid paged policy)."""
    layers = {
        "num_hidden_layers": 4,
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    limits = {"max_num_seqs": 2, "max_num_batched_tokens": 8}
    engine = Engine.from_config(
        TINY_LLAMA | layers, num_blocks=32, block_size=4, device="cpu", warmup=False, **limits
    )
    engine.generate([list(range(5)), list(range(13))], SamplingParams(9, temperature=0.0, ignore_eos=True))
    policy = Policy("paged", 4, kv_groups=(("sliding_window", 2, 6), ("full", 2, None)))
    config = SimulatorConfig(
        kv_capacity_tokens=32 * 4 // 2, step_time=opt_13b_a100(), **limits
    )  # 2 layers a block
    result = simulate([Request(0, 0.0, 5, 9), Request(1, 0.0, 13, 9)], policy, config)

    def mean(starts):  # 2 full layers read s, 2 window layers min(s, 5)
        return sum(2 * s + 2 * min(s, 5) for s in starts) // 4

    # step 0 prefills 5 + 3 tokens from 0; step 1 decodes at 5 and prefills 7 from 3; step 2 decodes at 6 and
    # prefills the last 3 from 10; both decode in steps 3-8 (the first's 9th token ends it), the second alone after
    expected = [mean([0, 0]), mean([5, 3]), mean([6, 10])]
    expected += [mean([7 + i, 13 + i]) for i in range(6)] + [mean([19]), mean([20])]
    assert (
        engine.last_run.steps["kv_tokens_read"].tolist()
        == result.steps["kv_tokens_read"].tolist()
        == expected
    )
    assert expected[:3] == [0, 8, 13]  # 13, not 5 + 7: one mean over the step, rounded down once


class _Scheduler:
    """The phases as calls in a log: `schedule` hands out `step`."""

    memory = None  # no memory: the step's load counts every key before a query

    def __init__(self, step: ScheduledStep, log: list):
        self.step, self.log = step, log

    def schedule(self):
        self.log.append("schedule")
        return self.step

    def allocate(self, step, num_steps):
        self.log.append(f"allocate {num_steps}")

    def postprocess(self, step):
        self.log.append("postprocess")
        return StepOutcome(0, 0, [], [])


class _Executor:
    def __init__(self, log: list):
        self.log = log

    def stuck_error(self, step):
        return SchedulerStuckError.nothing_fits(3)

    def plan(self, step):
        self.log.append("plan")
        return 4

    def execute(self, step):
        self.log.append("execute")
        return "ran"

    def finish(self, step, outcome, executed):
        self.log.append(f"finish {executed}")
        return "result"


class _Observer:
    def __init__(self, log: list):
        self.log = log

    def on_step(self, step, outcome, result):
        self.log.append(f"observe {result}")


def test_run_step_calls_the_phases_in_order_and_raises_on_a_stuck_step():
    log = []
    step = ScheduledStep(decoding=["a group"])
    result = driver.run_step(_Scheduler(step, log), _Executor(log), _Observer(log))
    assert result == "result"
    assert log == ["schedule", "plan", "allocate 4", "execute", "postprocess", "finish ran", "observe result"]
    assert step.load == step_load(step)  # the driver's one load of the step, before it is planned
    log.clear()
    with pytest.raises(SchedulerStuckError):
        driver.run_step(_Scheduler(ScheduledStep(), log), _Executor(log), _Observer(log))
    assert log == ["schedule"]  # nothing allocated, run or recorded
