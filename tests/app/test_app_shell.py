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
