"""The Engine page under AppTest (its runs go through the worker pool), with SmolLM2 not fetched (an empty model
cache): the page falls back to the tiny random model, whose default run draws; a bad directory is an st.error,
beam search runs, an oversize pool or too many sequences are refused with the limit's message before anything is
built, a pool too small says which pools run the request, the Figure 15 sharing measurement draws, every input is
in the URL, and with PAGED_LAB_MODEL_ROOT set the models under it are offered and a path outside it is an
st.error. The chat on the real model: tests/app/test_engine_chat.py."""

import json

import pytest

from core.engine import Engine, SamplingParams
from tests.conftest import ROOT, open_app
from tests.hosting.test_model_root import PROMPT_IDS, PROMPTS, make_model_root, serve_models_from

PAGE = "app_pages/engine.py"
TIMEOUT = 600  # seconds per script run: a 2-core machine shared with other jobs starts torch slowly


@pytest.fixture(autouse=True)
def no_real_model(tmp_path, monkeypatch):
    """An empty model cache: the page offers the Fetch button and runs the tiny random model."""
    monkeypatch.setenv("PAGED_LAB_MODEL_CACHE", str(tmp_path / "no-models"))


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _url(at) -> dict[str, str]:
    """The page's query parameters (AppTest gives one value as a str, several as a list: the last wins)."""
    return {k: v if isinstance(v, str) else v[-1] for k, v in at.query_params.items()}


def _submit(at):
    next(b for b in at.button if b.proto.label == "Generate").click()
    at.run()
    assert not at.exception, at.exception


def test_default_run_draws_outputs_heatmap_and_step_charts():
    at = open_app(PAGE, timeout=TIMEOUT)
    assert not at.error
    assert any("not on this server yet" in i.value for i in at.info)
    assert any(b.proto.label.startswith("Fetch SmolLM2") for b in at.button)
    # 3 prompts x n = 4 samples x 32 tokens, exactly (EOS ignored on the random model)
    assert _metric(at, "Tokens generated") == "384"
    table = at.dataframe[0].value
    assert len(table) == 12 and set(table["tokens"]) == {32}
    assert len(at.get("plotly_chart")) >= 4
    # n = 2 forks each prompt: the partly filled last prompt blocks are copied on the first write
    assert int(_metric(at, "Copy-on-write copies")) >= 1
    # the recorded Figure 15 names the tiny random model only when its run measured it (bars to go with the words)
    recorded = json.loads((ROOT / "bench" / "results" / "sharing-smollm2.json").read_text())
    [caption] = [c.value for c in at.caption if c.value.startswith("SmolLM2-135M-Instruct answering")]
    assert ("tiny random model" in caption) == bool(recorded["random_model"]), caption
    slider = at.select_slider(key="step")
    slider.set_value(slider.options[-1])
    at.run()
    assert not at.exception and not at.error


def test_bad_directory_is_an_error_not_a_traceback(tmp_path):
    at = open_app(PAGE, timeout=TIMEOUT)
    at.radio(key="source").set_value("directory")
    at.text_input(key="path").set_value(str(tmp_path / "missing"))
    _submit(at)
    assert at.error and "does not exist" in at.error[0].value
    (tmp_path / "empty").mkdir()
    at.text_input(key="path").set_value(str(tmp_path / "empty"))
    _submit(at)
    assert at.error and "config.json" in at.error[0].value


def test_beam_search_returns_beams_best_first():
    at = open_app(PAGE, timeout=TIMEOUT)
    at.number_input(key="n").set_value(1)
    at.number_input(key="beam_width").set_value(3)
    at.number_input(key="max_tokens").set_value(8)
    _submit(at)
    assert not at.error
    table = at.dataframe[0].value
    assert len(table) == 9 and table["output"].tolist() == [0, 1, 2] * 3
    for _, beams in table.groupby("prompt"):
        logprobs = beams["cumulative logprob"].tolist()
        assert logprobs == sorted(logprobs, reverse=True)


def test_invalid_sampling_and_prompts_are_errors():
    at = open_app(PAGE, timeout=TIMEOUT)
    at.number_input(key="beam_width").set_value(2)  # with n = 2: beam search needs n = 1
    _submit(at)
    assert at.error and "n must be 1" in at.error[0].value
    at.number_input(key="beam_width").set_value(1)
    at.text_area(key="prompts").set_value("1 2 three")
    _submit(at)
    assert at.error and "token ids" in at.error[0].value


def test_over_the_limits_is_an_error_and_a_fix_draws_again():
    at = open_app(PAGE, timeout=TIMEOUT)
    at.number_input(key="pool").set_value(1_000_000)  # 1,000,000 blocks x 8 KiB: over the 4 GiB budget
    _submit(at)
    assert at.error and "PAGED_LAB_MAX_BYTES" in at.error[0].value
    assert not at.metric  # nothing half drawn
    at.number_input(key="pool").set_value(48)
    at.number_input(key="n").set_value(16)
    at.text_area(key="prompts").set_value("\n".join(["1 2 3"] * 65))  # 65 x 16 = 1,040 sequences
    _submit(at)
    assert at.error and "1,040 sequences" in at.error[0].value
    at.number_input(key="n").set_value(2)
    at.number_input(key="max_tokens").set_value(8)
    _submit(at)
    assert not at.error
    assert _metric(at, "Tokens generated") == f"{65 * 2 * 8:,}"


def test_a_pool_too_small_says_which_pools_run_it_and_which_preempt():
    at = open_app(PAGE, timeout=TIMEOUT)
    # the 20-token prompt's full block is shared by its 4 samples, each then holds 3 blocks of its own (tokens
    # 16..50: the last of its 20 + 32 tokens is sampled, never stored): 1 + 4 x 3 = 13 blocks (the one fits formula)
    at.number_input(key="pool").set_value(8)
    _submit(at)
    message = at.error[0].value
    assert "too small" in message and "needs 13 blocks" in message
    # from 13 blocks the largest request runs; below the three requests' 13 + 12 + 12 = 37 they wait or preempt
    assert "a pool of 13 to 36 blocks runs them with requests waiting or preempted" in message
    assert "37 or more holds every sequence at once" in message
    at.number_input(key="pool").set_value(16)
    _submit(at)
    assert not at.error and _metric(at, "Tokens generated") == "384"


def test_every_input_is_in_the_url_and_a_bad_value_is_reported():
    at = open_app(PAGE, timeout=TIMEOUT)
    url = _url(at)
    assert (
        url["source"] == "smollm2" and url["n"] == "4" and url["max_tokens"] == "32" and url["pool"] == "64"
    )
    assert url["q"] == "What is the capital of France?" and url["block_size"] == "16"
    at.number_input(key="max_tokens").set_value(5)
    _submit(at)
    assert _url(at)["max_tokens"] == "5" and _metric(at, "Tokens generated") == f"{3 * 4 * 5}"
    at.query_params["n"] = "many"
    at.run()
    assert any("`n`" in e.value and "whole number" in e.value for e in at.error)


def test_sharing_measurement_runs_in_the_pool_and_draws():
    at = open_app(PAGE, timeout=TIMEOUT)
    at.checkbox(key="sharing").check()
    at.run()
    assert not at.exception and not at.error
    sharing = at.get("plotly_chart")[-1]
    assert "KV blocks saved by sharing (%)" in sharing.proto.spec


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_model_root(tmp_path_factory.mktemp("models"))


def _greedy_texts(path) -> list[str]:
    """The reference: the model at `path` loaded directly, greedy, on the test prompts."""
    outputs = Engine.from_pretrained(path, num_blocks=48).generate(
        PROMPT_IDS, SamplingParams(6, temperature=0.0)
    )
    return [" ".join(map(str, o.outputs[0].token_ids)) for o in outputs]


def test_with_a_model_root_its_models_are_offered_and_outside_paths_refused(models, monkeypatch, request):
    root, elsewhere = models
    serve_models_from(monkeypatch, request, root)
    at = open_app(PAGE, timeout=TIMEOUT)
    assert at.selectbox(key="model_dir").options == ["alias", "tiny"]
    at.radio(key="source").set_value("directory")  # a form: every setting goes in with the submit
    at.selectbox(key="model_dir").set_value("tiny")
    at.text_area(key="prompts").set_value(PROMPTS)
    at.number_input(key="n").set_value(1)
    at.number_input(key="max_tokens").set_value(6)
    at.number_input(key="temperature").set_value(0.0)
    _submit(at)
    assert not at.error
    tiny = _greedy_texts(root / "tiny")
    assert tiny != _greedy_texts(elsewhere)  # the two saved models tell apart which one was loaded
    assert at.dataframe[0].value["text"].tolist() == tiny
    for path in ("../elsewhere", str(elsewhere), str(root / "escape")):
        at.text_input(key="path").set_value(path)
        _submit(at)
        assert at.error and "PAGED_LAB_MODEL_ROOT" in at.error[0].value and str(root) in at.error[0].value
        assert not at.metric  # refused at once: nothing drawn
    at.text_input(key="path").set_value(str(root / "alias"))  # a typed path inside the root loads too
    _submit(at)
    assert not at.error and at.dataframe[0].value["text"].tolist() == tiny


def test_a_model_root_that_is_missing_is_an_error_not_a_traceback(monkeypatch, request, tmp_path):
    serve_models_from(monkeypatch, request, tmp_path / "not-mounted")
    at = open_app(PAGE, timeout=TIMEOUT)
    assert at.selectbox(key="model_dir").options == []
    at.radio(key="source").set_value("directory")
    _submit(at)
    assert at.error and "PAGED_LAB_MODEL_ROOT" in at.error[0].value and "not a directory" in at.error[0].value
