"""`python -m core.planning ramp`: what one staged ramp, run as inference-perf runs it, reports on a deployment
(`core.planning.predict.ramp`), as one JSON object. A transient replay of one benchmark, not `predict`'s
steady-state estimate: its `kind` says so.

    python -m core.planning ramp --model qwen3-32b --gpu h100-80gb --tp 2 --replicas 8 --routing prefix-aware \\
        --gpu-memory-utilization 0.8783 --block-size 64 --stages 15x50,3x20,10x20,15x20 --warmup-stages 1 \\
        --prompt-len 7200 --output-len 1000 --shared-prefix-len 6000 --num-prefixes 150 --users-per-prefix 5

The deployment's flags are `predict`'s (`predict_cli.deployment_flags`: --model | --config, --gpu, --tp, --pp,
--replicas, --routing, dtypes, batch limits, engine, speculation, a host tier) with the server's --block-size and
--gpu-memory-utilization; the ramp's are `core.planning.predict.ramp.RAMP_FIELDS`. Exit status 0; 2 with one
plain line on stderr naming the bad flag.
"""

import argparse
import json
import sys
from collections.abc import Sequence

from core.errors import LabError
from core.planning.commands.flags import add_flags
from core.planning.commands.predict_cli import (
    LineErrorParser,
    clean_json,
    deployment_flags,
    deployment_values,
)
from core.planning.commands.subcommands import COMMANDS
from core.planning.predict.ramp import (
    RAMP_DEPLOYMENT_FIELDS,
    RAMP_FIELDS,
    ramp_deployment_from,
    ramp_from,
    replay_ramp,
)


def ramp_parser() -> argparse.ArgumentParser:
    """The flags of `python -m core.planning ramp`: a deployment (predict's, with --block-size and
    --gpu-memory-utilization), then the ramp and its shared-prefix data."""
    parser = LineErrorParser(
        prog="python -m core.planning ramp",
        description=COMMANDS["ramp"],
    )
    deployment_flags(parser)
    add_flags(parser, RAMP_DEPLOYMENT_FIELDS + RAMP_FIELDS)
    return parser


def ramp_main(argv: Sequence[str]) -> int:
    """Entry point of `python -m core.planning ramp`. Exit status 0, or 2 (one line on stderr)."""
    args = ramp_parser().parse_args(argv)
    try:
        ramp = ramp_from(vars(args))
        body = replay_ramp(ramp_deployment_from(deployment_values(args)), ramp)
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(clean_json(body), indent=2))
    return 0
