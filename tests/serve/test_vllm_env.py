"""Where the lab finds vLLM's CPU build (`core.serve.vllm_env`): a venv made from today's requirements-vllm.txt, or
a typed refusal that says the command that makes it."""

import hashlib
import os
import subprocess
import sys

import pytest

from core.errors import VLLMUnavailableError
from core.serve import vllm_env


def _fake_venv(path, stamp: str):
    (path / "bin").mkdir(parents=True)
    for name in ("python", "vllm"):
        (path / "bin" / name).write_text("")
    (path / vllm_env.STAMP).write_text(stamp)
    return path


def test_a_missing_venv_is_refused_with_the_install_command(tmp_path):
    with pytest.raises(VLLMUnavailableError, match=r"python -m core.serve.vllm_env install"):
        vllm_env.find_vllm(tmp_path / "nowhere")


def test_a_venv_from_other_requirements_is_refused(tmp_path):
    with pytest.raises(VLLMUnavailableError, match=r"today.s requirements-vllm\.txt"):
        vllm_env.find_vllm(_fake_venv(tmp_path / "old", "0" * 64))


def test_a_venv_stamped_with_todays_requirements_is_found(tmp_path, monkeypatch):
    venv = _fake_venv(tmp_path / "venv", vllm_env._requirements_digest())
    monkeypatch.setenv(vllm_env.VENV_VARIABLE, str(venv))
    found = vllm_env.find_vllm()
    assert (found.venv, found.command, found.version) == (venv, venv / "bin" / "vllm", "0.32.0")


def test_the_alias_distribution_names_vllm_with_the_cpu_version(tmp_path):
    """vLLM's CLI asks importlib.metadata for "vllm"; the alias answers with the version vLLM derives itself."""
    import importlib.metadata

    vllm_env._alias_distribution(tmp_path, "0.32.0")
    (dist,) = importlib.metadata.distributions(path=[str(tmp_path)])
    assert (dist.metadata["Name"], dist.version) == ("vllm", "0.32.0+cpu")


@pytest.mark.parametrize("with_sitecustomize", [True, False])
def test_the_venvs_sitecustomize_keeps_bytecode_under_dontwritebytecode(tmp_path, with_sitecustomize):
    """The venv is installed without compiling (`--no-compile`); its sitecustomize keeps each module's bytecode at
    its first import even under PYTHONDONTWRITEBYTECODE and -B, which alone keep none (the control case)."""
    if with_sitecustomize:
        (tmp_path / "sitecustomize.py").write_text(vllm_env.SITECUSTOMIZE)
    (tmp_path / "first_import.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-B", "-c", "import first_import; print(first_import.VALUE)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "1"
    kept = list((tmp_path / "__pycache__").glob("first_import.*.pyc"))
    assert len(kept) == (1 if with_sitecustomize else 0)


def test_a_venv_made_by_the_earlier_recipe_is_refused(tmp_path):
    """A venv stamped by the earlier install (today's requirements, pip compiling every module, no sitecustomize)
    is not found, so `install` makes it again."""
    earlier = hashlib.sha256(vllm_env.REQUIREMENTS.read_bytes()).hexdigest()
    with pytest.raises(VLLMUnavailableError, match=r"python -m core.serve.vllm_env install"):
        vllm_env.find_vllm(_fake_venv(tmp_path / "earlier", earlier))
