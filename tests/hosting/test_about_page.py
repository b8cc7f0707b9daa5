"""The About page under AppTest: versions, device and every operator limit with its variable."""

import tomllib

import streamlit as st
import torch

from core.limits import SPECS
from tests.conftest import ROOT, open_app
from tests.hosting.test_model_root import serve_models_from


def test_about_shows_versions_and_every_limit():
    at = open_app("app_pages/about.py")
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert metrics["PagedAttention Lab"] == version
    assert metrics["torch"] == torch.__version__ and metrics["Streamlit"] == st.__version__
    assert metrics["Torch device"].startswith(("cpu", "cuda"))
    table = at.dataframe[0].value
    assert list(table["variable"]) == [spec.variable for spec in SPECS.values()]
    assert "4,294,967,296 bytes" in table["value"].iloc[0]
    assert _value(table, "PAGED_LAB_MODEL_ROOT") == "not set: any local directory"
    assert "worker processes alive" in " ".join(c.value for c in at.caption)


def _value(table, variable: str) -> str:
    return table.loc[table["variable"] == variable, "value"].item()


def test_about_shows_the_model_root_the_operator_set(monkeypatch, request, tmp_path):
    serve_models_from(monkeypatch, request, tmp_path)
    at = open_app("app_pages/about.py")
    assert not at.exception and not at.error
    assert _value(at.dataframe[0].value, "PAGED_LAB_MODEL_ROOT") == str(tmp_path)
