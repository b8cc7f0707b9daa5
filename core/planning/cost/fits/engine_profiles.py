"""Engine profiles: the step-time parameters (`core.planning.cost.step_model.StepTimeModel` keyword overrides) that price
a GPU step for one serving engine. `engine_step_defaults("trtllm")` is the fit to NVIDIA's TensorRT-LLM throughput
table (`core.planning.cost.fits.published.gpu_step_defaults`); `engine_step_defaults("vllm")` the fit to measured vLLM
runs (`core.planning.cost.fits.published_vllm`), stored below; `engine_step_defaults("vllm-cross-model")` the same
engine's profile fitted across models (issue 40, docs/slo.md 2c), whose request-side term
(`engine_request_overhead_s`: a fixed front-end time per request plus, in a closed loop, the step in flight when a
request arrives; `core.serving.latency.request_side_seconds`) `predict`, `max-rate` and `slo` add to every TTFT
as the bench's replay does. docs/slo.md: sources, method, errors.
"""

from core.errors import InvalidArgumentError
from core.planning.cost.expert_rows import check_vllm_version
from core.planning.cost.fits.published import gpu_step_defaults

ENGINES = ("vllm", "trtllm", "vllm-cross-model")
# the profiles fitted to vLLM's runs (a vLLM release's kernels apply to them)
VLLM_ENGINES = ("vllm", "vllm-cross-model")
# The request-side term of a profile: seconds per request outside the engine's steps (not a StepTimeModel
# parameter; `engine_request_overhead_s`, `split_request_term`).
REQUEST_TERM = "request_overhead_s"
# The profile `predict`, `max-rate`, `slo` and the planner pages use unless told otherwise: the one fitted across
# models and checked on models it never saw (docs/slo.md 2c, "The default profile"), not the single-model fit
# below, which replayed as the benchmarks the lab now models misses its own model by 0.26 where the cross-model
# fit misses it by 0.12.
DEFAULT_ENGINE = "vllm-cross-model"

# Fitted by core.planning.cost.fits.published_vllm.fit_vllm (bench/slo_published.py recomputes it and prints the errors):
# least squares on log(predicted / measured) of mean TTFT and mean TPOT over the 42 training rows (H100 SXM,
# Llama-3.1-70B FP8, TP 2 / 4 / 8, ISL / OSL 1,024 / 1,024, 1,024 / 8,192 and 8,192 / 1,024, 4-64 clients;
# ai-dynamo/aiconfigurator's silicon_sample.csv at 095f58a51c4c), each row simulated as its closed-loop benchmark.
# RMS relative error (TTFT and TPOT together): 0.150 on the training rows, 0.159 on the 57 held-out rows (H200
# SXM, TP 1 / 2 / 4 / 8: a GPU and a TP size the fit never saw). bandwidth_efficiency sits at its bound 1: the
# low-concurrency TPOTs fall by the weights' read time at the datasheet bandwidth from TP 1 to TP 8 on both GPUs,
# and the rest of the step is the fixed overhead (5.2 ms: launches, sampling, scheduling at these batch sizes).
# Those figures replay each benchmark as 20 rounds of C requests, as it was fitted; replayed as the 10 rounds the
# lab now models (published_vllm.BENCHMARK_ROUNDS) they are 0.261 and 0.251, where issue 40's cross-model fit
# (VLLM_CROSS_MODEL_PROFILE below, engine "vllm-cross-model", the default) misses the same model's rows by
# 0.118. Kept as engine "vllm" for comparison and for the figures stated with it.
VLLM_STEP_DEFAULTS = {
    "bandwidth_efficiency": 1.0,
    "flops_efficiency": 0.42070728149109854,
    "overhead_s": 0.005159719920171328,
    "per_token_overhead_s": 1.657805349677304e-05,
}


# Fitted by core.planning.cost.fits.published_vllm.fit_vllm across models (published_vllm.FIT_NAMES, FIXED held):
# every row of Llama-3.1-70B FP8, Qwen3-32B bf16 and gpt-oss-120b MXFP4 (H100 / H200 SXM) but the KV-limited ones;
# Llama-3.1-8B, Qwen3-235B-A22B, MiniMax-M2.5 and Kimi-K2.5 held out whole. bench/slo_published.py recomputes it
# (docs/slo.md 2c, seventh stage: a fixed cost per kernel, `core.planning.cost.layer_kernels`, each benchmark's
# steady phase with its clients at random phases, `core.serving.workload.out_of_phase_outputs`, and 10 rounds of
# C requests, `published_vllm.BENCHMARK_ROUNDS`): RMS relative error 0.147 on the training rows, held out
# Kimi-K2.5 0.201, Qwen3-235B-A22B 0.163 (0.297 before the eighth stage priced vLLM 0.12's padded MoE kernel,
# which its rows ran and no training row did: the same fit), MiniMax-M2.5 0.302, Llama-3.1-8B 1.469. (The third
# stage's cost per layer, the fourth stage's experts per weight format, the fifth stage's evenly spaced clients and
# the sixth stage's 20 rounds: docs/slo.md 2c.)
VLLM_CROSS_MODEL_PROFILE = {
    "bandwidth_efficiency": 1.0,
    "overhead_s": 0.0,
    "per_token_overhead_s": 0.0,
    "flops_efficiency": 0.47297409088496795,
    "kernel_overhead_s": 6.401066031542313e-06,
    "expert_flops_efficiency": 0.173530652893919,
    "expert_bandwidth_efficiency": 0.7662890546737107,
    REQUEST_TERM: 0.02521462497142705,
}


def check_engine_release(engine: str, vllm_version: str | None) -> str | None:
    """`vllm_version` checked (`check_vllm_version`: a release such as "0.12.0"; None or "" give None, today's vLLM)
    and refused beside an engine that is not vLLM's (InvalidArgumentError)."""
    release = check_vllm_version(vllm_version)
    if release and engine not in VLLM_ENGINES:
        raise InvalidArgumentError(
            f"--vllm-version prices a vLLM release's kernels; --engine {engine} is not vLLM's profile"
        )
    return release


def _profile(engine: str) -> dict:
    if engine == "vllm":
        return VLLM_STEP_DEFAULTS
    if engine == "trtllm":
        return gpu_step_defaults()
    if engine == "vllm-cross-model":
        return VLLM_CROSS_MODEL_PROFILE
    raise InvalidArgumentError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")


def split_request_term(overrides) -> tuple[dict, float | None]:
    """(the StepTimeModel keyword overrides of a profile or of step-time overrides, its request-side seconds or
    None): REQUEST_TERM taken out, the rest a new dict. Raises InvalidArgumentError for a negative or non-finite
    request term."""
    step = dict(overrides or {})
    term = step.pop(REQUEST_TERM, None)
    if term is not None and not (isinstance(term, int | float) and 0 <= term < float("inf")):
        raise InvalidArgumentError(f"{REQUEST_TERM} must be a number of seconds >= 0, got {term!r}")
    return step, None if term is None else float(term)


def engine_step_defaults(engine: str) -> dict:
    """The StepTimeModel keyword overrides for `engine` (one of ENGINES), a new dict each call; the profile's
    request-side term, not a step parameter, left out (`engine_request_overhead_s`). Raises InvalidArgumentError
    naming the allowed engines for any other value."""
    return split_request_term(_profile(engine))[0]


def engine_request_overhead_s(engine: str) -> float | None:
    """The request-side seconds of `engine`'s profile (module docstring), None when it has none ("vllm",
    "trtllm"). Raises InvalidArgumentError naming the allowed engines for an unknown one."""
    return split_request_term(_profile(engine))[1]
