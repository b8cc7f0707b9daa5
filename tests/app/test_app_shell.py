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
