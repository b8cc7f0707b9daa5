"""`python -m core.planning predict` (one deployment at one load) and `python -m core.planning max-rate` (the
highest Poisson rate it holds within latency targets), each printing one JSON object.

    python -m core.planning predict --model llama-3.1-8b --gpu h100-80gb --tp 1 --rate 12 \\
        --prompt-len 1500 --output-len 256
    python -m core.planning max-rate --model llama-3.1-8b --gpu h100-80gb --prompt-len 1500 --output-len 256 \\
        --ttft-p99 1 --tpot-p99 0.05

The levers (docs/levers.md): --shared-prefix-len S --num-prefixes G --prefix-zipf a --turns T --turn-gap s
(prompts sharing prefixes, chats, through the prefix cache); --spec-tokens K --spec-acceptance a1,...,aK
--spec-method ngram|draft-model|eagle --draft-model NAME (speculative decoding); predict --disagg
--prefill-workers X --prefill-tp A --decode-workers Y --decode-tp B [--kv-link nvlink|network]; --replicas N
--routing round-robin|random|least-loaded|prefix-aware|session|approximate-prefix (a routed fleet: `core.serving.fleet`);
--data-parallel-size D --enable-expert-parallel (a MoE model's data-parallel attention and expert parallelism,
vLLM's flags: `Deployment.data_parallel` / `expert_parallel`; deployment.vllm_parallel_flags echoes them).

`predict --format vllm-bench` (and `max-rate`'s, at the highest rate): the steady state as `vllm bench serve`
prints its result, the same labels and ms (`core.planning.predict.bench_report`), to set beside the run of the
`vllm bench serve` command that checks it;
`predict --against RESULT.json` (that run's `--save-result` file, of the same load) pairs each predicted figure with
the run's and its error ("against" in the JSON; a table with --format vllm-bench).

A closed loop's finite benchmark: --benchmark-requests N (with --concurrency C) adds "benchmark", the means an
aiperf-style run of N requests from a synchronized start reports (`core.planning.predict.benchmark`), beside the
steady state.

Any model: --config PATH [--num-params N] (a Hugging Face config.json, as the capacity planner takes it) in place
of --model, on predict, max-rate and slo; the same JSON keys as for a preset (deployment.model is the file's
name).

Exit status 0; 2 with one plain line on stderr naming the bad flag.
"""

import argparse
import json
import math
import sys
from collections.abc import Sequence

from core.errors import InvalidArgumentError, LabError
from core.planning.catalog.models import ModelSpec, model_from_config_file
from core.planning.commands.flags import add_exclusive_flags, add_flags, flag_kwargs
from core.planning.commands.subcommands import COMMANDS
from core.planning.cost.speculative import SPECULATION_FIELDS
from core.planning.predict.bench_report import (
    PREDICTED_TITLE,
    against_result,
    against_table,
    bench_report,
    bench_values,
    check_same_load,
    defined_metrics,
    prediction_footer,
    read_bench_result,
)
from core.planning.predict.benchmark import BENCHMARK_FIELD, benchmark_means, check_benchmark_requests
from core.planning.predict.deployment_fields import (
    DEPLOYMENT_FIELDS,
    GPU_MEMORY_FIELD,
    MODEL_FIELD,
    OFFLOAD_FIELDS,
    ROUTING_FIELD,
)
from core.planning.predict.disagg import DISAGG_FIELDS, predict_disagg
from core.planning.predict.inputs import deployment_from, disagg_from, load_from
from core.planning.predict.load import LEVER_FIELDS, RATE_FIELDS, SHAPE_FIELDS, Load
from core.planning.predict.max_rate import COMMAND_DIGITS, max_rate, round_down
from core.planning.predict.prediction import predict
from core.planning.predict.target_fields import TARGET_FIELDS, targets_from

OUTPUT_FORMATS = ("json", "vllm-bench")  # `predict --format`


class LineErrorParser(argparse.ArgumentParser):
    """argparse whose usage errors are one plain line on stderr and exit status 2."""

    def error(self, message):  # one plain line and exit 2, as every other bad input
        unknown = message.split()[2:] if message.startswith("unrecognized arguments:") else []
        hint = "".join(h for flag, h in CAPACITY_ONLY_FLAGS.items() if flag in unknown)
        print(f"error: {message}{hint}", file=sys.stderr)
        raise SystemExit(2)


# flags of the capacity plan (`python -m core.planning`) a user may carry over to predict / max-rate, with what
# these commands take instead (said after argparse's "unrecognized arguments")
CAPACITY_ONLY_FLAGS = {
    "--num-gpus": " (predict and max-rate count GPUs as tp x pp x --data-parallel-size x --replicas)",
    "--gpu-memory-utilization": f" (predict and max-rate plan with vLLM's default, {GPU_MEMORY_FIELD.default})",
    "--max-model-len": " (predict and max-rate size max_model_len to the load's longest request)",
}


def deployment_flags(parser: argparse.ArgumentParser) -> None:
    """--model --gpu --tp --pp --replicas --data-parallel-size --enable-expert-parallel --max-num-seqs
    --max-num-batched-tokens --weight-dtype --kv-dtype --engine, speculative decoding (--spec-tokens
    --spec-acceptance --spec-method --draft-model), a host KV tier (--kv-offload-gib --offload-policy
    --offload-bandwidth-gbps) and --routing: one deployment (`Deployment`), made from its input groups."""
    config_flags(parser)
    add_flags(parser, DEPLOYMENT_FIELDS + SPECULATION_FIELDS + OFFLOAD_FIELDS + (ROUTING_FIELD,))


def config_flags(parser: argparse.ArgumentParser) -> None:
    """--model PRESET | --config PATH [--num-params N]: a preset or any Hugging Face config.json (as the capacity
    planner takes them; `model_from_args` reads them)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(MODEL_FIELD.flag, **flag_kwargs(MODEL_FIELD))
    source.add_argument("--config", help="path of a Hugging Face config.json (instead of --model)")
    parser.add_argument("--num-params", type=float, help="parameter count for --config (default: estimated)")


def model_from_args(args) -> "str | ModelSpec":
    """The preset slug of --model, or the ModelSpec of --config (--num-params only with --config)."""
    if args.config is None:
        if args.num_params is not None:
            raise InvalidArgumentError("--num-params goes with --config (a preset has its own count)")
        return args.model
    return model_from_config_file(args.config, args.num_params)


def load_flags(parser: argparse.ArgumentParser) -> None:
    """--prompt-len --output-len --length-spread --seed, and the shared prefixes and chats (--shared-prefix-len
    --num-prefixes --prefix-zipf --turns --turn-gap): the requests' shape (`Load` without its rate), made from
    `SHAPE_FIELDS` and `LEVER_FIELDS`."""
    add_flags(parser, SHAPE_FIELDS + LEVER_FIELDS)


def target_flags(parser: argparse.ArgumentParser) -> None:
    """--ttft-p50 ... --e2e-p99: latency targets in seconds, made from `TARGET_FIELDS`."""
    add_flags(parser, TARGET_FIELDS)


def targets_from_args(args) -> dict[str, float]:
    """The latency targets `target_flags` were given: {"ttft_p95_s": seconds, ...}, each checked by its field
    (`targets_from`: InvalidArgumentError naming the flag)."""
    return targets_from(vars(args))


def load_from_args(args, rate: float | None, concurrency: int | None = None) -> Load:
    """The `Load` of `load_flags` at `rate` requests/s (or `concurrency` clients)."""
    return load_from(vars(args) | {"rate": rate, "concurrency": concurrency})


def deployment_values(args) -> dict:
    """The values dict of the parsed flags (`core.planning.predict.inputs`' converters take it), the model that
    of --model or --config (`model_from_args`)."""
    return vars(args) | {"model": model_from_args(args)}


def clean_json(value):
    """`value` with every non-finite float (a percentile of no request) as None, in dicts and lists: JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def disagg_flags(parser: argparse.ArgumentParser) -> None:
    """--disagg --prefill-workers --prefill-tp --decode-workers --decode-tp --kv-link: a disaggregated
    deployment (`core.planning.predict.disagg.DisaggDeployment`) instead of --tp / --pp / --replicas."""
    add_flags(parser, DISAGG_FIELDS)


def format_flag(parser: argparse.ArgumentParser) -> None:
    """--format json | vllm-bench (`predict`, `max-rate`)."""
    parser.add_argument(
        "--format",
        choices=OUTPUT_FORMATS,
        default="json",
        help="json: every figure as one JSON object; vllm-bench: the steady state as `vllm bench serve` prints "
        "its result (the same labels, ms), to set beside the run that checks it (default: %(default)s)",
    )


def predict_parser() -> argparse.ArgumentParser:
    """The flags of `python -m core.planning predict`: a deployment, a load, --disagg, --rate | --concurrency."""
    parser = LineErrorParser(prog="python -m core.planning predict", description=COMMANDS["predict"])
    deployment_flags(parser)
    load_flags(parser)
    disagg_flags(parser)
    add_exclusive_flags(parser, RATE_FIELDS)
    add_flags(parser, (BENCHMARK_FIELD,))
    format_flag(parser)
    parser.add_argument(
        "--against",
        metavar="RESULT_JSON",
        help="a `vllm bench serve --save-result` file of this load: each predicted figure beside the run's, with "
        'its error (JSON: "against"; vllm-bench: a table)',
    )
    return parser


def _refuse_combinations(args: argparse.Namespace) -> None:
    """The flags `predict` cannot take together, refused before the simulation (InvalidArgumentError)."""
    if args.disagg:
        for given, flag in (
            (args.benchmark_requests is not None, BENCHMARK_FIELD.flag),
            (args.against, "--against"),
        ):
            if given:
                raise InvalidArgumentError(f"{flag} is for an aggregated deployment, not --disagg")
        if args.format == "vllm-bench":
            raise InvalidArgumentError("--format vllm-bench is for an aggregated deployment, not --disagg")
    if args.format == "vllm-bench" and args.benchmark_requests is not None:
        raise InvalidArgumentError(
            f"--format vllm-bench prints the steady state; {BENCHMARK_FIELD.flag}'s means are in the JSON"
        )


def predict_main(argv: Sequence[str]) -> int:
    args = predict_parser().parse_args(argv)
    try:
        load = load_from_args(args, args.rate, args.concurrency)
        _refuse_combinations(args)
        if args.benchmark_requests is not None:  # refused before the simulation, not after it
            check_benchmark_requests(load, args.benchmark_requests)
        run = None
        if args.against:  # read and matched to the load before the simulation, not after it
            run = read_bench_result(args.against)
            check_same_load(run, load, f"--against {args.against}")
        if args.disagg:
            result = predict_disagg(disagg_from(deployment_values(args)), load).to_dict()
        else:
            prediction = predict(deployment_from(deployment_values(args)), load)
            result = prediction.to_dict()
            if args.benchmark_requests is not None:
                result["benchmark"] = benchmark_means(prediction, args.benchmark_requests)
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.format == "json" and run is None:
        print(json.dumps(clean_json(result), indent=2))
        return 0
    values = bench_values(result, load)  # aggregated only: the two flags that lead here refuse --disagg
    rows = against_result(values, run) if run is not None else None
    if args.format == "json":
        result["against"] = {"result": str(args.against), "figures": rows}
        print(json.dumps(clean_json(result), indent=2))
    elif rows is not None:
        print(against_table(rows))
        print(prediction_footer(result, prediction.deployment.model_spec))
    else:
        print(bench_report(values, defined_metrics(result), title=PREDICTED_TITLE))
        print(prediction_footer(result, prediction.deployment.model_spec))
    return 0


def max_rate_parser() -> argparse.ArgumentParser:
    """The flags of `python -m core.planning max-rate`: a deployment, a load's shape, the latency targets."""
    parser = LineErrorParser(prog="python -m core.planning max-rate", description=COMMANDS["max-rate"])
    deployment_flags(parser)
    load_flags(parser)
    target_flags(parser)
    format_flag(parser)
    return parser


def max_rate_main(argv: Sequence[str]) -> int:
    args = max_rate_parser().parse_args(argv)
    try:
        targets = targets_from_args(args)
        deployment = deployment_from(deployment_values(args))
        load = load_from_args(args, 1.0)
        found = max_rate(deployment, load, targets)
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    body = found.to_dict(deployment, load, targets)
    if args.format == "json":
        print(json.dumps(clean_json(body), indent=2))
        return 0
    if found.at is None:
        print(f"no rate tried holds the targets: the lowest misses {found.binding}")
        return 0
    print(bench_report(bench_values(body, load), defined_metrics(body), title=PREDICTED_TITLE))
    print(prediction_footer(body, deployment.model_spec))
    shown = round_down(found.max_req_per_s, COMMAND_DIGITS)  # as the bench command in the JSON runs it
    print(f"highest rate within the targets: {shown:g} req/s; the next rate misses {found.binding}")
    return 0
