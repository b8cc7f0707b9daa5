"""The layers of core, read from the source (every import statement, at module level or inside a function).

From the bottom up:
- top-level modules (`core/errors.py`, `common.py`, `device.py`, `limits.py`, `uploads.py`): no subpackage;
- `core.kv`: the one home of KV memory; no other subpackage;
- the domain packages (every subpackage but `page_models` and `jobs`: paging, kernels, serving, planning,
  engine, ...): never `core.page_models`; `core.serving` never imports `core.planning` (the one allowed
  direction between the two is planning -> serving: planning drives the simulator with its step-time model);
- `core.jobs`: the worker pool, result cache and worker loop; it runs the functions it is given, so it imports
  no domain package and not `core.page_models`;
- `core.page_models`: what a page computes, over any of the above;
- above core, never imported by it: `ui`, `app_pages`, `app`, `streamlit`, `bench`, `hosting`, `tests`;
- `tests` is imported by nothing that ships or measures (`bench`, `ui`, `app_pages`, `app.py`, `hosting`).
The whole map (which package may import which) is core/__init__.py's, checked by `tests/test_core_map.py`.
"""

import ast
from pathlib import Path

from tests.conftest import ROOT

CORE = ROOT / "core"
PAGE_MODELS = "page_models"
JOBS = "jobs"
SUBPACKAGES = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())
DOMAIN = [name for name in SUBPACKAGES if name not in (PAGE_MODELS, JOBS)]
ABOVE_CORE = {"ui", "app_pages", "app", "streamlit", "bench", "hosting", "tests"}


def module_name(path: Path) -> str:
    """`core/kv/block_pool.py` -> "core.kv.block_pool"; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, name: str, is_package: bool) -> set[str]:
    """Every absolute module name `source` (the module `name`) imports, relative imports resolved.

    `from a.b import c` yields both "a.b" and "a.b.c" (c may be a submodule); `import a.b` yields "a.b".
    """
    package = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def layer(module: str) -> str:
    """ "core.kv.specs" -> "kv", "core.errors" -> "errors", "core" -> "core", "streamlit.x" -> "streamlit"."""
    parts = module.split(".")
    if parts[0] != "core":
        return parts[0]
    return parts[1] if len(parts) > 1 else "core"


def core_imports() -> dict[str, tuple[str, set[str]]]:
    """module name -> (its layer inside core, the layers it imports, "core" itself left out)."""
    table = {}
    for path in sorted(CORE.rglob("*.py")):
        name = module_name(path)
        imported = imported_modules(path.read_text(), name, path.name == "__init__.py")
        table[name] = (layer(name), {layer(m) for m in imported} - {"core"})
    return table


IMPORTS = core_imports()


def violations(importer_layers: set[str], forbidden: set[str]) -> list[str]:
    return sorted(
        f"{name} imports {sorted(layers & forbidden)}"
        for name, (own, layers) in IMPORTS.items()
        if own in importer_layers and layers & forbidden
    )


def test_the_reader_sees_imports_it_should():
    """The checks below can fail: the reader resolves relative imports and finds imports inside functions."""
    source = "from . import sibling\nfrom ..paging import x\ndef f():\n    import streamlit as st\n"
    found = imported_modules(source, "core.kv.block_pool", is_package=False)
    assert found >= {"core.kv", "core.kv.sibling", "core.paging", "core.paging.x", "streamlit"}
    assert imported_modules("from . import a", "core.kv", is_package=True) == {"core.kv", "core.kv.a"}
    _, page_layers = IMPORTS["core.page_models.simulator"]
    assert {"planning", "serving", "kv"} <= page_layers
    assert {"kv", "paging", "kernels", "serving", "planning", "engine"} <= set(DOMAIN)


def test_core_imports_nothing_above_it():
    assert violations({own for own, _ in IMPORTS.values()}, ABOVE_CORE) == []


def test_nothing_outside_tests_imports_tests():
    """bench, the app and hosting stand on core alone: what a bench measures is what ships, not a test helper."""
    paths = [
        ROOT / "app.py",
        *(p for d in ("bench", "ui", "app_pages", "hosting") for p in (ROOT / d).rglob("*.py")),
    ]
    assert len(paths) > 20 and ROOT / "bench" / "serve.py" in paths
    found = sorted(
        f"{path.relative_to(ROOT)} imports {m}"
        for path in paths
        for m in imported_modules(path.read_text(), module_name(path), path.name == "__init__.py")
        if m.split(".")[0] == "tests"
    )
    assert found == []


def test_top_level_modules_import_no_subpackage():
    top_level = {own for own, _ in IMPORTS.values()} - set(SUBPACKAGES) - {"core"}
    assert top_level >= {"errors", "common", "device", "limits"}
    assert violations(top_level, set(SUBPACKAGES)) == []


def test_kv_imports_no_other_subpackage():
    assert violations({"kv"}, set(SUBPACKAGES) - {"kv"}) == []


def test_no_domain_package_imports_page_models():
    assert violations(set(DOMAIN), {PAGE_MODELS}) == []


def test_serving_does_not_import_planning():
    """One direction only: planning may drive the simulator (with its step-time model), serving never reads
    planning's presets (a step's cost is injected)."""
    assert violations({"serving"}, {"planning"}) == []


# core.planning by the question each part answers, from the bottom up: what is given, what fits, what a step costs
# (and, one folder below, its fits), what a deployment does at a load, which deployment to buy, the command line,
# and planning against a running server. A part imports only parts before it.
PLANNING_ORDER = ("catalog", "memory", "cost", "cost.fits", "predict", "search", "commands", "observed")
MAX_FLAT_PLANNING_MODULES = 3


def planning_part(module: str) -> str | None:
    """ "core.planning.cost.fits.step_fit" -> "cost.fits", "core.planning.memory.plan.plan" -> "memory";
    None for a module outside core.planning, the package itself or a module left flat in it."""
    parts = module.split(".")
    if parts[:2] != ["core", "planning"] or len(parts) < 4:
        return None
    if parts[2:4] == ["cost", "fits"] and len(parts) > 4:
        return "cost.fits"
    return parts[2] if parts[2] in PLANNING_ORDER else None


def planning_order_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of `graph` (module -> modules it imports) from one part of core.planning into a part after it
    in PLANNING_ORDER (an arrow back up the chain), as "core.planning.memory.x imports core.planning.predict.y"."""
    out = []
    for name, imported in sorted(graph.items()):
        own = planning_part(name)
        if own is None:
            continue
        rank = PLANNING_ORDER.index(own)
        out += [
            f"{name} imports {m}"
            for m in sorted(imported)
            if planning_part(m) is not None and PLANNING_ORDER.index(planning_part(m)) > rank
        ]
    return out


def test_planning_is_laid_out_by_question():
    """Every module of core.planning sits in one of the parts (at most MAX_FLAT_PLANNING_MODULES left flat: the
    package and its `__main__`), and every part exists."""
    planning = CORE / "planning"
    flat = sorted(p.name for p in planning.glob("*.py"))
    assert len(flat) <= MAX_FLAT_PLANNING_MODULES, flat
    homeless = sorted(
        name
        for name in (module_name(p) for p in planning.rglob("*.py"))
        if name.count(".") >= 3 and planning_part(name + ".x") is None
    )
    assert homeless == []
    assert all((planning / part.replace(".", "/") / "__init__.py").is_file() for part in PLANNING_ORDER)


def test_planning_has_no_arrow_back_up():
    """No part of core.planning imports a part after it (module level or inside a function): catalog ->
    memory -> cost -> cost.fits -> predict -> search -> commands -> observed."""
    graph = module_graph()
    assert "core.planning.memory.plan" in graph["core.planning.predict.replica_sim"]  # the reader sees arrows
    assert planning_order_violations(graph) == []


def test_the_planning_order_check_fails_on_an_arrow_back_up():
    assert planning_order_violations({"core.planning.memory.plan": {"core.planning.predict.load.Load"}}) == [
        "core.planning.memory.plan imports core.planning.predict.load.Load"
    ]
    assert planning_order_violations({"core.planning.cost.step_time": {"core.planning.cost.fits.step_fit"}})
    assert planning_order_violations({"core.planning.predict.x": {"core.planning.cost.fits.published"}}) == []
    assert planning_part("core.planning.__main__") is None and planning_part("core.planning.cost") is None


def test_jobs_knows_tasks_only_as_the_functions_it_is_given():
    assert violations({JOBS}, set(DOMAIN) | {PAGE_MODELS}) == []


def module_graph() -> dict[str, set[str]]:
    """core module -> the core modules it imports (module level or inside functions), itself excluded."""
    paths = {module_name(path): path for path in CORE.rglob("*.py")}
    return {
        name: {m for m in imported_modules(path.read_text(), name, path.name == "__init__.py") if m in paths}
        - {name}
        for name, path in paths.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of `graph` as one cycle through its strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_circles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_core():
    """No module of core imports (directly or through others) a module that imports it back."""
    graph = module_graph()
    assert "core.serving.simulator" in graph and "core.serving.sim_result" in graph["core.serving.simulator"]
    assert import_cycles(graph) == []
