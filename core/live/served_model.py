"""What model a watched server runs, and where its Hugging Face config is: vLLM's `/v1/models` lists each served
model with `root` (the path or repository `vllm serve` was given: for a local model, its folder) and
`max_model_len` (vLLM's vllm/entrypoints/openai/models/serving.py, `show_available_models`).

`fetch_served_models(metrics_url)` asks the same host and port as the metrics URL (checked against
PAGED_LAB_LIVE_HOSTS the same way, bounded, pinned: `core.live.fetch`). `local_hf_config(root)` reads the folder's
config.json only when the server runs on this machine (a loopback host: a path another machine names means
nothing here), the folder exists and the file is a JSON object under MAX_CONFIG_BYTES; nothing is downloaded.
"""

import dataclasses
import ipaddress
import json
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from core.errors import MetricsFormatError
from core.live.addresses import MetricsUrl
from core.live.fetch import fetch_metrics_text

MAX_CONFIG_BYTES = 1024 * 1024  # a config.json is a few kB; the largest multimodal ones tens of kB
MAX_MODELS_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ServedModel:
    """One entry of /v1/models: `name` (the served name, vllm:...{model_name}), `root` (the path or repository it
    was loaded from; None when not given) and `max_model_len` (None when not given)."""

    name: str
    root: str | None
    max_model_len: int | None


def models_url(url: MetricsUrl) -> MetricsUrl:
    """The /v1/models URL of the server whose metrics are at `url` (same scheme, host and port)."""
    parts = urllib.parse.urlsplit(url.url)
    return dataclasses.replace(
        url, url=urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/v1/models", "", ""))
    )


def parse_models(text: str) -> tuple[ServedModel, ...]:
    """The models of a /v1/models body. Raises MetricsFormatError when it is not OpenAI's model list."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise MetricsFormatError(f"/v1/models did not answer JSON ({err.msg})") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise MetricsFormatError("/v1/models did not answer an OpenAI model list (no `data` list)")
    out = []
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise MetricsFormatError("/v1/models lists an entry without a string `id`")
        root = entry.get("root")
        max_len = entry.get("max_model_len")
        out.append(
            ServedModel(
                entry["id"],
                root if isinstance(root, str) and root else None,
                max_len
                if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0
                else None,
            )
        )
    return tuple(out)


def fetch_served_models(url: MetricsUrl, timeout_s: float = 3.0) -> tuple[ServedModel, ...]:
    """The models the server at `url` (its metrics URL) serves. Raises LiveEndpointError when it does not answer
    (`core.live.fetch`), MetricsFormatError when the answer is not a model list."""
    return parse_models(fetch_metrics_text(models_url(url), timeout_s, MAX_MODELS_BYTES))


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (the server runs on this machine)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def local_hf_config(root: str | None, host: str) -> dict | None:
    """The config.json in the folder `root` names, when the server runs on this machine (`host` is loopback)
    and the file is a JSON object of at most MAX_CONFIG_BYTES; None otherwise (never raises)."""
    if not root or not is_loopback(host):
        return None
    try:
        path = Path(root) / "config.json"
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None
