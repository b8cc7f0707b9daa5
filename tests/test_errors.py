"""Every error core raises is a `LabError` defined in `core/errors.py`, and every one survives a pickle round
trip (how job errors travel from worker processes) with its message and its fields."""

import importlib
import inspect
import pickle
import pkgutil

import pytest

import core
from core import errors


def _all_subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_all_subclasses(sub)]
    return list(dict.fromkeys(found))


def _import_core() -> None:
    """Import every module of core, so that an error class defined anywhere is seen."""
    for module in pkgutil.walk_packages(core.__path__, "core."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)


def _build(cls: type) -> tuple[errors.LabError, dict]:
    """An instance of `cls` with a distinct value for every field its __init__ takes beside the message."""
    fields = {}
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    for i, param in enumerate(params):
        if param.name == "message" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        fields[param.name] = 100 + i if "int" in str(param.annotation) else f"{param.name}-{i}"
    return cls(f"{cls.__name__} message", **fields), fields


def test_every_error_is_defined_in_core_errors():
    _import_core()
    outside = [c for c in _all_subclasses(errors.LabError) if c.__module__ != "core.errors"]
    assert outside == [], f"errors defined outside core/errors.py: {outside}"


@pytest.mark.parametrize("cls", _all_subclasses(errors.LabError), ids=lambda c: c.__name__)
def test_every_error_survives_a_pickle_round_trip(cls):
    error, fields = _build(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and str(copy) == str(error) and copy.args == error.args
    assert {name: getattr(copy, name) for name in fields} == fields
    assert vars(copy) == vars(error)


def test_the_errors_with_fields_are_covered():
    """The discovery above finds the errors that carry fields (it would pass vacuously on an empty list)."""
    with_fields = {c.__name__ for c in _all_subclasses(errors.LabError) if _build(c)[1]}
    assert {
        "OutOfBlocksError",
        "JobFailedError",
        "MemoryBudgetError",
        "ModelTooLargeError",
        "LimitConfigError",
        "LimitExceededError",
        "QueueFullError",
        "SchedulerStuckError",
    } <= with_fields


def test_the_stuck_verdict_is_one_message_for_every_driver():
    """`SchedulerStuckError.nothing_fits`: the engine's (free blocks known) and the simulator's (a step, memory
    in slots) verdict, written out by hand; it pickles with its fields like every error."""
    engine = errors.SchedulerStuckError.nothing_fits(3, free_blocks=1_024)
    assert str(engine) == (
        "the scheduler is stuck: none of the 3 waiting request(s) fits in the 1,024 free blocks and nothing runs "
        "(give it more KV blocks, shorter requests, or a larger max_num_batched_tokens)"
    )
    assert (engine.num_waiting, engine.free_blocks) == (3, 1_024)
    simulator = errors.SchedulerStuckError.nothing_fits(2, step=12_345)
    assert str(simulator).startswith(
        "the scheduler is stuck at step 12,345: none of the 2 waiting request(s) fits in the free memory and"
    )
    copy = pickle.loads(pickle.dumps(simulator))
    assert str(copy) == str(simulator) and copy.free_blocks is None
