"""core/__init__.py is the map of core, and the map is true: read from its docstring, checked against the
source.

The map lists each package with the packages it may import ("- `core.kv` (imports: none): ..."), from the
bottom up, then the top-level modules. Checked here: every package and top-level module of core is on the map; every
`core.` name it mentions exists; each package imports exactly what its line says (no more: a forbidden import
fails; no less: a line never claims an arrow that is not there); the list is in layer order (no upward arrow).
"""

import ast
import re

import core
from tests.conftest import ROOT
from tests.test_layers import imported_modules, module_name

CORE = ROOT / "core"
TOP = "top-level"  # the owner of `core/errors.py`, `core/common.py`, ...
PACKAGE_LINE = re.compile(r"^- `core\.([\w.]+)` \(imports: ([^)]*)\):", re.MULTILINE)


def parse_map(doc: str) -> dict[str, tuple[str, ...]]:
    """package (relative to core, "planning.observed") -> the packages it may import, in the map's order."""
    table = {}
    for package, imports in PACKAGE_LINE.findall(doc):
        names = " ".join(imports.split())
        table[package] = () if names == "none" else tuple(n.strip() for n in names.split(","))
    return table


MAP = parse_map(core.__doc__)


def owner(module: str, packages) -> str | None:
    """The map's package that holds `module` (the longest one that is a prefix), TOP for a top-level module,
    None for `core` itself and anything outside core."""
    parts = module.split(".")
    if parts[0] != "core" or len(parts) == 1:
        return None
    for end in range(len(parts), 1, -1):
        if ".".join(parts[1:end]) in packages:
            return ".".join(parts[1:end])
    return TOP


def package_imports(graph: dict[str, set[str]], packages) -> dict[str, set[str]]:
    """owner -> the other owners its modules import (TOP and core itself left out)."""
    found: dict[str, set[str]] = {}
    for name, imported in graph.items():
        own = owner(name, packages)
        targets = {owner(m, packages) for m in imported} - {None, own}
        found.setdefault(own, set()).update(targets)
    return found


def map_violations(graph: dict[str, set[str]], table: dict[str, tuple[str, ...]]) -> list[str]:
    """Each import of `graph` (core module -> modules it imports) that `table` does not allow, as
    "core.kv.x imports core.paging.y": a top-level module importing a package, a package importing one its
    line does not list (a package's own modules and the top-level modules are always allowed)."""
    out = []
    for name, imported in sorted(graph.items()):
        own = owner(name, table)
        allowed = {TOP} if own == TOP else {own, TOP, *table.get(own, ())}
        out += [f"{name} imports {m}" for m in sorted(imported) if owner(m, table) not in allowed | {None}]
    return out


def core_graph() -> dict[str, set[str]]:
    """Every module of core -> every module it imports (module level or inside a function)."""
    return {
        module_name(path): imported_modules(path.read_text(), module_name(path), path.name == "__init__.py")
        for path in sorted(CORE.rglob("*.py"))
    }


def defines(module_path, name: str) -> bool:
    """Whether a module's source defines or imports `name` at module level."""
    for node in ast.parse(module_path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name) == name for a in node.names
        ):
            return True
    return False


def exists(dotted: str) -> bool:
    """`core.a.b` is a package, a module, or a name a module defines."""
    path = ROOT.joinpath(*dotted.split("."))
    if (path / "__init__.py").is_file() or path.with_suffix(".py").is_file():
        return True
    parent = path.parent.with_suffix(".py")
    return parent.is_file() and defines(parent, path.name)


def test_the_map_is_read():
    assert MAP["kv"] == () and MAP["paging"] == ("kv",)
    assert "planning.observed" in MAP and "live" in MAP["planning.observed"]
    assert len(MAP) == core.__doc__.count("\n- `core.")  # every package line parsed


def test_every_package_and_top_level_module_is_on_the_map():
    packages = sorted(".".join(p.parent.relative_to(CORE).parts) for p in CORE.rglob("__init__.py"))
    packages.remove("")  # core itself
    assert sorted(MAP) == packages
    top_level = sorted(p.stem for p in CORE.glob("*.py") if p.name != "__init__.py")
    assert {"errors", "common", "metric_names"} <= set(top_level)
    tail = core.__doc__.split("Top-level modules")[1]
    assert [name for name in top_level if f"`core.{name}`" not in tail] == []


def test_every_core_name_on_the_map_exists():
    names = {n.rstrip(".") for n in re.findall(r"core\.[a-z_][\w.]*", core.__doc__)}
    assert "core.planning.observed.planned" in names and "core.kv.block_pool" in names
    assert sorted(n for n in names if not exists(n)) == []
    assert not exists("core.live.planned") and not exists("core.kv.no_such_thing")


def test_the_map_is_in_layer_order():
    """A package may import only packages listed before it: the map is a layering, so no circle between
    packages."""
    order = list(MAP)
    upward = [
        (p, d) for p, deps in MAP.items() for d in deps if d not in MAP or order.index(d) >= order.index(p)
    ]
    assert upward == []


def test_the_checker_fails_on_forbidden_imports():
    """Adding a forbidden import makes `map_violations` name it, for imports written as source too."""
    assert map_violations({"core.kv.x": {"core.paging.block_manager"}}, MAP) == [
        "core.kv.x imports core.paging.block_manager"
    ]
    assert map_violations(
        {"core.serving.x": {"core.planning.memory.plan"}}, MAP
    )  # serving never reads planning
    assert map_violations(
        {"core.planning.memory.plan": {"core.planning.observed.planned"}}, MAP
    )  # planning proper
    assert map_violations({"core.planning.memory.plan": {"core.live.metrics"}}, MAP)
    assert map_violations({"core.errors": {"core.kv.specs"}}, MAP)  # top-level modules import no package
    assert map_violations({"core.serve.x": {"core.page_models.tasks"}}, MAP)
    source = "def f():\n    from ..serving import simulator\n"  # relative, inside a function
    graph = {"core.live.x": imported_modules(source, "core.live.x", is_package=False)}
    assert map_violations(graph, MAP) == [
        "core.live.x imports core.serving",
        "core.live.x imports core.serving.simulator",
    ]
    allowed = {"core.planning.observed.x": {"core.live.metrics", "core.planning.memory.plan", "core.errors"}}
    assert map_violations(allowed, MAP) == []


def test_core_imports_what_the_map_allows():
    assert map_violations(core_graph(), MAP) == []


def test_the_map_claims_no_import_that_does_not_happen():
    """Each arrow on the map is an import some module makes, so the map says what the code does."""
    actual = package_imports(core_graph(), MAP)
    unused = sorted((p, d) for p, deps in MAP.items() for d in deps if d not in actual.get(p, set()))
    assert unused == []
