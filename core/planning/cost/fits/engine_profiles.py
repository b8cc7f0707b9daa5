"""Engine profiles: the step-time parameters (`core.planning.cost.step_time.StepTimeModel` keyword overrides) that price
a GPU step for one serving engine. `engine_step_defaults("trtllm")` is the fit to NVIDIA's TensorRT-LLM throughput
table (`core.planning.cost.fits.published.gpu_step_defaults`); `engine_step_defaults("vllm")` the fit to measured vLLM
runs (`core.planning.cost.fits.published_vllm`), stored below. docs/slo.md: sources, method, errors.
"""

from core.errors import InvalidArgumentError
from core.planning.cost.fits.published import gpu_step_defaults

ENGINES = ("vllm", "trtllm")
DEFAULT_ENGINE = "vllm"

# Fitted by core.planning.cost.fits.published_vllm.fit_vllm (bench/slo_published.py recomputes it and prints the errors):
# least squares on log(predicted / measured) of mean TTFT and mean TPOT over the 42 training rows (H100 SXM,
# Llama-3.1-70B FP8, TP 2 / 4 / 8, ISL / OSL 1,024 / 1,024, 1,024 / 8,192 and 8,192 / 1,024, 4-64 clients;
# ai-dynamo/aiconfigurator's silicon_sample.csv at 095f58a51c4c), each row simulated as its closed-loop benchmark.
# RMS relative error (TTFT and TPOT together): 0.150 on the training rows, 0.159 on the 57 held-out rows (H200
# SXM, TP 1 / 2 / 4 / 8: a GPU and a TP size the fit never saw). bandwidth_efficiency sits at its bound 1: the
# low-concurrency TPOTs fall by the weights' read time at the datasheet bandwidth from TP 1 to TP 8 on both GPUs,
# and the rest of the step is the fixed overhead (5.2 ms: launches, sampling, scheduling at these batch sizes).
# Issue 40's cross-model fit (published_vllm.FIT_NAMES over Llama-3.1-70B, Qwen3-32B and gpt-oss-120b, per-layer
# overhead, expert GEMM efficiency and a request-side TTFT term that predict does not price yet; docs/slo.md 2c)
# is not stored here: it meets neither of that targets yet and is worse on the 70B model than this one.
VLLM_STEP_DEFAULTS = {
    "bandwidth_efficiency": 1.0,
    "flops_efficiency": 0.42070728149109854,
    "overhead_s": 0.005159719920171328,
    "per_token_overhead_s": 1.657805349677304e-05,
}


def engine_step_defaults(engine: str) -> dict:
    """The StepTimeModel keyword overrides for `engine` (one of ENGINES), a new dict each call.
    Raises InvalidArgumentError naming the allowed engines for any other value."""
    if engine == "vllm":
        return dict(VLLM_STEP_DEFAULTS)
    if engine == "trtllm":
        return dict(gpu_step_defaults())
    raise InvalidArgumentError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
