"""Hostile widget input: hypothesis drives random sequences of widget actions through AppTest on every page
registered in app.py, and no exception element may ever appear (bad input must end in st.error or a clamp).

Widgets are discovered generically from the rendered page: number inputs go to their minimum, maximum, default
or a value just above the minimum; selectboxes, radios and select sliders to any option; multiselects to any
subset (the empty one too); checkboxes and toggles flip; sliders go to either end; buttons (form submits too)
are clicked. Bounded: few examples, few actions each, no deadline.
"""

import ast
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamlit.runtime.state.common import TESTING_KEY

from tests.conftest import ROOT, open_app

ACTIONS_PER_EXAMPLE = 4
EXAMPLES = int(os.environ.get("PAGED_LAB_FUZZ_EXAMPLES", "2"))
WIDGET_KINDS = (
    "number_input",
    "selectbox",
    "radio",
    "select_slider",
    "multiselect",
    "checkbox",
    "toggle",
    "slider",
    "button",
)
# Pages whose fuzzing found a real bug, with the bug (see the report): xfail(strict=True) until fixed.
KNOWN_BUGS: dict[str, str] = {}


def registered_pages() -> list[str]:
    tree = ast.parse((ROOT / "app.py").read_text())
    return [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Page"
    ]


def _widgets(at) -> list:
    found = []
    for kind in WIDGET_KINDS:
        found.extend(w for w in getattr(at, kind) if not getattr(w.proto, "disabled", False))
    return found


def _number_choices(widget) -> list:
    proto = widget.proto
    cast = int if proto.data_type == proto.INT else float
    low = cast(proto.min) if proto.has_min else None
    high = cast(proto.max) if proto.has_max else None
    choices = [widget.value] if widget.value is not None else []
    choices += [v for v in (low, high) if v is not None]
    if low is not None:
        step = cast(proto.step) if proto.step else 1
        choices.append(low + step if high is None or low + step <= high else low)
    return choices


def _set_by_label(widget, value) -> None:
    """Set a choice widget by its displayed option label(s), as the browser does: AppTest formats values with
    the page's format_func, so labels are passed through unchanged and raw values formatted as before."""
    formats = widget.root.session_state[TESTING_KEY]
    original, labels = formats[widget.id], set(widget.options)
    formats[widget.id] = lambda v: v if isinstance(v, str) and v in labels else original(v)
    widget.set_value(value)


def _apply(widget, data) -> str:
    """Perform one drawn action on `widget`; returns what was done (for the failure message)."""
    kind = type(widget).__name__
    label = widget.proto.label
    if kind in ("Button", "FormSubmitButton"):
        widget.click()
        return f"click {label!r}"
    if kind == "NumberInput":
        value = data.draw(st.sampled_from(_number_choices(widget)))
        widget.set_value(value)
        return f"{label!r} = {value!r}"
    if kind in ("Selectbox", "Radio", "SelectSlider"):
        option = data.draw(st.sampled_from(list(widget.options)))
        _set_by_label(widget, option)
        return f"{label!r} -> {option!r}"
    if kind == "Multiselect":
        picked = data.draw(st.lists(st.sampled_from(list(widget.options)), unique=True))
        _set_by_label(widget, picked)
        return f"{label!r} -> {picked!r}"
    if kind in ("Checkbox", "Toggle"):
        widget.set_value(not widget.value)
        return f"{label!r} flipped"
    if kind == "Slider":
        low, high = widget.min, widget.max
        value = data.draw(st.sampled_from([low, high]))
        if isinstance(widget.value, tuple | list):
            value = (low, high)
        widget.set_value(value)
        return f"{label!r} = {value!r}"
    return f"skipped {kind}"


@pytest.mark.parametrize("page", registered_pages())
def test_random_widget_actions_never_raise(page):
    if page in KNOWN_BUGS:
        pytest.xfail(KNOWN_BUGS[page])

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def fuzz(data):
        at = open_app(page, timeout=180)
        done = []
        for _ in range(ACTIONS_PER_EXAMPLE):
            widgets = _widgets(at)
            if not widgets:
                break
            widget = data.draw(st.sampled_from(widgets), label="widget")
            done.append(_apply(widget, data))
            at.run()
            assert not at.exception, (page, done, [e.value for e in at.exception])
        # then submit every form, so values changed inside a form are applied too
        for button in [b for b in at.button if b.proto.is_form_submitter]:
            button.click()
            done.append(f"submit {button.proto.label!r}")
            at.run()
            assert not at.exception, (page, done, [e.value for e in at.exception])

    fuzz()
