"""The command lines as a user meets them: every parser names its command as typed, `python -m pkg.module`
(argparse's default is the file's name, so `python -m hosting --help` printed "usage: __main__.py"), the planning
CLI's --help lists its other commands, and each of its flags says what it is and its default."""

import ast

import pytest

from core.planning.commands.capacity import build_parser as capacity_parser
from core.planning.commands.dispatch import main as planning_main
from core.planning.commands.predict_cli import max_rate_parser, predict_parser
from core.planning.commands.ramp_cli import ramp_parser
from core.planning.commands.slo_cli import build_parser as slo_parser
from tests.conftest import ROOT

PARSERS = ("ArgumentParser", "LineErrorParser")


def test_every_parser_names_the_command_that_runs_it():
    unnamed = []
    for folder in ("core", "bench", "hosting", "tests/load"):  # what a user (or the load test) runs
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                called = getattr(node, "func", None)
                name = getattr(called, "attr", None) or getattr(called, "id", None)
                if isinstance(node, ast.Call) and name in PARSERS:
                    prog = next((k.value for k in node.keywords if k.arg == "prog"), None)
                    if not (isinstance(prog, ast.Constant) and str(prog.value).startswith("python -m ")):
                        unnamed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert unnamed == []


def test_the_capacity_commands_help_lists_every_other_command(capsys):
    """`python -m core.planning --help` is the capacity plan's; it names the other commands the dispatcher runs,
    each of which answers its own --help (a user otherwise finds `predict` or `slo` only in the docs)."""
    with pytest.raises(SystemExit):
        planning_main(["--help"])
    listed = capsys.readouterr().out.split("other commands (each with its own --help):\n")[1].splitlines()
    names = [line.split()[3] for line in listed]
    assert names == ["predict", "max-rate", "slo", "ramp"]
    for name in names:
        with pytest.raises(SystemExit) as done:
            planning_main([name, "--help"])
        assert done.value.code == 0 and f"usage: python -m core.planning {name} " in capsys.readouterr().out


PLANNING_PARSERS = {
    "capacity": capacity_parser,
    "predict": predict_parser,
    "max-rate": max_rate_parser,
    "ramp": ramp_parser,
    "slo": slo_parser,
}


def _typed(value) -> str:
    """A default as a user types it on the command line."""
    if isinstance(value, list):
        return " ".join(_typed(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.parametrize("command", PLANNING_PARSERS)
def test_every_planning_flag_says_what_it_is_and_its_default(command):
    """`python -m core.planning [predict|max-rate|ramp|slo] --help`: every flag has a help line; a required one ends
    "(required)", one with a value by default names that value as typed ("(default: l40s h100-80gb h200-141gb)",
    "(default: 0.9)"), read from the parser's own default (what a run without the flag gets), so a changed default
    changes the line. Before, 12 of predict's flags (--prompt-len, --replicas, --max-num-seqs, --kv-dtype, ...) had
    no help at all and none said its default."""
    parser = PLANNING_PARSERS[command]()
    unexplained, unsaid = [], []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag, text = action.option_strings[0], (action.help or "") % vars(action)
        if len(text) < 10:
            unexplained.append(flag)
        elif action.required:
            unsaid += [] if text.endswith("(required)") else [flag]
        elif action.default not in (None, True, False):
            unsaid += [] if f"(default: {_typed(action.default)})" in text else [flag]
    assert (unexplained, unsaid) == ([], [])


@pytest.mark.parametrize("command", ["predict", "max-rate"])
def test_a_capacity_flag_given_to_predict_says_what_it_takes_instead(command, capsys):
    """`--num-gpus 4`, right for the capacity plan, is no flag of predict / max-rate: one line, exit 2, naming how
    these count GPUs instead (argparse alone said only "unrecognized arguments")."""
    args = [
        command,
        *["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--prompt-len", "10", "--output-len", "10"],
    ]
    with pytest.raises(SystemExit) as done:
        planning_main([*args, *(["--rate", "1"] if command == "predict" else []), "--num-gpus", "4"])
    [line] = capsys.readouterr().err.splitlines()
    assert done.value.code == 2
    assert line == (
        "error: unrecognized arguments: --num-gpus 4 (predict and max-rate count GPUs as tp x pp x "
        "--data-parallel-size x --replicas)"
    )
