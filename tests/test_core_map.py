"""core/__init__.py is the map of core: it names every subpackage and top-level module."""

import pkgutil

import core


def test_core_docstring_names_every_subpackage_and_module():
    """core/__init__.py is the map of core: it names every subpackage and top-level module."""
    names = [m.name for m in pkgutil.iter_modules(core.__path__)]
    assert {"kv", "paging", "kernels", "serving", "planning", "engine", "jobs"} <= set(names)
    missing = [n for n in names if f"`core.{n}`" not in core.__doc__ and f"`{n}`" not in core.__doc__]
    assert missing == []
