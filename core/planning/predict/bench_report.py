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

Against a run: `read_bench_result` reads the JSON `vllm bench serve --save-result` wrote, `check_same_load` refuses a
run of another load (its request rate or clients, Poisson arrivals, its mean prompt and output lengths: total_input_tokens and
total_output_tokens over completed, within LENGTH_TOLERANCE), and `against_result` pairs every predicted figure with
the run's (`predict --against RESULT.json`). A run's percentiles include its ramp-up and drain, which a steady state
has not (`vllm_bench.bench_num_prompts` sizes the printed command so that they are a small share).
"""

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from core.errors import InvalidArgumentError
from core.planning.catalog.models import ModelSpec
from core.planning.memory.kv_accounting import resolve_kv_dtype, resolve_weight_dtype
from core.planning.predict.load import Load
from core.planning.predict.vllm_bench import BENCH_METRIC_NAMES
from core.serving.latency import PERCENTILES
from core.uploads import parse_json, upload_text

WIDTH = 50  # vLLM's block width
# a run's mean prompt / output length within 5 % of the load's (tokenizers differ by a few tokens)
LENGTH_TOLERANCE = 0.05
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

    (request_label, request_key), others = THROUGHPUT_LINES[0], THROUGHPUT_LINES[1:]
    lines = [f"{title:=^{WIDTH}}", _line(request_label, value(request_key))]
    # the token throughputs where known (a prediction of multi-turn chats has no total: `bench_values`)
    lines += [_line(label, value(key)) for label, key in others if key in result]
    for ours, _, _, header in METRIC_BLOCKS:
        if ours in metrics:
            lines.append(f"{header:-^{WIDTH}}")
            lines += [_line(label, value(key)) for label, key in _metric_lines(ours, percentiles)]
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def _metric_lines(metric: str, percentiles: Sequence[float] = PERCENTILES) -> list[tuple[str, str]]:
    """(label, result key) of one metric's lines in vLLM's order: mean, median, each percentile."""
    _, key, name, _ = next(block for block in METRIC_BLOCKS if block[0] == metric)
    lines = [(f"Mean {name} (ms):", f"mean_{key}_ms"), (f"Median {name} (ms):", f"median_{key}_ms")]
    return lines + [(f"P{w} {name} (ms):", f"p{w}_{key}_ms") for w in map(_percentile_word, percentiles)]


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
    output tokens/s + requests/s x the mean prompt length (`load.prompt_len`: the mean when lengths spread), left
    out for multi-turn chats, whose later prompts carry the conversation so far."""
    values = {
        "request_throughput": prediction["request_throughput_per_s"],
        "output_throughput": prediction["throughput_tokens_per_s"],
    }
    if load.turns == 1:  # a chat's later turns carry its history: prompt_len is only the first turn's
        total = (
            prediction["throughput_tokens_per_s"] + prediction["request_throughput_per_s"] * load.prompt_len
        )
        values["total_token_throughput"] = total
    for ours in defined_metrics(prediction):
        seconds = [prediction[f"mean_{ours}_s"], prediction[f"{ours}_p50_s"]]  # the median is the p50
        seconds += [prediction[f"{ours}_p{q}_s"] for q in PERCENTILES]
        values |= {key: t * 1000.0 for (_, key), t in zip(_metric_lines(ours), seconds, strict=True)}
    return values


def prediction_footer(prediction: Mapping, model: ModelSpec | None = None) -> str:
    """Two lines under a predicted block: the deployment it is for, and the steady state's own checks
    (`Prediction.to_dict()`'s deployment, converged, stable, kv_limited, measured and warm-up requests). `model`:
    the deployment's model, whose dtypes an "auto" resolves to ("weights auto (bf16)")."""
    d = prediction["deployment"]
    weights, kv = d["weight_dtype"], d["kv_dtype"]
    if model is not None:
        weights = _as_resolved(weights, resolve_weight_dtype(model, weights))
        kv = _as_resolved(kv, resolve_kv_dtype(model, kv))
    replicas = f"{d['replicas']} replica" + ("" if d["replicas"] == 1 else "s")
    yes = {True: "yes", False: "no"}
    return "\n".join(
        (
            f"predicted for {d['model']} on {d['num_gpus']} x {d['gpu']} (tp {d['tp']}, pp {d['pp']}, {replicas}; "
            f"max_num_seqs {d['max_num_seqs']}, weights {weights}, KV {kv}), "
            f"engine profile {d['engine']}",
            f"steady state: converged {yes[prediction['converged']]}, stable {yes[prediction['stable']]}, "
            f"KV-limited {yes[prediction['kv_limited']]}; {prediction['measured_requests']:,} requests measured "
            f"after {prediction['warmup_requests']:,} of warm-up; the 95% intervals: --format json",
        )
    )


def _as_resolved(asked: str, resolved: str) -> str:
    return asked if asked == resolved else f"{asked} ({resolved})"


def _number(value) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value, minimum: int) -> bool:
    """An int (not a bool) of at least `minimum`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def bench_result_from(data: bytes, what: str) -> dict:
    """The `vllm bench serve --save-result` JSON object in `data` (an upload or a file's bytes; `what` names it in
    messages). Raises InvalidArgumentError for text that is no JSON (`core.uploads`' checks: archives, binary,
    nesting bombs) or an object without what a comparison needs: completed (a whole number >= 1), the token
    totals (>= 0), request_rate (> 0, or "inf"), max_concurrency (absent, null or >= 1) and burstiness (> 0)."""
    result = parse_json(upload_text(data, what, "the JSON `vllm bench serve --save-result` writes"), what)
    needed = ("completed", "total_input_tokens", "total_output_tokens", "request_rate", "request_throughput")
    missing = [key for key in needed if not isinstance(result, dict) or key not in result]
    if missing:
        raise InvalidArgumentError(
            f"{what} is not a `vllm bench serve --save-result` file (no {', '.join(missing)})"
        )
    rate, clients = result["request_rate"], result.get("max_concurrency")
    burst = result.get("burstiness", 1.0)
    checks = {
        "completed": _whole(result["completed"], 1),
        "total_input_tokens": _number(result["total_input_tokens"]) and result["total_input_tokens"] >= 0,
        "total_output_tokens": _number(result["total_output_tokens"]) and result["total_output_tokens"] >= 0,
        "request_rate": rate == "inf" or (_number(rate) and rate > 0),
        "max_concurrency": clients is None or _whole(clients, 1),
        "burstiness": _number(burst) and burst > 0,
    }
    bad = [f"{key} {result.get(key, burst)!r}" for key, ok in checks.items() if not ok]
    if bad:
        raise InvalidArgumentError(f"{what} is not a run's result: {', '.join(bad)}")
    return result


def read_bench_result(path: str | Path) -> dict:
    """`bench_result_from` of the file at `path` (the CLI's --against). Raises InvalidArgumentError when it cannot
    be read too."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InvalidArgumentError(f"--against {path}: cannot be read ({error.strerror or error})") from None
    return bench_result_from(data, f"--against {path}")


def check_same_load(result: Mapping, load: Load, what: str = "the run") -> None:
    """Raise InvalidArgumentError naming each way the run of `result` (`bench_result_from`'s; `what` names it)
    was not `load`: another request rate (a closed loop: `--request-rate inf --max-concurrency C`), arrivals that
    are not Poisson, or a mean prompt or output length more than LENGTH_TOLERANCE away."""
    rate, clients = result["request_rate"], result.get("max_concurrency")
    why = []
    if load.concurrency is not None:
        if rate != "inf" or clients != load.concurrency:
            why.append(
                f"it ran request_rate {rate} with max_concurrency {clients}, not {load.concurrency} clients"
            )
    elif rate == "inf" or not math.isclose(float(rate), load.rate, rel_tol=1e-9) or clients is not None:
        why.append(f"it ran request_rate {rate} (max_concurrency {clients}), not {load.rate:g} req/s")
    elif result.get("burstiness", 1.0) != 1.0:  # vLLM's gamma arrivals: Poisson only at burstiness 1
        why.append(f"its arrivals had burstiness {result['burstiness']}, not Poisson's 1")
    for name, key, wanted in (
        ("prompt", "total_input_tokens", load.prompt_len),
        ("output", "total_output_tokens", load.output_len),
    ):
        mean = result[key] / result["completed"]
        if abs(mean / wanted - 1.0) > LENGTH_TOLERANCE:
            why.append(f"its mean {name} length is {mean:,.1f} tokens, not {wanted:,}")
    if why:
        raise InvalidArgumentError(f"{what} is of another load: " + "; ".join(why))


def against_result(values: Mapping[str, float], result: Mapping) -> dict[str, dict[str, float]]:
    """Each predicted figure of `values` (`bench_values`' keys) the run's `result` has too: {key: {"predicted",
    "measured", "rel_err"}}, rel_err = predicted / measured - 1 (None where the run measured 0)."""
    rows = {}
    for key, predicted in values.items():
        measured = result.get(key)
        if _number(measured):
            rows[key] = {
                "predicted": predicted,
                "measured": float(measured),
                "rel_err": predicted / measured - 1.0 if measured else None,
            }
    return rows


def figure_label(key: str) -> str:
    """vLLM's label of the figure under result key `key` ("mean_ttft_ms" -> "Mean TTFT (ms):")."""
    return _LABELS[key]


def against_table(rows: Mapping[str, Mapping[str, float | None]]) -> str:
    """`against_result`'s rows as lines of vLLM's labels: predicted, measured (as vLLM prints them) and the error."""
    lines = [f"{'':<40} {'predicted':>10} {'measured':>10} {'error':>8}"]
    for key, row in rows.items():
        error = "" if row["rel_err"] is None else f"{row['rel_err']:+.1%}"
        lines.append(f"{figure_label(key):<40} {row['predicted']:>10.2f} {row['measured']:>10.2f} {error:>8}")
    return "\n".join(lines)


_LABELS = {
    key: label
    for label, key in (
        *THROUGHPUT_LINES,
        *(line for block in METRIC_BLOCKS for line in _metric_lines(block[0])),
    )
}
