"""The `vllm bench serve` command that replays a `Load` against the `vllm serve` of a capacity plan
(`core.planning.memory.vllm_command`), so a prediction can be checked on the GPU it is for.

`vllm bench serve` flags (vLLM's vllm/benchmarks/serve.py `add_cli_args` and vllm/benchmarks/datasets
`add_dataset_parser`, docs/pages/slo_planner.md cites them):
- `--dataset-name random --random-input-len P --random-output-len O --random-range-ratio S`: each request's input
  and output lengths uniform on the integers [floor(L x (1 - S)), ceil(L x (1 + S))], S in [0, 1) (symmetric since
  vLLM PR #16126; before it the range was [L x S, L]). `Load.length_spread` s draws from
  [round(L x (1 - s)), round(L x (1 + s))]: the same range up to one token at either end, so S = s. vLLM counts
  the tokenizer's special tokens (a BOS) inside P: its sampled prompt is P minus them, the server adds them back.
- `--request-rate R` (Poisson at `--burstiness 1`, the default), or `--request-rate inf --max-concurrency C`: every
  request sent at once, at most C in flight, so each finished request lets the next one in (`Load`'s closed loop).
- `--ignore-eos`: every request generates exactly its output length, as the simulator does.
- `--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99`: the percentiles the lab predicts (vLLM
  calls end-to-end latency e2el); `--seed K`: the lengths' draw.
- `--dataset-name prefix_repetition --prefix-repetition-prefix-len P --prefix-repetition-suffix-len S
  --prefix-repetition-num-prefixes N --prefix-repetition-output-len O` (vLLM 0.32's `PrefixRepetitionRandomDataset`)
  for a load with shared prefixes: N random prefixes of P tokens, each followed by random suffixes of S tokens, every
  prompt P + S tokens with O output tokens. vLLM gives each prefix exactly num_prompts // N prompts (then shuffles
  them), where `Load` draws each request's prefix uniformly: the same share of each prefix on average, so the same
  hits once every prefix has been seen; the command rounds num_prompts up to a multiple of N, which vLLM would
  otherwise round down. It has no length spread, no Zipf weights and no multi-turn chats: those loads are refused.
vLLM's percentiles cover every prompt, the ramp-up from an empty server and the drain included; `bench_num_prompts`
sizes the run so that those are a small share of it.
"""

import math
from collections.abc import Sequence

from core.errors import InvalidArgumentError
from core.planning.catalog.models import ModelSpec
from core.planning.predict.load import Load
from core.serving.latency import PERCENTILES

BENCH_METRIC_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}  # ours -> vLLM's
MIN_BENCH_PROMPTS = 1000  # vLLM's own --num-prompts default
PROMPTS_PER_IN_FLIGHT = 20  # ramp-up + drain ~ 2 x in-flight requests: at most ~10% of the run


def in_flight(stable: bool, mean_e2e_s: float | None, deployment, load: Load) -> float:
    """Requests in flight (Little's law: rate x mean end-to-end latency; the clients of a closed loop); for a
    load the deployment does not serve, all it can run: replicas x max_num_seqs (`deployment`: anything with
    those two, a `Deployment` or a disaggregated one's decode pool)."""
    if load.concurrency is not None:
        return float(load.concurrency)
    if not stable or mean_e2e_s is None:
        return float(deployment.replicas * deployment.max_num_seqs)
    return load.rate * mean_e2e_s


def bench_num_prompts(load: Load, in_flight: float) -> int:
    """Prompts for a `vllm bench serve` run of `load` whose percentiles describe the steady state: at least
    MIN_BENCH_PROMPTS, and PROMPTS_PER_IN_FLIGHT x the requests in flight (`in_flight`: the clients of a closed
    loop, else Little's law, rate x mean end-to-end latency), rounded up to a hundred. The ramp-up and the drain
    each last about one in-flight population, so they are at most ~1/10 of the prompts."""
    if load.concurrency is not None:
        in_flight = max(in_flight, load.concurrency)
    if not math.isfinite(in_flight) or in_flight < 0:
        raise InvalidArgumentError(f"in_flight must be a finite number >= 0, got {in_flight!r}")
    wanted = max(MIN_BENCH_PROMPTS, math.ceil(PROMPTS_PER_IN_FLIGHT * in_flight))
    return -(-wanted // 100) * 100


def prefix_repetition_problem(load: Load) -> str | None:
    """Why vLLM's prefix_repetition dataset cannot replay `load` (a load whose prompts share tokens), or None when
    it can: every prompt shared_prefix_len + a suffix of at least one token, fixed lengths, prefixes drawn
    uniformly, one request per conversation."""
    why = []
    if load.turns > 1:
        why.append(f"multi-turn chats (--turns {load.turns})")
    if load.length_spread > 0:
        why.append(f"length spread ({load.length_spread:g}: its prompts and outputs have fixed lengths)")
    if load.prefix_zipf is not None:
        why.append(
            f"Zipf-weighted prefixes (--prefix-zipf {load.prefix_zipf:g}: it uses each prefix equally)"
        )
    if load.shared_prefix_len >= load.prompt_len:
        why.append("prompts that are all prefix (it appends a suffix of at least one token)")
    if not why:
        return None
    return (
        "no vllm bench serve dataset replays this load: prefix_repetition (its dataset for shared prefixes) has "
        f"no {', no '.join(why)}"
    )


def vllm_bench_serve_command(
    model: ModelSpec,
    load: Load,
    num_prompts: int,
    metrics: Sequence[str] = tuple(BENCH_METRIC_NAMES),
    percentiles: Sequence[int] = PERCENTILES,
) -> str:
    """The `vllm bench serve` command replaying `load` (rate or clients, lengths, spread, seed) in `num_prompts`
    requests against a `vllm serve` of `model` on this machine's default port, reporting the percentiles
    `percentiles` of `metrics` (our names: ttft, tpot, itl, e2e). A load with shared prefixes is replayed by the
    prefix_repetition dataset (num_prompts rounded up to a multiple of its prefixes). Flags and their semantics:
    module docstring. Raises InvalidArgumentError for an unknown metric, a percentile outside (0, 100),
    num_prompts < 1, or a shared-prefix load that dataset cannot replay (`prefix_repetition_problem`)."""
    if not isinstance(num_prompts, int) or num_prompts < 1:
        raise InvalidArgumentError(f"num_prompts must be a whole number >= 1, got {num_prompts!r}")
    unknown = [m for m in metrics if m not in BENCH_METRIC_NAMES]
    if unknown or not metrics:
        raise InvalidArgumentError(
            f"metrics must be among {', '.join(BENCH_METRIC_NAMES)}, got {list(metrics)}"
        )
    if not percentiles or any(not 0 < q < 100 for q in percentiles):
        raise InvalidArgumentError(f"percentiles must be in (0, 100), got {list(percentiles)}")
    parts = ["vllm bench serve", f"--model {model.hf_repo or model.name}"]
    if load.uses_prefix_cache:
        problem = prefix_repetition_problem(load)
        if problem is not None:
            raise InvalidArgumentError(problem)
        num_prompts = -(-num_prompts // load.num_prefixes) * load.num_prefixes
        parts += [
            "--dataset-name prefix_repetition",
            f"--prefix-repetition-prefix-len {load.shared_prefix_len}",
            f"--prefix-repetition-suffix-len {load.prompt_len - load.shared_prefix_len}",
            f"--prefix-repetition-num-prefixes {load.num_prefixes}",
            f"--prefix-repetition-output-len {load.output_len}",
        ]
    else:
        parts += [
            "--dataset-name random",
            f"--random-input-len {load.prompt_len}",
            f"--random-output-len {load.output_len}",
        ]
        if load.length_spread > 0:
            parts.append(f"--random-range-ratio {load.length_spread:.12g}")
    parts.append(f"--num-prompts {num_prompts}")
    if load.concurrency is not None:
        parts += ["--request-rate inf", f"--max-concurrency {load.concurrency}"]
    else:
        parts.append(f"--request-rate {load.rate:.12g}")
    parts += [
        "--ignore-eos",
        f"--percentile-metrics {','.join(BENCH_METRIC_NAMES[m] for m in metrics)}",
        f"--metric-percentiles {','.join(f'{q:g}' for q in percentiles)}",
        f"--seed {load.seed}",
    ]
    return " \\\n  ".join(parts)


def bench_command(model: ModelSpec, load: Load, num_prompts: int) -> str:
    """`vllm_bench_serve_command` of `load` with every metric and percentile the lab predicts; for a load no vLLM
    dataset replays (multi-turn chats, Zipf-weighted prefixes, a length spread with shared prefixes), a comment
    line saying why instead."""
    if load.uses_prefix_cache:
        problem = prefix_repetition_problem(load)
        if problem is not None:
            return f"# {problem}"
    return vllm_bench_serve_command(model, load, num_prompts)
