"""`python -m core.planning slo`: the cheapest deployment that meets a latency SLO, as JSON.

    python -m core.planning slo --model llama-3.1-8b | --config config.json [--num-params N] --rate 12 --prompt-len 2000 --output-len 300 \\
        --ttft-p95 1 --tpot-p95 0.05 [--ttft-p99 ... --itl-p99 ... --e2e-p90 ...] [--engine vllm|trtllm] \\
        [--gpus h100-80gb h200-141gb l40s] [--max-gpus 8] [--length-spread S] [--seed K] [--disagg] \
        [--routing POLICY | --routing-candidates P1,P2,...] [--data-parallel-size D [D ...]] [--enable-expert-parallel]

Prints one JSON object (`SloPlan.to_dict`): `configs`, sorted by GPU count then the cost proxy (total memory
bandwidth), each with gpu, num_gpus, tp, pp, max_num_seqs, every steady-state percentile (ttft_p50_s ...
e2e_p99_s, itl_*), throughput_tokens_per_s, tokens_per_s_per_gpu, meets_slo, binding, converged (and more), mode
("agg"; with --disagg also "disagg" rows, with prefill_gpus, decode_gpus, kv_transfer_s and their layout: see
`core.planning.search.slo_disagg`); `best`, the first that meets the SLO. With `--routing POLICY` every row of several
replicas is a routed fleet with `routing` and `routing_note` (without it, as before, each replica serves 1 / N of
the load as its own Poisson stream: a fleet simulation costs the search 3-4x its time);
`--routing-candidates` ranks (deployment, routing) pairs, cheapest first, the better metric breaking ties. Exit status 0; 2 with the reason on stderr
for bad input, or when no configuration meets the SLO (then stdout still carries every configuration evaluated,
with `error` saying what cannot be met and by how much).
"""

import argparse
import json
import sys
from collections.abc import Sequence

from core.errors import LabError, SloInfeasibleError
from core.fields import field_named
from core.planning.commands.flags import add_flags, flag_kwargs
from core.planning.commands.predict_cli import (
    LineErrorParser,
    config_flags,
    load_flags,
    load_from_args,
    model_from_args,
    target_flags,
    targets_from_args,
)
from core.planning.commands.subcommands import COMMANDS
from core.planning.predict.deployment_fields import SETTING_FIELDS
from core.planning.predict.load import RATE_FIELDS
from core.planning.search.search_fields import SEARCH_FIELDS
from core.planning.search.slo import Slo, plan_slo
from core.planning.search.slo_candidates import candidates_from


def build_parser() -> argparse.ArgumentParser:
    parser = LineErrorParser(
        prog="python -m core.planning slo",
        description=COMMANDS["slo"],
    )
    config_flags(parser)  # --model PRESET | --config PATH [--num-params N]
    rate = field_named(RATE_FIELDS, "rate")
    parser.add_argument(rate.flag, **flag_kwargs(rate, required=True))
    load_flags(parser)
    target_flags(parser)
    add_flags(parser, (field_named(SETTING_FIELDS, "engine"), field_named(SETTING_FIELDS, "vllm_version")))
    # --gpus --max-gpus --kv-dtypes --weight-dtypes --tp --pp --max-num-seqs --data-parallel-size --max-meeting
    # --routing-candidates --max-num-batched-tokens --enable-expert-parallel --disagg --routing: the search space's
    # fields
    add_flags(parser, SEARCH_FIELDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m core.planning slo`. Exit status 0, or 2 (reason on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        slo = Slo.of(targets_from_args(args))
        workload = load_from_args(args, args.rate)  # with its shared prefixes and turns (an SloWorkload)
        # the search space's flags, checked by their fields (--disagg with --max-gpus 1 refused there too)
        candidates = candidates_from(vars(args), engine=args.engine, vllm_version=args.vllm_version)
        plan = plan_slo(model_from_args(args), workload, slo, candidates)
    except SloInfeasibleError as error:
        print(f"error: {error}", file=sys.stderr)
        body = error.plan.to_dict() if error.plan is not None else {"configs": []}
        body["error"] = {
            "message": str(error),
            "metric": error.metric,
            "target": error.target,
            "best": error.best,
            "shortfall": error.shortfall,
        }
        print(json.dumps(body, indent=2))
        return 2
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2))
    return 0
