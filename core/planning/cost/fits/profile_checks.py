"""How far the cross-model vLLM profile's answers have been from measured ones, for the GPU and the model of a plan.

The measured runs are aiconfigurator's published vLLM rows (`published_vllm_rows`: mean TTFT and mean TPOT of
closed loops), replayed by `python -m bench.slo_published`, whose saved run (bench/results/slo-published.json)
tests/planning/cost/test_profile_checks.py holds the figures below to. KV-limited rows are left out, as in the fit.

Per GPU: "fitted" (H100, H200: the training rows on it, what the fit reached there) or "held out" (B200: every row
on it; no fit sees them). Per model: its H100 / H200 rows, "fitted" (a training model) or "held out" (a model the
fit never saw). Anything else was never measured: an answer for it has no measured error (docs/slo.md 2c).

    >>> check = profile_check("vllm-cross-model", MODELS["llama-3.1-70b"], GPUS["b200"])
    >>> check["gpu"]["status"], check["model"]["status"]
    ('held out', 'fitted')
    >>> profile_check("trtllm", MODELS["llama-3.1-70b"], GPUS["b200"]) is None
    True
"""

from dataclasses import fields, replace
from typing import NamedTuple

from core.planning.catalog.hardware import GPUS, GPUSpec
from core.planning.catalog.models import MODELS, ModelSpec
from core.planning.cost.expert_rows import vllm_version

CHECKED_ENGINE = "vllm-cross-model"  # the one profile whose errors per GPU and model are stated here


class Checked(NamedTuple):
    """One set of measured rows: status ("fitted" or "held out"), how many, and the RMS relative errors
    (predicted / measured - 1) of their mean TTFT and mean TPOT."""

    status: str
    rows: int
    ttft_rms_rel_err: float
    tpot_rms_rel_err: float


GPU_CHECKS = {
    "h100-80gb": Checked("fitted", 189, 0.194, 0.131),
    "h200-141gb": Checked("fitted", 132, 0.142, 0.076),
    "b200": Checked("held out", 341, 0.443, 0.197),
}
MODEL_CHECKS = {
    "llama-3.1-70b": Checked("fitted", 99, 0.148, 0.078),
    "qwen3-32b": Checked("fitted", 87, 0.215, 0.122),
    "gpt-oss-120b": Checked("fitted", 135, 0.163, 0.126),
    # what a plan's own pricing (today's vLLM: routed MoE kernels) reached on its rows, which ran vLLM 0.12's padded
    # kernel (docs/slo.md 2c, the eighth stage: 0.185 / 0.137 priced with it; the saved run's
    # without_term.padded_expert_kernel holds these)
    "qwen3-235b-a22b": Checked("held out", 32, 0.246, 0.341),
    "qwen3-235b-a22b-fp8": Checked("held out", 32, 0.246, 0.341),  # the checkpoint the rows served
    "llama-3.1-8b": Checked("held out", 21, 1.778, 1.076),
    "minimax-m2.5": Checked("held out", 97, 0.409, 0.124),
    "kimi-k2.5": Checked("held out", 45, 0.252, 0.129),
}
# A plan priced at the vLLM release its model's rows ran (`--vllm-version`, major.minor): the rows priced with that
# release's kernel, the saved run's own figures (Qwen3-235B-A22B's 32 rows at vLLM 0.12, the eighth stage).
RELEASE_CHECKS = {("qwen3-235b-a22b-fp8", (0, 12)): Checked("held out", 32, 0.185, 0.137)}
NOT_MEASURED = "not measured"


# What names a preset rather than describing it: a spec equal to a preset but for these is that preset.
IDENTITY_FIELDS = ("name", "hf_repo")


def _slug(spec, presets: dict) -> str | None:
    """The preset slug whose figures `spec` has, whatever it is called (a fine-tune's config.json has its base
    model's architecture, so its steps cost what the base model's do), else None."""

    def same(preset) -> bool:
        named = {f.name: getattr(preset, f.name) for f in fields(preset) if f.name in IDENTITY_FIELDS}
        return replace(spec, **named) == preset

    return next((slug for slug, preset in presets.items() if same(preset)), None)


def _entry(checks: dict, slug: str | None) -> dict:
    found = checks.get(slug)
    if found is None:
        return {"status": NOT_MEASURED, "rows": 0, "ttft_rms_rel_err": None, "tpot_rms_rel_err": None}
    return found._asdict()


def _model_entry(model: ModelSpec, vllm_release: str | None) -> dict:
    """The model's check: RELEASE_CHECKS' at the release its rows ran, else MODEL_CHECKS'."""
    slug, release = _slug(model, MODELS), vllm_version(vllm_release or "")
    at_release = RELEASE_CHECKS.get((slug, release[:2] if release else None))
    return at_release._asdict() if at_release else _entry(MODEL_CHECKS, slug)


def profile_check(
    engine: str, model: ModelSpec, gpu: GPUSpec, vllm_release: str | None = None
) -> dict | None:
    """{"engine", "gpu": {...}, "model": {...}} (each {"status", "rows", "ttft_rms_rel_err", "tpot_rms_rel_err"};
    status "fitted", "held out" or "not measured", errors None when not measured) for a plan of `model` on `gpu`
    priced with `engine`'s profile at `vllm_release` (None: today's vLLM); None for another engine than
    CHECKED_ENGINE (module docstring)."""
    if engine != CHECKED_ENGINE:
        return None
    return {
        "engine": engine,
        "gpu": _entry(GPU_CHECKS, _slug(gpu, GPUS)),
        "model": _model_entry(model, vllm_release),
    }


def search_check(engine: str, model: ModelSpec, gpus, vllm_release: str | None = None) -> dict | None:
    """`profile_check` for a search over several GPU types: {"engine", "model": {...}, "gpus": {slug: {...}}},
    gpus: (slug or name, GPUSpec) pairs (`SloCandidates.gpu_specs`); None for another engine than CHECKED_ENGINE."""
    if engine != CHECKED_ENGINE:
        return None
    return {
        "engine": engine,
        "model": _model_entry(model, vllm_release),
        "gpus": {name: _entry(GPU_CHECKS, _slug(spec, GPUS)) for name, spec in gpus},
    }


def check_words(check: dict | None, model_name: str, gpu_name: str) -> str:
    """One sentence for a page: how far the profile's mean TTFT and TPOT have been from published vLLM runs on
    this GPU and for this model ("" without a check)."""
    if check is None:
        return ""

    def part(entry: dict, name: str) -> str:
        if entry["status"] == NOT_MEASURED:
            return f"{name}: no published run measured"
        return (
            f"{name} ({entry['status']}, {entry['rows']} runs): TTFT {entry['ttft_rms_rel_err']:.0%}, "
            f"TPOT {entry['tpot_rms_rel_err']:.0%}"
        )

    return (
        f"How far the {check['engine']} profile's mean TTFT and TPOT have been from published vLLM runs "
        f"(RMS relative error): {part(check['gpu'], gpu_name)}; {part(check['model'], model_name)}."
    )


def search_check_words(check: dict | None, model_name: str, gpu_key: str, gpu_name: str) -> str:
    """`check_words` for one GPU of a `search_check` (the chosen deployment's): "" without a check."""
    if check is None or gpu_key not in check["gpus"]:
        return ""
    one = {"engine": check["engine"], "gpu": check["gpus"][gpu_key], "model": check["model"]}
    return check_words(one, model_name, gpu_name)
