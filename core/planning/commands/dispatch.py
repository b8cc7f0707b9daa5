"""The dispatcher of `python -m core.planning`: `predict` and `max-rate` (`core.planning.commands.predict_cli`),
`ramp` (`core.planning.commands.ramp_cli`), `slo` (`core.planning.commands.slo_cli`), anything else the capacity
command (`core.planning.commands.capacity`). Each subcommand's module is imported only when it runs, so a command pays for its own imports alone."""

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m core.planning`: the capacity plan, or with `predict` / `max-rate` / `ramp` / `slo`
    first that command. Exit status 0, or 2 with the reason on stderr."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["predict"], ["max-rate"]):
        from core.planning.commands.predict_cli import max_rate_main, predict_main

        return (predict_main if argv[0] == "predict" else max_rate_main)(argv[1:])
    if argv[:1] == ["ramp"]:
        from core.planning.commands.ramp_cli import ramp_main

        return ramp_main(argv[1:])
    if argv[:1] == ["slo"]:
        from core.planning.commands.slo_cli import main as slo_main

        return slo_main(argv[1:])
    from core.planning.commands.capacity import capacity_main

    return capacity_main(argv)
