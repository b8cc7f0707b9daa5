"""A ratchet on wide signatures: functions taking more than six parameters (positional and keyword-only, `self` /
`cls` left out, `*args` / `**kwargs` not counted) in core/ (core/page_models/ included) and in ui/.

Where a group of arguments travels together (a workload's shape, a step's measures, a model's config), a
parameter object says so once instead of every caller spelling it out (issue 31). The counts below are what
is left: kernel entry points that mirror vLLM's `paged_attention`, public keyword APIs such as `plan(...)` and the
workload generators, and a few more. A new wide function fails this test; lower the bound when one is narrowed.
"""

import ast
from pathlib import Path

from tests.conftest import ROOT

MAX_PARAMETERS = 6
# The most functions over MAX_PARAMETERS each tree may hold (core: 43 before the parameter objects of issue 31's
# leftovers, 36 after; ui: 5).
BOUNDS = {"core": 36, "ui": 5}


def wide_functions(path: Path, root: Path = ROOT) -> list[str]:
    """'path:line name (count)' (path relative to `root`) for every function of the file taking more than
    MAX_PARAMETERS parameters."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        if names and names[0] in ("self", "cls"):
            names = names[1:]
        if len(names) > MAX_PARAMETERS:
            found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} ({len(names)})")
    return found


def test_no_more_wide_signatures_than_the_bound():
    over = {}
    for tree, bound in BOUNDS.items():
        wide = [entry for path in sorted((ROOT / tree).rglob("*.py")) for entry in wide_functions(path)]
        if len(wide) > bound:
            over[tree] = f"{len(wide)} > {bound}:\n  " + "\n  ".join(wide)
    assert not over, (
        "functions with more than six parameters (group the ones that travel together in a parameter object):\n"
        + "\n".join(f"{tree}: {text}" for tree, text in over.items())
    )


def test_the_count_sees_a_wide_signature(tmp_path):
    """Not vacuous: seven parameters count, `self` does not, `*args` / `**kwargs` do not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def wide(a, b, c, d, e, f, *, g): pass\n"
        "class K:\n    def narrow(self, a, b, c, d, e, f): pass\n"
        "def spread(a, b, c, d, e, f, *args, **kwargs): pass\n"
        "async def awide(a, b, c, d, e, f, g=1): pass\n"
    )
    found = wide_functions(sample, tmp_path)
    assert [entry.split()[1] for entry in found] == ["wide", "awide"]
    assert found[0] == "sample.py:1 wide (7)"
