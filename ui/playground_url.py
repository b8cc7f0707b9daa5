"""The playground's place in the URL: which scenario, at which step. Parsed like user input, never raised.

`?scenario=<key>&step=<k>` opens a scenario at step k; no parameter (or `scenario=free`) is free play. An unknown
scenario falls back to free play and a step past the end is clamped to the last step; each with a message.
"""

from collections.abc import Mapping
from typing import Any

from core.page_models.scenarios import SCENARIOS
from ui.query_state import Field, encode_params, parse_params

FREE_PLAY = "free"
URL_FIELDS = (
    Field("scenario", FREE_PLAY, kind="choice", choices=(FREE_PLAY, *SCENARIOS), label="playground scenario"),
    Field("step", 0, kind="int", minimum=0, maximum=10_000, label="scenario step"),
)


def position_from_params(params: Mapping[str, Any]) -> tuple[str, int, list[str]]:
    """(scenario key or FREE_PLAY, step within [0, num_steps], one message per value that was not used)."""
    values, errors = parse_params(params, URL_FIELDS)
    key, step = values["scenario"], values["step"]
    if key == FREE_PLAY:
        return key, 0, errors
    last = SCENARIOS[key].num_steps
    if step > last:
        errors.append(
            f"URL parameter `step` = {step:,} is past the last step of “{SCENARIOS[key].title}” ({last}); "
            f"showing step {last}."
        )
        step = last
    return key, step, errors


def params_for(key: str, step: int) -> dict[str, str]:
    """The URL parameters of a position: none for free play (its pool lives in the session, not the URL)."""
    if key == FREE_PLAY:
        return {}
    return encode_params({"scenario": key, "step": step}, URL_FIELDS)
