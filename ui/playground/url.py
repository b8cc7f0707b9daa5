"""The playground's place in the URL: which scenario, at which step. Parsed like user input, never raised.

`?scenario=<key>&step=<k>` opens a scenario at step k; no parameter (or `scenario=free`) is free play. An unknown
scenario falls back to free play and a step past the end is clamped to the last step; each with a message.
`?host_blocks=<n>&host_block=<tokens>&host_policy=lru|arc` puts a host-memory KV tier of n host blocks behind the
free-play pool (prefix caching on); `host_block` is the host block's tokens (a multiple of the GPU block;
auto = one GPU block).
"""

from collections.abc import Mapping
from typing import Any

from core.kv.host_tier import OFFLOAD_POLICIES
from core.page_models.scenarios import SCENARIOS
from ui.query_state import Field, encode_params, parse_params

FREE_PLAY = "free"
URL_FIELDS = (
    Field("scenario", FREE_PLAY, kind="choice", choices=(FREE_PLAY, *SCENARIOS), label="playground scenario"),
    Field("step", 0, kind="int", minimum=0, maximum=10_000, label="scenario step"),
)
HOST_FIELDS = (
    Field("host_blocks", 0, kind="int", minimum=0, maximum=4096, label="host tier size (host blocks)"),
    Field(
        "host_block", None, kind="int", minimum=1, maximum=4096, optional=True, label="host block (tokens)"
    ),
    Field("host_policy", "lru", kind="choice", choices=OFFLOAD_POLICIES, label="host tier eviction"),
)


def host_from_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """({"host_blocks", "host_block_tokens", "offload_policy"} for `PlaygroundConfig`, one message per value
    not used)."""
    values, errors = parse_params(params, HOST_FIELDS)
    host = {
        "host_blocks": values["host_blocks"],
        "host_block_tokens": values["host_block"],
        "offload_policy": values["host_policy"],
    }
    return host, errors


def host_params(host_blocks: int, host_block_tokens: int | None, offload_policy: str) -> dict[str, str]:
    """The URL parameters of a host tier (none without one)."""
    if not host_blocks:
        return {}
    values = {"host_blocks": host_blocks, "host_block": host_block_tokens, "host_policy": offload_policy}
    return encode_params(values, HOST_FIELDS)


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
