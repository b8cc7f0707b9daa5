"""The app shell: navigation over app_pages/, and the shared sidebar."""

import ast

from tests.conftest import ROOT, open_app


def registered_pages() -> list[str]:
    tree = ast.parse((ROOT / "app.py").read_text())
    return [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Page"
    ]


def test_every_screen_is_registered_and_no_pages_folder_exists():
    # a folder named pages/ beside app.py makes Streamlit run deep links without app.py on a fresh server
    assert not (ROOT / "pages").exists()
    on_disk = sorted(f"app_pages/{p.name}" for p in (ROOT / "app_pages").glob("*.py"))
    assert sorted(registered_pages()) == on_disk


def test_sidebar_shows_the_torch_device_and_version():
    import torch

    at = open_app()
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "Torch device: `cpu" in captions or "Torch device: `cuda" in captions
    assert torch.__version__ in captions


def test_page_icons_are_material_icons_and_the_favicon_is_a_local_file():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tree = ast.parse((root / "app.py").read_text())
    keywords = [kw for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords]
    icons = [kw.value.value for kw in keywords if kw.arg == "icon" and isinstance(kw.value, ast.Constant)]
    pages = list((root / "app_pages").glob("*.py"))
    assert len(icons) == len(pages)  # one per page
    # emoji render as empty boxes where the server has no emoji font; Material icons ship with Streamlit
    assert all(icon.startswith(":material/") and icon.endswith(":") and icon.isascii() for icon in icons), (
        icons
    )
    # the favicon: a ":material/...:" or emoji page_icon is fetched by every browser from a public host
    [page_icon] = [kw.value for kw in keywords if kw.arg == "page_icon"]
    assert not isinstance(page_icon, ast.Constant), ast.unparse(page_icon)
    assert ast.unparse(page_icon) == "str(ICON)"
    icon = root / "ui" / "assets" / "icon.png"
    assert icon.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def magic_writes(path) -> list[str]:
    """The statements of a script that Streamlit's magic turns into `st.write` (its own transformer, `add_magic`:
    a bare expression that is not a call, e.g. `a() or b()`, is written, so a None shows on the page)."""
    from streamlit.runtime.scriptrunner.magic import MAGIC_MODULE_NAME, add_magic

    tree = add_magic(path.read_text(), str(path))
    return [
        f"{path.name}:{node.lineno}: {ast.unparse(node.args[0])}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and getattr(node.func.value, "id", "") == MAGIC_MODULE_NAME
    ]


def test_no_script_writes_a_value_by_magic():
    scripts = [ROOT / "app.py", *sorted((ROOT / "app_pages").glob("*.py"))]
    assert [w for script in scripts for w in magic_writes(script)] == []


def test_magic_writes_finds_a_bare_or(tmp_path):
    """The control: the Live page's `draw_served_plan(live) or draw_plan(live)` wrote `None` under the plan."""
    script = tmp_path / "page.py"
    script.write_text("import streamlit as st\n\ndef view():\n    st.title('x')\n    f() or g()\n")
    assert magic_writes(script) == ["page.py:5: f() or g()"]
