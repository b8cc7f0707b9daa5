"""PAGED_LAB_MODEL_ROOT: with it set, the Engine's model directory must resolve (after `..` and symlinks) inside
the root, checked in the worker job before any file is opened; unset, any directory loads as before. The Docker
image sets it."""

import os
import re
import time

import pytest

from core.engine import Engine, SamplingParams
from core.errors import LimitConfigError, LimitExceededError
from core.jobs import JobPool
from core.limits import Limits
from core.page_models import engines
from core.page_models.tasks import generate_outputs
from tests.conftest import ROOT
from tests.engine.hf_models import llama_config, save_model

PROMPTS = "1 17 42 7\n5 9 200 31 8"
PROMPT_IDS = [[1, 17, 42, 7], [5, 9, 200, 31, 8]]
PARAMS = SamplingParams(max_tokens=6, temperature=0.0)


def make_model_root(base):
    """base/root/tiny: a saved random Llama (vocab 512, so the Engine page's default prompts fit);
    base/root/alias -> tiny and base/root/escape -> base/elsewhere (a second saved model, outside the root);
    base/root/notes: a directory without config.json; base/root2: a sibling whose name starts like the root's.
    Returns (root, elsewhere)."""
    from transformers import LlamaForCausalLM

    root, elsewhere = base / "root", base / "elsewhere"
    save_model(LlamaForCausalLM, llama_config(vocab_size=512), root / "tiny")
    save_model(LlamaForCausalLM, llama_config(vocab_size=512), elsewhere, seed=1)
    (root / "alias").symlink_to(root / "tiny", target_is_directory=True)
    (root / "escape").symlink_to(elsewhere, target_is_directory=True)
    (root / "notes").mkdir()
    (base / "root2").mkdir()
    return root, elsewhere


def serve_models_from(monkeypatch, request, root) -> None:
    """Set PAGED_LAB_MODEL_ROOT for this test, in the environment and in the app's cached `app_limits()`."""
    from ui.jobs import app_limits

    monkeypatch.setenv("PAGED_LAB_MODEL_ROOT", str(root))
    app_limits.clear()
    request.addfinalizer(app_limits.clear)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_model_root(tmp_path_factory.mktemp("models"))


def _outside_paths(root, elsewhere):
    return [
        str(root / ".." / "elsewhere"),  # `..` out of the root
        "../elsewhere",  # relative: taken under the root, then `..`
        "tiny/../../elsewhere",
        str(elsewhere),  # an absolute path outside
        str(root / "escape"),  # a symlink inside the root pointing outside
        "escape",
        str(root.parent / "root2"),  # shares the root's name as a prefix, but is not inside it
        "/etc",
        "/nonexistent/anything",
    ]


def test_inside_the_root_resolves_and_outside_is_refused_naming_the_variable(models):
    root, elsewhere = models
    limits = Limits(model_root=str(root))
    real_tiny = os.path.realpath(root / "tiny")
    assert limits.check_model_directory("tiny") == real_tiny
    assert limits.check_model_directory(f" {root / 'tiny'} ") == real_tiny
    assert limits.check_model_directory(str(root / "notes" / ".." / "tiny")) == real_tiny
    assert limits.check_model_directory("alias") == real_tiny  # a symlink that stays inside is fine
    assert limits.check_model_directory("") == os.path.realpath(root)  # the root itself
    for path in _outside_paths(root, elsewhere):
        with pytest.raises(LimitExceededError, match="PAGED_LAB_MODEL_ROOT") as caught:
            limits.check_model_directory(path)
        assert caught.value.variable == "PAGED_LAB_MODEL_ROOT"
        assert str(root) in str(caught.value) and "inside it" in str(caught.value)
    # the message is the same whether the outside path exists or not (no probing the server's files)
    messages = []
    for path in ("/etc", "/no-such-dir-here"):
        with pytest.raises(LimitExceededError) as caught:
            limits.check_model_directory(path)
        messages.append(str(caught.value).replace(repr(path), "PATH"))
    assert messages[0] == messages[1]
    with pytest.raises(LimitExceededError):
        limits.check_model_directory("tiny\0")


def test_unset_allows_any_directory():
    assert Limits().check_model_directory(" /etc ") == "/etc"
    assert Limits.from_mapping({"PAGED_LAB_MODEL_ROOT": "  "}).model_root == ""


def test_model_directories_lists_the_loadable_ones_directly_under_the_root(models, tmp_path):
    root, _ = models
    assert Limits(model_root=str(root)).model_directories() == ["alias", "tiny"]  # not escape, notes
    assert Limits().model_directories() == []
    assert Limits(model_root=str(tmp_path / "missing")).model_directories() == []


def test_a_root_that_is_not_a_directory_is_a_config_error(tmp_path):
    limits = Limits(model_root=str(tmp_path / "missing"))
    with pytest.raises(LimitConfigError, match=r"PAGED_LAB_MODEL_ROOT.*not a directory") as caught:
        limits.check_model_directory("tiny")
    assert caught.value.variable == "PAGED_LAB_MODEL_ROOT"


def test_the_root_is_read_round_tripped_and_hashed(models):
    root, _ = models
    limits = Limits.from_mapping({"PAGED_LAB_MODEL_ROOT": f" {root} "})
    assert limits.model_root == str(root)
    assert Limits.from_mapping(limits.as_environ()) == limits  # a worker reads back exactly this root
    assert hash(limits) == hash(Limits(model_root=str(root))) and limits != Limits()
    assert {r["variable"]: r["value"] for r in limits.rows()}["PAGED_LAB_MODEL_ROOT"] == str(root)
    with pytest.raises(LimitConfigError, match="absolute directory path"):
        Limits.from_mapping({"PAGED_LAB_MODEL_ROOT": "models"})
    with pytest.raises(LimitConfigError, match="PAGED_LAB_MODEL_ROOT"):
        Limits(model_root=5)


def _completions(outputs):
    return [[c.token_ids for c in o.outputs] for o in outputs]


def test_the_job_loads_inside_the_root(models, monkeypatch):
    root, _ = models
    monkeypatch.setenv("PAGED_LAB_MODEL_ROOT", str(root))
    generation = generate_outputs("directory", "tiny", 32, 16, False, PROMPTS, PARAMS)
    reference = Engine.from_pretrained(root / "tiny", num_blocks=32, block_size=16).generate(
        PROMPT_IDS, PARAMS
    )
    assert _completions(generation.outputs) == _completions(reference)
    assert [len(c[0]) for c in _completions(generation.outputs)] == [6, 6]


def test_the_job_refuses_outside_the_root_before_opening_anything(models, monkeypatch):
    root, elsewhere = models

    class Untouchable:
        @staticmethod
        def from_directory(*args, **kwargs):
            raise AssertionError("a file was opened before the model root was checked")

        from_pretrained = from_config = from_dict = from_directory

    monkeypatch.setattr(engines, "ModelConfig", Untouchable)
    monkeypatch.setattr(engines, "Engine", Untouchable)
    monkeypatch.setattr(engines, "gguf_config", Untouchable.from_directory)
    monkeypatch.setenv("PAGED_LAB_MODEL_ROOT", str(root))
    gguf_files = [str(elsewhere / "model.gguf"), "../elsewhere/model.gguf", "escape/model.gguf"]
    for path in _outside_paths(root, elsewhere) + gguf_files:  # a .gguf file is checked like a directory
        with pytest.raises(LimitExceededError, match="PAGED_LAB_MODEL_ROOT"):
            generate_outputs("directory", path, 32, 16, False, PROMPTS, PARAMS)


def test_the_job_with_no_root_loads_any_directory(models, monkeypatch):
    _, elsewhere = models
    monkeypatch.delenv("PAGED_LAB_MODEL_ROOT", raising=False)
    generation = generate_outputs("directory", str(elsewhere), 32, 16, False, PROMPTS, PARAMS)
    reference = Engine.from_pretrained(elsewhere, num_blocks=32, block_size=16).generate(PROMPT_IDS, PARAMS)
    assert _completions(generation.outputs) == _completions(reference)


def test_a_worker_gets_the_root_and_its_refusal_arrives_intact(models):
    root, _ = models
    pool = JobPool.from_limits(Limits(workers=1, model_root=str(root)))
    try:
        pool.submit("s", generate_outputs, "directory", "../elsewhere", 32, 16, False, PROMPTS, PARAMS)
        deadline = time.monotonic() + 120
        while not (status := pool.poll("s")).finished and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status.state == "failed"
        assert (
            isinstance(status.error, LimitExceededError) and status.error.variable == "PAGED_LAB_MODEL_ROOT"
        )
    finally:
        pool.close()


def test_the_docker_image_sets_a_model_root():
    dockerfile = (ROOT / "Dockerfile").read_text()
    env = re.search(r"^\s*PAGED_LAB_MODEL_ROOT=(\S+)", dockerfile, re.M)
    assert env and os.path.isabs(env.group(1))
    assert f"mkdir -p {env.group(1)}" in dockerfile  # exists in the image even before a volume is mounted
