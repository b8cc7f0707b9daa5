"""Every command-line parser names its command as a user types it: `python -m pkg.module` (argparse's default is
the file's name, so `python -m hosting --help` printed "usage: __main__.py")."""

import ast

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
