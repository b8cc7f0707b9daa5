"""The Engine page under AppTest (its runs go through the worker pool): the default tiny-model run draws, a bad
directory is an st.error, beam search runs, an oversize pool or too many sequences are refused with the limit's
message before anything is built, and the Figure 15 sharing measurement draws."""

from tests.conftest import open_app

PAGE = "app_pages/engine.py"


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _submit(at):
    next(b for b in at.button if b.proto.label == "Generate").click()
    at.run()
    assert not at.exception, at.exception


def test_default_run_draws_outputs_heatmap_and_step_charts():
    at = open_app(PAGE)
    assert not at.error
    # 3 prompts x n = 2 samples x 24 tokens, exactly (EOS ignored on the random model)
    assert _metric(at, "Tokens generated") == "144"
    table = at.dataframe[0].value
    assert len(table) == 6 and set(table["tokens"]) == {24}
    assert len(at.get("plotly_chart")) >= 4
    # n = 2 forks each prompt: the partly filled last prompt blocks are copied on the first write
    assert int(_metric(at, "Copy-on-write copies")) >= 1
    slider = at.select_slider(key="step")
    slider.set_value(slider.options[-1])
    at.run()
    assert not at.exception and not at.error


def test_bad_directory_is_an_error_not_a_traceback(tmp_path):
    at = open_app(PAGE)
    at.radio(key="source").set_value("directory")
    at.text_input(key="path").set_value(str(tmp_path / "missing"))
    _submit(at)
    assert at.error and "does not exist" in at.error[0].value
    (tmp_path / "empty").mkdir()
    at.text_input(key="path").set_value(str(tmp_path / "empty"))
    _submit(at)
    assert at.error and "config.json" in at.error[0].value


def test_beam_search_returns_beams_best_first():
    at = open_app(PAGE)
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
    at = open_app(PAGE)
    at.number_input(key="beam_width").set_value(2)  # with n = 2: beam search needs n = 1
    _submit(at)
    assert at.error and "n must be 1" in at.error[0].value
    at.number_input(key="beam_width").set_value(1)
    at.text_area(key="prompts").set_value("1 2 three")
    _submit(at)
    assert at.error and "token ids" in at.error[0].value


def test_over_the_limits_is_an_error_and_a_fix_draws_again():
    at = open_app(PAGE)
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
    _submit(at)
    assert not at.error
    assert _metric(at, "Tokens generated") == f"{65 * 2 * 24:,}"


def test_sharing_measurement_runs_in_the_pool_and_draws():
    at = open_app(PAGE)
    at.checkbox(key="sharing").check()
    at.run()
    assert not at.exception and not at.error
    sharing = at.get("plotly_chart")[-1]
    assert "KV blocks saved by sharing (%)" in sharing.proto.spec
