"""The command lines as a user meets them: every parser names its command as typed, `python -m pkg.module`
(argparse's default is the file's name, so `python -m hosting --help` printed "usage: __main__.py"), and the planning
CLI's --help lists its other commands."""

import ast

import pytest

from core.planning.commands.dispatch import main as planning_main
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
