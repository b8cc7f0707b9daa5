"""The subcommands of `python -m core.planning` besides the capacity plan, and what each answers: their parsers'
descriptions, and the list the capacity command's --help ends with (`core.planning.commands.dispatch` runs them)."""

COMMANDS = {
    "predict": "One deployment's steady state.",
    "max-rate": "The highest rate within targets.",
    "slo": "The cheapest GPU deployment that serves a workload within latency targets (steady state).",
    "ramp": "A staged ramp replayed as inference-perf runs it (a transient run, not a steady state).",
}


def commands_epilog() -> str:
    """The other commands, one line each, for the capacity command's --help."""
    width = max(map(len, COMMANDS))
    lines = [f"  python -m core.planning {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "other commands (each with its own --help):\n" + "\n".join(lines)
