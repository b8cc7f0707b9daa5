"""A prediction in `vllm bench serve`'s words: the result block vLLM 0.32 prints at the end of a run
(vllm/benchmarks/serve.py, `benchmark` and its `process_one_metric`), so a predicted steady state sits line for line
beside the run that checks it (the command `vllm_bench_serve_command` prints).

vLLM's block: a 50-character title centred in "=", one `{label:<40} {value:<10.2f}` line per figure (the value
left-aligned in 10 characters, so a line ends in spaces), per metric a header centred in "-" followed by its mean,
median and percentiles in ms, and 50 "=" at the end. Its saved result JSON has the same figures under the keys
`bench_report` reads: request_throughput, output_throughput, total_token_throughput, and per metric (vLLM's names
ttft, tpot, itl, e2el) mean_{m}_ms, median_{m}_ms and p{q}_{m}_ms. So `bench_report(result)` of vLLM's own saved
result prints what vLLM printed (tests/vllm/test_bench_prefix_repetition.py holds the two equal, line for line), and
`bench_values` puts a prediction under those keys.

Printed for a prediction: the throughputs a steady state has (requests, output tokens and all tokens per second)
and every metric's mean, median and percentiles. Left out, since a steady state has none: the run's request and
token counts, its duration, its peak throughput and concurrency, and goodput. After the block, outside vLLM's
layout, `prediction_footer`: what was predicted (the deployment and engine) and how far to trust it (converged,
stable, the requests measured after the warm-up).
"""

from collections.abc import Mapping, Sequence

from core.errors import InvalidArgumentError
from core.planning.predict.load import Load
from core.planning.predict.vllm_bench import BENCH_METRIC_NAMES
from core.serving.latency import PERCENTILES

WIDTH = 50  # vLLM's block width
VLLM_TITLE = " Serving Benchmark Result "
PREDICTED_TITLE = " Predicted Serving Benchmark Result "
# vLLM's first-block lines a steady state has, in vLLM's order: (label, result key)
THROUGHPUT_LINES = (
    ("Request throughput (req/s):", "request_throughput"),
    ("Output token throughput (tok/s):", "output_throughput"),
    ("Total token throughput (tok/s):", "total_token_throughput"),
)
# per metric, vLLM's name in labels and its header: (our name, vLLM's key name, label name, header)
METRIC_BLOCKS = (
    ("ttft", "ttft", "TTFT", "Time to First Token"),
    ("tpot", "tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "itl", "ITL", "Inter-token Latency"),
    ("e2e", "e2el", "E2EL", "End-to-end Latency"),
)


def _line(label: str, value: float) -> str:
    return f"{label:<40} {value:<10.2f}"


def _percentile_word(q: float) -> str:
    """vLLM's name of percentile q in a label and a key: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(q)) if int(q) == q else str(q)


def bench_report(
    result: Mapping[str, float],
    metrics: Sequence[str] = tuple(BENCH_METRIC_NAMES),
    percentiles: Sequence[float] = PERCENTILES,
    title: str = VLLM_TITLE,
) -> str:
    """The block `vllm bench serve` prints for the figures of `result` (its saved result JSON's keys, module
    docstring): the throughput lines, then for each of `metrics` (our names: ttft, tpot, itl, e2e) its mean,
    median and `percentiles`. Raises InvalidArgumentError naming a missing key or an unknown metric."""
    unknown = [m for m in metrics if m not in BENCH_METRIC_NAMES]
    if unknown:
        raise InvalidArgumentError(
            f"metrics must be among {', '.join(BENCH_METRIC_NAMES)}, got {list(metrics)}"
        )

    def value(key: str) -> float:
        if key not in result:
            raise InvalidArgumentError(f"the result has no {key!r}; a vLLM bench result names it")
        return float(result[key])

    lines = [f"{title:=^{WIDTH}}"]
    lines += [_line(label, value(key)) for label, key in THROUGHPUT_LINES]
    for ours, key, name, header in METRIC_BLOCKS:
        if ours not in metrics:
            continue
        lines.append(f"{header:-^{WIDTH}}")
        lines.append(_line(f"Mean {name} (ms):", value(f"mean_{key}_ms")))
        lines.append(_line(f"Median {name} (ms):", value(f"median_{key}_ms")))
        for q in percentiles:
            word = _percentile_word(q)
            lines.append(_line(f"P{word} {name} (ms):", value(f"p{word}_{key}_ms")))
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def defined_metrics(prediction: Mapping[str, float | None]) -> tuple[str, ...]:
    """The metrics (our names) whose every percentile and mean `prediction` defines (TPOT and ITL are undefined
    for one-token outputs, where vLLM prints 0.00)."""
    return tuple(
        ours
        for ours, _, _, _ in METRIC_BLOCKS
        if prediction.get(f"mean_{ours}_s") is not None
        and all(prediction.get(f"{ours}_p{q}_s") is not None for q in PERCENTILES)
    )


def bench_values(prediction: Mapping[str, float | None], load: Load) -> dict[str, float]:
    """A prediction's figures (`Prediction.to_dict()`, seconds) under vLLM's result keys (ms): the percentiles
    PERCENTILES of every metric it defines (`defined_metrics`), the median being p50; total_token_throughput =
    output tokens/s + requests/s x the mean prompt length (`load.prompt_len`: the mean when lengths spread)."""
    values = {
        "request_throughput": prediction["request_throughput_per_s"],
        "output_throughput": prediction["throughput_tokens_per_s"],
        "total_token_throughput": prediction["throughput_tokens_per_s"]
        + prediction["request_throughput_per_s"] * load.prompt_len,
    }
    for ours, key, _, _ in METRIC_BLOCKS:
        if ours not in defined_metrics(prediction):
            continue
        values[f"mean_{key}_ms"] = prediction[f"mean_{ours}_s"] * 1000.0
        values[f"median_{key}_ms"] = prediction[f"{ours}_p50_s"] * 1000.0
        for q in PERCENTILES:
            values[f"p{_percentile_word(q)}_{key}_ms"] = prediction[f"{ours}_p{q}_s"] * 1000.0
    return values


def prediction_footer(prediction: Mapping) -> str:
    """Two lines under a predicted block: the deployment it is for, and the steady state's own checks
    (`Prediction.to_dict()`'s deployment, converged, stable, kv_limited, measured and warm-up requests)."""
    d = prediction["deployment"]
    replicas = f"{d['replicas']} replica" + ("" if d["replicas"] == 1 else "s")
    yes = {True: "yes", False: "no"}
    return "\n".join(
        (
            f"predicted for {d['model']} on {d['num_gpus']} x {d['gpu']} (tp {d['tp']}, pp {d['pp']}, {replicas}; "
            f"max_num_seqs {d['max_num_seqs']}, weights {d['weight_dtype']}, KV {d['kv_dtype']}), "
            f"engine profile {d['engine']}",
            f"steady state: converged {yes[prediction['converged']]}, stable {yes[prediction['stable']]}, "
            f"KV-limited {yes[prediction['kv_limited']]}; {prediction['measured_requests']:,} requests measured "
            f"after {prediction['warmup_requests']:,} of warm-up; the 95% intervals: --format json",
        )
    )
