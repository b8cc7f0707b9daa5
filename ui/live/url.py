"""The Live page's inputs as URL fields, and the checked sources they name. No streamlit here.

Metrics URLs are one text (whitespace or comma separated, at most MAX_URLS); an events endpoint is optional,
its replay endpoint too. Each address is checked (`core.live.addresses`) against the operator's
PAGED_LAB_LIVE_HOSTS before anything connects; a refused one is reported and left out, the others kept.
"""

import re
from dataclasses import dataclass

from core.errors import LabError
from core.kv.block_hash import DEFAULT_NONE_HASH_SEED, VLLM_HASH_ALGOS
from core.limits import Limits
from core.live.addresses import check_events_endpoint, check_metrics_url
from core.live.subscriber import DEFAULT_TOPIC
from core.live.watch import LiveWatch, Sources
from core.page_models.live_lookup import LOOKUP_AS
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.memory.cpu_kv import CPU_MODEL_DTYPES
from core.serve.launcher import MODELS as LAB_MODELS
from core.serve.launcher import VLLM_CHOICE
from ui.query_state import Field

MAX_URLS = 8
DEFAULT_METRICS = "http://127.0.0.1:8000/metrics"
NO_MODEL = "none"

FIELDS = [
    Field("metrics", DEFAULT_METRICS, "str", max_length=2000, label="metrics URLs"),
    Field("events", "", "str", max_length=300, label="KV events endpoint"),
    Field("replay", "", "str", max_length=300, label="replay endpoint"),
    Field("topic", DEFAULT_TOPIC, "str", max_length=100, label="topic"),
    Field("events_bind", False, "bool", label="bind the events socket"),
    Field("ranks", 1, "int", minimum=1, maximum=16, step=1, label="data-parallel ranks"),
    Field("every", 3.0, "float", minimum=1.0, maximum=60.0, step=1.0, label="poll every (s)"),
    Field("watch", True, "bool", label="watching"),
    Field("tree_rank", 0, "int", minimum=0, maximum=15, step=1, label="tree of rank"),
    Field("model", NO_MODEL, "choice", (NO_MODEL, *MODELS), label="model for the plan"),
    Field("gpu", "h100-80gb", "choice", tuple(GPUS), label="GPU for the plan"),
    Field("tp", 1, "int", minimum=1, maximum=64, step=1, label="tensor parallel"),
    Field("context", 4096, "int", minimum=1, maximum=10_000_000, step=256, label="context tokens"),
    Field("dtype", "auto", "choice", CPU_MODEL_DTYPES, label="served dtype"),
    Field("lab_model", LAB_MODELS[0], "choice", (*LAB_MODELS, VLLM_CHOICE), label="lab server model"),
    Field(
        "pvo_window",
        120.0,
        "float",
        minimum=10.0,
        maximum=3600.0,
        step=10.0,
        label="planned vs observed window (s)",
    ),
    Field(
        "pvo_seqs",
        0,
        "int",
        minimum=0,
        maximum=65_536,
        step=1,
        label="max_num_seqs (0: the server's default)",
    ),
    Field(
        "pvo_tokens",
        0,
        "int",
        minimum=0,
        maximum=1_048_576,
        step=256,
        label="max_num_batched_tokens (0: the server's default)",
    ),
    Field("lookup", "", "str", max_length=20_000, label="prompt to look up"),
    Field("lookup_as", LOOKUP_AS[0], "choice", LOOKUP_AS, label="read the prompt as"),
    Field("hash_algo", VLLM_HASH_ALGOS[0], "choice", VLLM_HASH_ALGOS, label="the server's block hash"),
    Field("hash_seed", DEFAULT_NONE_HASH_SEED, "str", max_length=100, label="the server's NONE_HASH seed"),
    Field("cache_salt", "", "str", max_length=200, label="cache_salt"),
    Field("pvo_config", "", "str", max_length=8000, label="the served model's config.json (encoded)"),
]


def split_urls(text: str) -> list[str]:
    return [u for u in re.split(r"[\s,]+", text or "") if u]


def resolve_sources(values: dict, limits: Limits) -> tuple[Sources, list[str]]:
    """(the sources to watch, one message per address left out and why)."""
    errors: list[str] = []
    urls = []
    raw = split_urls(values["metrics"])
    if len(raw) > MAX_URLS:
        errors.append(
            f"{len(raw)} metrics URLs given; the page watches at most {MAX_URLS}: the first are used"
        )
    for text in dict.fromkeys(raw[:MAX_URLS]):
        try:
            urls.append(check_metrics_url(text, limits))
        except LabError as err:
            errors.append(f"Metrics URL left out: {err}")
    events = replay = None
    if values["events"].strip():
        try:
            events = check_events_endpoint(values["events"], limits)
        except LabError as err:
            errors.append(f"KV events endpoint left out: {err}")
    if events is not None and values["replay"].strip():
        try:
            replay = check_events_endpoint(values["replay"], limits)
        except LabError as err:
            errors.append(f"Replay endpoint left out (gaps will not be filled): {err}")
    topic = values["topic"]
    return Sources(
        tuple(urls), events, replay, int(values["ranks"]), topic, bool(values["events_bind"])
    ), errors


@dataclass(frozen=True)
class LiveInputs:
    """What the Live page's views read on one run: the URL's values, the checked sources, the session's watch."""

    values: dict
    sources: Sources
    watch: LiveWatch
