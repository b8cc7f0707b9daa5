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


def test_page_icons_are_material_icons_not_emoji():
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / "app.py").read_text())
    icons = [
        kw.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg in ("icon", "page_icon") and isinstance(kw.value, ast.Constant)
    ]
    assert len(icons) == 6  # page_icon and the five pages
    # emoji render as empty boxes where the server has no emoji font; Material icons ship with Streamlit
    assert all(icon.startswith(":material/") and icon.endswith(":") and icon.isascii() for icon in icons), (
        icons
    )
