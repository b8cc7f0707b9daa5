"""Issue 40's outside check: an audited MLPerf Inference run of vLLM, never fitted on, set beside what the step-time
profiles say of it.

The run (`REDHAT_H100`): MLPerf Inference v5.1, closed division, Red Hat's Llama-3.1-8B Server submission on one
H100-SXM-80GB with vLLM 0.10.0 (mlcommons/inference_results_v5.1:
closed/RedHat/results/XE8640_4xH100_vLLM/llama3.1-8b/Server/performance/run_1/mlperf_log_summary.txt; its system
file closed/RedHat/systems/XE8640_4xH100_vLLM.json, "1 GPU used"; its `vllm serve` flags in
closed/RedHat/code/llama3.1-8b/README.md). The checkpoint is RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 (per-tensor FP8
weights and activations, closed/RedHat/documentation/calibration.md), the KV cache in bf16 ("auto"), and the server
runs `--max-num-batched-tokens 1024 --max-num-seqs 512 --long-prefill-token-threshold 256 --gpu-memory-utilization 0.91
--block-size 16`; each query is one CNN/DailyMail article to summarize, greedy, `max_tokens` 128, EOS not ignored
(the harness, SUT_VLLM_SingleReplica_Server.py), Poisson arrivals at 39.5 queries/s.

What can be checked without the prompts. Their lengths (the 13,368 articles of cnn_eval.json in Llama-3.1's chat
template) are stored in neither the results nor the reference repository, so the run cannot be replayed whole. Its
TPOT can still be bounded: every step of that server holds at most 1,024 tokens (the token budget), of which one per
running request and at most 256 per prefilling request; by Little's law 39.56 completed queries/s x 3.318 s mean
latency = 131 requests are in the server on average, queued ones included. The TTFT tail (p50 224 ms, p99 1,911 ms)
says prefills wait for room in the steps, i.e. the steps run near their budget, and a decode step then lasts one TPOT
(one token per running request per step). `full_step_seconds` is a profile's time for such a step, the longest over
every split of the budget between decodes (up to `RUNNING`) and 256-token prefill chunks placed at the end of a
prompt, with every running request's context as long as `context_tokens`: an upper bound on the profile's TPOT for
that server whatever the prompts are, as long as none is longer than that. CNN/DailyMail's articles average 781
tokens (See, Liu and Manning, "Get To The Point", ACL 2017, section 4: words and punctuation, so somewhat more
Llama-3 tokens); the bound is stated at 1,024 and 2,048 tokens. 131 is the average: at 1,024-token prompts twice as
many running requests leave the bound where it is (the step stays compute-bound), at 2,048 their KV reads lengthen it
(the cross-model profile 20.56 ms at 131, 21.62 at 200).
"""

from dataclasses import dataclass

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.fits.engine_profiles import engine_step_defaults
from core.planning.cost.step_time import from_specs


@dataclass(frozen=True)
class MlperfServerRun:
    """An MLPerf Server run of vLLM as its summary prints it (seconds, queries/s, tokens/s) and the server's flags
    the bound needs: the model and GPU presets, weight and KV dtypes, TP, the token budget, the longest prefill
    chunk a request gets in a step (`--long-prefill-token-threshold`) and `max_tokens`."""

    source: str
    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str
    tp: int
    vllm_version: str
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    max_tokens: int
    target_qps: float
    completed_qps: float
    output_tokens_per_s: float
    mean_latency_s: float
    ttft_s: dict
    tpot_s: dict
    targets_s: dict

    @property
    def running(self) -> float:
        """Requests in the server on average (Little's law): completed queries/s x mean latency."""
        return self.completed_qps * self.mean_latency_s


REDHAT_H100 = MlperfServerRun(
    source=(
        "mlcommons/inference_results_v5.1 closed/RedHat/results/XE8640_4xH100_vLLM/llama3.1-8b/Server/performance/"
        "run_1/mlperf_log_summary.txt"
    ),
    model="llama-3.1-8b",
    gpu="h100-80gb",
    weight_dtype="fp8",
    kv_dtype="auto",
    tp=1,
    vllm_version="0.10.0",
    max_num_batched_tokens=1024,
    long_prefill_token_threshold=256,
    max_tokens=128,
    target_qps=39.5,
    completed_qps=39.56,
    output_tokens_per_s=5103.99,
    mean_latency_s=3.317798521,
    ttft_s={"p50": 0.223633259, "p90": 0.809289050, "p99": 1.911170364},
    tpot_s={"p50": 0.023644164, "p90": 0.024625410, "p99": 0.025128964, "mean": 0.023113051},
    targets_s={"ttft_p99": 2.0, "tpot_p99": 0.1},
)
RUNNING = int(REDHAT_H100.running)  # requests in the server on average: 131
CONTEXTS = (1024, 2048)  # the longest prompt the bound allows, in tokens (module docstring)


def full_step_seconds(
    engine: str, context_tokens: int, run: MlperfServerRun = REDHAT_H100, running: int = RUNNING
) -> float:
    """The `engine` profile's longest time for one step of `run`'s server at its token budget: d decodes (0 ... running)
    each reading a context of context_tokens + max_tokens, and the rest of the budget in prefill chunks of at most
    long_prefill_token_threshold tokens, each at the end of a context_tokens prompt (its prior context read, its
    pairs computed); the step samples a token per decode and per chunk (module docstring)."""
    step = from_specs(
        MODELS[run.model],
        GPUS[run.gpu],
        run.tp,
        run.weight_dtype,
        run.kv_dtype,
        **engine_step_defaults(engine),
    )
    budget, chunk = run.max_num_batched_tokens, run.long_prefill_token_threshold
    longest = 0.0
    for decodes in range(running + 1):
        prefill = budget - decodes
        chunks = [chunk] * (prefill // chunk) + ([prefill % chunk] if prefill % chunk else [])
        kv_read = pairs = float(decodes * (context_tokens + run.max_tokens))
        for size in chunks:
            prior = max(0, context_tokens - size)
            kv_read += prior
            pairs += size * prior + size * (size + 1) / 2
        seconds = step.step_seconds(budget, kv_read, pairs, output_tokens=decodes + len(chunks))
        longest = max(longest, seconds)
    return longest


def outside_check(engines=("vllm-cross-model", "vllm", "trtllm")) -> dict:
    """{engine: {context_tokens: {"full_step_ms", "vs_measured_tpot_p50"}}}, the measured TPOT p50 / p99 (ms) and
    the run's Little's-law running count: `python -m bench.mlperf_check` prints it."""
    run = REDHAT_H100
    tpot = run.tpot_s["p50"]
    steps = {
        (engine, context): full_step_seconds(engine, context) for engine in engines for context in CONTEXTS
    }
    return {
        "run": run.source,
        "vllm_version": run.vllm_version,
        "running": round(run.running, 1),
        "measured_tpot_ms": {q: round(run.tpot_s[q] * 1e3, 2) for q in ("p50", "p99")},
        "measured_ttft_ms": {q: round(v * 1e3, 1) for q, v in run.ttft_s.items()},
        "profiles": {
            engine: {
                str(context): {
                    "full_step_ms": round(steps[engine, context] * 1e3, 2),
                    "vs_measured_tpot_p50": round(steps[engine, context] / tpot - 1.0, 3),
                }
                for context in CONTEXTS
            }
            for engine in engines
        },
    }
