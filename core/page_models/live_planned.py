"""The Live page's planned vs observed: which window of the poll history, which model and hardware, which limits,
and when to redo the fit (`core.planning.observed.planned`). No streamlit here.

- Window: the source's last poll and its earliest poll at most `window_s` before it (two answered polls at
  least); a window that finished fewer than MIN_REQUESTS requests is reported, not planned.
- Model and hardware: a `core.serve` model (the served name) runs on this machine's CPU: its own roofline on
  the roofs measured in this process (`roofs()`); a served name that is a planner preset, or else the preset
  chosen on the page, on the chosen GPU x tensor parallel.
- Limits: the KV pool from the server's cache_config_info; max_num_seqs and max_num_batched_tokens as given,
  0 meaning the server's default (vLLM's `vllm serve`: 256 and 8192; core.serve: 64 and 2048).
- Beside the fit, on a preset GPU: the SLO planner's own prediction of the same workload (the vLLM engine
  profile, nothing fitted to the window), so the page shows what the planner said against what the server did.
- `PlanCache` redoes the fit (a few seconds of simulation) at most every REFRESH_S per source and inputs: the
  page polls every few seconds and draws the last result meanwhile.
"""

from collections.abc import Callable
from dataclasses import dataclass

from core.errors import LabError
from core.live.history import FLEET, LiveHistory
from core.live.metrics import VllmMetrics
from core.live.window import observe_window
from core.planning.observed.planned import (
    MEASURED_ROOF_HEADROOM,
    MIN_REQUESTS,
    FitSettings,
    PlannedVsObserved,
    plan_against_observed,
)
from core.planning.observed.planned_model import (
    CORE_SERVE_MODELS,
    core_serve_step_model,
    gpu_step_model,
    limits_from_metrics,
    preset_for,
)

VLLM_DEFAULTS = (256, 8192)  # max_num_seqs, max_num_batched_tokens of `vllm serve` (V1, chunked prefill)
CORE_SERVE_DEFAULTS = (64, 2048)  # python -m core.serve: --max-num-seqs 64, the engine's token budget
MAX_MODEL_LEN = 8192  # only caps the simulated requests' lengths
REFRESH_S = 60.0
PRIOR_ENGINE = (
    "vllm"  # the SLO planner's prediction beside the fit: the profile of the engine it prints flags for
)


@dataclass(frozen=True)
class LivePlan:
    """result: the comparison, or None with `reason` (a sentence for the page) and `problem` (True when the
    inputs or the server are wrong, False when there is only not enough traffic yet). planned_with: the model
    and hardware in words."""

    result: PlannedVsObserved | None
    reason: str | None = None
    problem: bool = False
    planned_with: str = ""


def window_scrapes(history: LiveHistory, source: str, window_s: float):
    """(before, after, seconds) of `source` over its last `window_s` seconds of polls, None with fewer than two."""
    series = [
        (p.t, p.fleet if source == FLEET else p.scrapes.get(source))
        for p in history.polls
        if (p.fleet if source == FLEET else p.scrapes.get(source)) is not None
    ]
    if len(series) < 2:
        return None
    t_end, after = series[-1]
    t_start, before = next((t, m) for t, m in series if t >= t_end - window_s)
    if t_start >= t_end:
        t_start, before = series[-2]
    return before, after, t_end - t_start


def _base(after: VllmMetrics, values: dict, roofs: Callable[[], dict]):
    """(step-time roofline, words, core.serve?) for the server's model; raises LabError."""
    served = after.model_names[0] if after.model_names else None
    if served in CORE_SERVE_MODELS:
        dtype = after.cache_setting("cache_dtype") or "float32"
        return (
            core_serve_step_model(served, roofs(), dtype),
            f"{served} ({dtype}) on this machine's CPU",
            True,
        )
    slug = preset_for(served) or (values["model"] if values["model"] != "none" else None)
    if slug is None:
        raise LabError(
            f"the served model {served!r} is not a planner preset: choose the model it runs in the settings"
        )
    tp = int(values["tp"])
    return gpu_step_model(slug, values["gpu"], tp), f"{slug} on {tp} x {values['gpu']}", False


def _prior(values: dict, own: bool, after: VllmMetrics):
    """The SLO planner's model of a vLLM server on a preset GPU (the vLLM engine profile, unfitted); None for
    the lab's own server on this CPU, which no published profile prices."""
    if own:
        return None
    served = after.model_names[0] if after.model_names else None
    slug = preset_for(served) or values["model"]
    return gpu_step_model(slug, values["gpu"], int(values["tp"]), engine=PRIOR_ENGINE)


def live_plan(history: LiveHistory, source: str, values: dict, roofs: Callable[[], dict]) -> LivePlan:
    """Planned vs observed for `source` over the window the page's inputs name (`pvo_window`, `pvo_seqs`,
    `pvo_tokens`, `model`, `gpu`, `tp`); never raises a LabError (it becomes the LivePlan's reason)."""
    scrapes = window_scrapes(history, source, float(values["pvo_window"]))
    if scrapes is None:
        return LivePlan(None, "Planned vs observed needs two polls of the server.")
    before, after, seconds = scrapes
    try:
        window = observe_window(before, after, seconds)
        if window.requests < MIN_REQUESTS:
            return LivePlan(None, f"The last {seconds:,.0f} s finished {window.requests:,.0f} request(s); planned "
                                  f"vs observed needs {MIN_REQUESTS} (more traffic, or a longer window).")  # fmt: skip
        base, planned_with, own = _base(after, values, roofs)
        seqs_default, tokens_default = CORE_SERVE_DEFAULTS if own else VLLM_DEFAULTS
        limits = limits_from_metrics(
            after, max_num_seqs=int(values["pvo_seqs"]) or seqs_default,
            max_num_batched_tokens=int(values["pvo_tokens"]) or tokens_default, max_model_len=MAX_MODEL_LEN,
        )  # fmt: skip
        headroom = MEASURED_ROOF_HEADROOM if own else 1.0  # a measured roof, or a GPU's datasheet peak
        prior = _prior(values, own, after)
        return LivePlan(
            plan_against_observed(window, base, limits, FitSettings(flops_headroom=headroom), prior),
            planned_with=planned_with,
        )
    except LabError as err:
        return LivePlan(None, f"Planned vs observed cannot run: {err}", problem=True)


class PlanCache:
    """The last LivePlan per (source, inputs), redone when older than REFRESH_S seconds (page clock)."""

    def __init__(self):
        self._entries: dict = {}

    def get(self, key, now: float, compute: Callable[[], LivePlan]) -> LivePlan:
        entry = self._entries.get(key)
        if entry is None or now - entry[0] >= REFRESH_S or entry[1].result is None:
            entry = (now, compute())
            self._entries = {key: entry}  # one entry: the inputs on screen
        return entry[1]
