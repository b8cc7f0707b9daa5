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
from core.serving.memory_policies import paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request


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
    assert tuple(ours.columns[: len(COLUMNS)]) == tuple(theirs.columns) == COLUMNS
    assert (ours.dtypes[list(COLUMNS)] == theirs.dtypes).all()
    counted = [c for c in COLUMNS if c not in FLOAT_COLUMNS and c != "kv_tokens_read"]
    assert ours[counted].equals(theirs[counted])
    assert ours["token_states"].tolist() == [14, 16, 0] and ours["free_blocks"].tolist() == [27, 27, 32]
    # kv_tokens_read: the same on decode steps (context + the new token); on a prefill step the engine also
    # counts the chunk's own keys, the simulator only the prior context (0 here)
    assert ours["kv_tokens_read"].tolist() == [14, 16, 18]
    assert (theirs["kv_tokens_read"] + theirs["prefill_tokens"]).tolist() == [14, 16, 18]
    assert (ours["time_s"].diff().dropna() > 0).all() and (theirs["time_s"].diff().dropna() > 0).all()


class _Scheduler:
    """The phases as calls in a log: `schedule` hands out `step`."""

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
    log.clear()
    with pytest.raises(SchedulerStuckError):
        driver.run_step(_Scheduler(ScheduledStep(), log), _Executor(log), _Observer(log))
    assert log == ["schedule"]  # nothing allocated, run or recorded
