"""The Live page's planned vs observed: which window of the poll history, which model and hardware, which limits,
and when to redo the fit (`core.planning.observed.planned`). No streamlit here.

- Window: the source's last poll and its earliest poll at most `window_s` before it (two answered polls at
  least); a window that finished fewer than MIN_REQUESTS requests is reported, not planned.
- Model and hardware: a `core.serve` model (the served name) runs on this machine's CPU: its own roofline on
  the roofs measured in this process (`roofs()`); else the served model's config.json when there is one
  (`ServedConfig`: the folder the server's /v1/models names, or the config the user gives), on this machine's
  CPU when the server runs here on a machine with no GPU (vLLM's CPU build), else on the chosen GPU; else a
  served name that is a planner preset, or the preset chosen on the page, on the chosen GPU x tensor parallel.
- Limits: the KV pool from the server's cache_config_info; max_num_seqs and max_num_batched_tokens as given,
  0 meaning the server's default (vLLM's `vllm serve`: 256 and 8192 on a GPU, 128 and 2048 on a CPU;
  core.serve: 64 and 2048); max_model_len from /v1/models when it says.
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
from core.live.served_model import ServedModel, is_loopback, local_hf_config
from core.live.window import observe_window
from core.planning.catalog.models import ModelSpec
from core.planning.memory.cpu_kv import cpu_model_dtype
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
    hf_cpu_step_model,
    hf_gpu_step_model,
    limits_from_metrics,
    preset_for,
)

VLLM_DEFAULTS = (256, 8192)  # max_num_seqs, max_num_batched_tokens of `vllm serve` (V1, chunked prefill)
VLLM_CPU_DEFAULTS = (128, 2048)  # the same on vLLM's CPU build (vllm/engine/arg_utils.py, the OpenAI server)
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
    and hardware in words; roof: what the fitted FLOP/s is a fraction of (`flops_vs_roof`), in words."""

    result: PlannedVsObserved | None
    reason: str | None = None
    problem: bool = False
    planned_with: str = ""
    roof: str = ""


@dataclass(frozen=True)
class ServedConfig:
    """The served model's Hugging Face config: `config` (a config.json's dict), `origin` (where it came from, in
    words), `max_model_len` (the server's, None when unknown) and `on_this_cpu` (the server runs on this machine,
    which has no GPU: vLLM's CPU build)."""

    config: dict
    origin: str
    max_model_len: int | None = None
    on_this_cpu: bool = False


def served_config(
    host: str, served: ServedModel | None, given: dict | None = None, gpu_here: bool | None = None
) -> ServedConfig | None:
    """The config to plan with for a server on `host` that answered /v1/models with `served`: `given` (the user's
    config.json) first, else the config.json in the folder `served.root` names when the server runs here; None
    when neither. `gpu_here` (default: torch sees a CUDA device) decides whether a server on this machine runs
    on its CPU."""
    if gpu_here is None:
        import torch  # only asked for a server on this machine

        gpu_here = is_loopback(host) and torch.cuda.is_available()
    on_this_cpu = is_loopback(host) and not gpu_here
    max_len = served.max_model_len if served is not None else None
    if given is not None:
        return ServedConfig(given, "the config.json given", max_len, on_this_cpu)
    config = local_hf_config(served.root, host) if served is not None else None
    if config is None:
        return None
    return ServedConfig(config, f"{served.root}/config.json", max_len, on_this_cpu)


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


def _base(after: VllmMetrics, values: dict, roofs: Callable[[], dict], config: ServedConfig | None = None):
    """(step-time roofline, words, kind) for the server's model, kind "core.serve", "cpu" (vLLM on this CPU) or
    "gpu"; raises LabError."""
    served = after.model_names[0] if after.model_names else None
    if served in CORE_SERVE_MODELS:
        dtype = after.cache_setting("cache_dtype") or "float32"
        return (
            core_serve_step_model(served, roofs(), dtype),
            f"{served} ({dtype}) on this machine's CPU",
            "core.serve",
        )
    tp = int(values["tp"])
    if config is not None:
        spec = ModelSpec.from_hf_config(config.config, name=served or "the served model")
        if config.on_this_cpu:
            dtype = cpu_model_dtype(spec, values.get("dtype", "auto"))
            words = f"{spec.name} ({dtype}, {config.origin}) on this machine's CPU"
            return hf_cpu_step_model(spec, roofs(), dtype), words, "cpu"
        words = f"{spec.name} ({config.origin}) on {tp} x {values['gpu']}"
        return hf_gpu_step_model(spec, values["gpu"], tp), words, "gpu"
    slug = preset_for(served) or (values["model"] if values["model"] != "none" else None)
    if slug is None:
        raise LabError(
            f"the served model {served!r} is not a planner preset and the server names no config.json this "
            "machine can read: give its config.json or choose the model it runs in the settings"
        )
    return gpu_step_model(slug, values["gpu"], tp), f"{slug} on {tp} x {values['gpu']}", "gpu"


def _prior(values: dict, kind: str, after: VllmMetrics):
    """The SLO planner's model of a vLLM server on a preset GPU (the vLLM engine profile, unfitted); None on this
    CPU (which no published profile prices) and for a model that is no preset."""
    if kind != "gpu":
        return None
    served = after.model_names[0] if after.model_names else None
    slug = preset_for(served) or (values["model"] if values["model"] != "none" else None)
    return (
        None if slug is None else gpu_step_model(slug, values["gpu"], int(values["tp"]), engine=PRIOR_ENGINE)
    )


def live_plan(
    history: LiveHistory,
    source: str,
    values: dict,
    roofs: Callable[[], dict],
    config: ServedConfig | None = None,
) -> LivePlan:
    """Planned vs observed for `source` over the window the page's inputs name (`pvo_window`, `pvo_seqs`,
    `pvo_tokens`, `model`, `gpu`, `tp`), with the served model's `config` when there is one; never raises a
    LabError (it becomes the LivePlan's reason)."""
    scrapes = window_scrapes(history, source, float(values["pvo_window"]))
    if scrapes is None:
        return LivePlan(None, "Planned vs observed needs two polls of the server.")
    before, after, seconds = scrapes
    try:
        window = observe_window(before, after, seconds)
        if window.requests < MIN_REQUESTS:
            return LivePlan(
                None,
                f"The last {seconds:,.0f} s finished {window.requests:,.0f} request(s); planned "
                f"vs observed needs {MIN_REQUESTS} (more traffic, or a longer window).",
            )
        base, planned_with, kind = _base(after, values, roofs, config)
        seqs_default, tokens_default = {"core.serve": CORE_SERVE_DEFAULTS, "cpu": VLLM_CPU_DEFAULTS}.get(
            kind, VLLM_DEFAULTS
        )
        max_len = config.max_model_len if config is not None and config.max_model_len else MAX_MODEL_LEN
        limits = limits_from_metrics(
            after,
            max_num_seqs=int(values["pvo_seqs"]) or seqs_default,
            max_num_batched_tokens=int(values["pvo_tokens"]) or tokens_default,
            max_model_len=max_len,
        )
        headroom = (
            1.0 if kind == "gpu" else MEASURED_ROOF_HEADROOM
        )  # a GPU's datasheet peak, or a measured roof
        prior = _prior(values, kind, after)
        return LivePlan(
            plan_against_observed(window, base, limits, FitSettings(flops_headroom=headroom), prior),
            planned_with=planned_with,
            roof="the GPU's datasheet peak" if kind == "gpu" else "the matmul roof sampled on this CPU",
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
