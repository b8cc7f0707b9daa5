"""Where the lab finds vLLM's CPU build (`core.serve.vllm_env`): a venv made from today's requirements-vllm.txt, or
a typed refusal that says the command that makes it."""

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
