"""Two AppTest sessions acting in turns from two threads never see each other's state.

Each thread's actions interleave with the other's, but one AppTest run at a time: AppTest installs a process-wide
mock Runtime for each run and removes it when the run ends (`Runtime._instance`, streamlit/testing/v1/app_test.py),
so two runs overlapping in one process break each other ("Runtime hasn't been created!", the page half drawn).
Sessions truly at the same time go through a real server in tests/load/test_load.py."""

import threading

from tests.conftest import open_app

APPTEST_RUN = threading.Lock()  # one AppTest run at a time in this process (module docstring)


def _rendered(at) -> dict:
    return {
        "metrics": [(m.label, m.value) for m in at.metric],
        "captions": [c.value for c in at.caption],
        "tables": [d.value.to_csv() for d in at.dataframe],
    }


def _act_on_playground(at, prompt_len: int, adds: int) -> None:
    for _ in range(adds):
        with APPTEST_RUN:
            at.number_input(key="prompt_len").set_value(prompt_len)
            at.button(key="add").click()
            at.run()
        assert not at.exception, at.exception


def test_two_playground_sessions_acting_at_once_stay_apart():
    first, second = open_app("app_pages/playground.py"), open_app("app_pages/playground.py")
    fresh = _rendered(open_app("app_pages/playground.py"))
    assert _rendered(first) == fresh == _rendered(second)
    errors: list = []

    def act(at, prompt_len, adds):
        try:
            _act_on_playground(at, prompt_len, adds)
        except Exception as error:  # re-raised in the test thread below
            errors.append(error)

    threads = [
        threading.Thread(target=act, args=(first, 5, 3)),
        threading.Thread(target=act, args=(second, 40, 1)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    sequences = {at: next(m.value for m in at.metric if m.label == "Sequences") for at in (first, second)}
    base = int(next(value for label, value in fresh["metrics"] if label == "Sequences"))
    assert sequences[first] == f"{base + 3:,}" and sequences[second] == f"{base + 1:,}"
    assert first.session_state["playground"] is not second.session_state["playground"]
    # a third session opened afterwards still starts from the demo scene
    assert _rendered(open_app("app_pages/playground.py")) == fresh
