"""Streamlit widgets whose values live in the URL: seeded from `st.query_params`, bounded by their `Field`.

`UrlState` keeps a page's current values in `st.session_state[state_key]` (a dict keyed like the fields), so a
widget Streamlit dropped (hidden, or on another page) comes back with its value, and the page can write the
URL from one dict. Widget bounds, steps and options come from the field schema (`widget_bounds`).
"""

from collections.abc import Callable, Iterable
from typing import Any

import streamlit as st

from ui.query_state import Field, parse_params, widget_bounds


class UrlState:
    """The URL-backed inputs of one page. Session state keys: `{name}_values` (the dict of current values),
    `{name}_url` (the query last written), `{name}_url_errors` (messages about rejected parameters)."""

    def __init__(self, name: str, fields: Iterable[Field]):
        self.fields = {field.key: field for field in fields}
        self.state_key = f"{name}_values"
        self.written_key = f"{name}_url"
        self.errors_key = f"{name}_url_errors"

    @property
    def values(self) -> dict[str, Any]:
        return st.session_state[self.state_key]

    def sync_from_url(self) -> bool:
        """Seed the values and widgets from the URL on the first run, and whenever the URL no longer matches what
        this page wrote; True when it did. A query without any of the fields (navigation from another page
        drops it) keeps this session's values."""
        current = st.query_params.to_dict()
        if self.state_key in st.session_state:
            if st.session_state.get(self.written_key) == current:
                return False
            if not any(key in current for key in self.fields):
                return False
        values, errors = parse_params(current, self.fields.values())
        st.session_state[self.state_key] = values
        st.session_state[self.errors_key] = errors
        for key, value in values.items():
            st.session_state[key] = self._widget_value(key, value)
        return True

    def _widget_value(self, key: str, value: Any) -> Any:
        """The widget's form of a value: a list for a multi-choice field (values keep it as a tuple)."""
        return list(value) if self.fields[key].kind == "multi" else value

    def pop_errors(self) -> list[str]:
        """The messages about rejected URL parameters, once (the next write replaces them with valid values)."""
        return st.session_state.pop(self.errors_key, [])

    def widget(self, factory: Callable[..., Any], label: str, key: str, **kwargs: Any) -> Any:
        """`factory(label, key=key, ...)` bounded by the field `key` (options, min, max, step unless given),
        restoring its value from the page's values when Streamlit dropped it; returns the widget's value."""
        if key not in st.session_state:
            st.session_state[key] = self._widget_value(key, self.values[key])
        value = factory(label, key=key, **{**widget_bounds(self.fields[key]), **kwargs})
        if self.fields[key].kind == "multi":
            value = tuple(value)
        self.values[key] = value
        return value

    def adopt_widget_values(self) -> None:
        """Take into the values what this page's widgets hold in the session now (a form submitted in this run),
        for a page that uses them above the place it draws those widgets."""
        for key in self.fields:
            if key in st.session_state:
                self.values[key] = st.session_state[key]

    def set(self, key: str, value: Any) -> None:
        """Change a value and its widget (before the widget is drawn in this run)."""
        st.session_state[key] = self._widget_value(key, value)
        self.values[key] = value

    def write_url(self, encoded: dict[str, str]) -> None:
        """Make the URL `encoded` (the page's parameters for its current values)."""
        if st.query_params.to_dict() != encoded:
            st.query_params.from_dict(encoded)
        st.session_state[self.written_key] = encoded
