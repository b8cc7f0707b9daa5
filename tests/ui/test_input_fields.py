"""Every input declared once: for each field of the planner's input groups (`core.fields.InputField`; the Capacity
Planner's, the `plan` command's: tests/ui/test_plan_input_fields.py), the command-line flag (`predict`'s parser), the SLO planner page's URL field and its widget come from the one
declaration, and a command line and the equivalent URL build the same `Deployment` / `Load` /
`DisaggDeployment`, the ones written out by hand here; a bad value has one message, the command line's and the
page's (the page's widgets: tests/app/test_slo_predict_page.py)."""

import pytest

from core.errors import InvalidArgumentError
from core.planning.commands.predict_cli import (
    deployment_values,
    max_rate_main,
    max_rate_parser,
    predict_main,
    predict_parser,
    targets_from_args,
)
from core.planning.commands.slo_cli import build_parser as build_slo_parser
from core.planning.commands.slo_cli import main as slo_main
from core.planning.cost.speculative import Speculation
from core.planning.predict.deployment import Deployment
from core.planning.predict.disagg import DisaggDeployment
from core.planning.predict.inputs import (
    deployment_from,
    disagg_from,
    load_from,
)
from core.planning.predict.load import Load
from core.planning.predict.target_fields import TARGET_FIELDS, TARGET_METRICS
from core.planning.search.search_fields import SEARCH_FIELDS, SEARCH_URL_FIELDS
from core.planning.search.slo_candidates import (
    Slo,
    SloCandidates,
    candidates_from,
)
from ui.query_state import parse_params
from ui.slo_planner.state import FIELDS, PREDICT_INPUTS, params_from, predict_params_from

# a value other than its default for every input of the predict mode, by field name
VALUES = {
    "model": "qwen2.5-7b",
    "gpu": "l40s",
    "tp": 2,
    "pp": 2,
    "replicas": 3,
    "max_num_seqs": 64,
    "weight_dtype": "fp8",
    "kv_dtype": "fp8",
    "engine": "vllm",
    "vllm_version": "0.12.0",
    "rate": 3.5,
    "prompt_len": 4000,
    "output_len": 256,
    "length_spread": 0.25,
    "seed": 7,
    "shared_prefix_len": 1000,
    "num_prefixes": 4,
    "prefix_zipf": 1.1,
    "turns": 3,
    "turn_gap_s": 20.0,
    "spec_tokens": 2,
    "spec_acceptance": "0.8,0.6",
    "spec_method": "draft-model",
    "draft_model": "llama-3.1-8b",
    "kv_offload_gib": 100.0,
    "offload_policy": "arc",
}
DISAGG = {"disagg": True, "prefill_workers": 2, "prefill_tp": 1, "decode_workers": 1, "decode_tp": 4}
FIELDS_BY_KEY = {field.key: field for field in FIELDS}


def argv(values: dict) -> list[str]:
    """The command line of `values`, flag by flag from each field's declaration."""
    fields = {field.name: field for field in PREDICT_INPUTS}
    words = []
    for name, value in values.items():
        words += [fields[name].flag] if value is True else [fields[name].flag, str(value)]
    return words


def url(values: dict) -> dict:
    """The SLO page's predict mode's values for the URL query of `values`, key by key from each declaration."""
    fields = {field.name: field for field in PREDICT_INPUTS}
    query = {"mode": "predict", "load": "rate"}
    query |= {fields[name].url_key: "1" if value is True else str(value) for name, value in values.items()}
    parsed, errors = parse_params(query, FIELDS)
    assert errors == []
    return parsed


def test_every_page_input_is_its_field_on_the_command_line_and_in_the_url():
    flags = predict_parser()._option_string_actions
    assert {f.name for f in PREDICT_INPUTS} == set(VALUES) | set(DISAGG) | {"concurrency", "kv_link"}
    for field in PREDICT_INPUTS:
        assert flags[field.flag].dest == field.name, field
        url_field = FIELDS_BY_KEY[field.url_key]
        assert (url_field.label, url_field.kind, url_field.step) == (field.label, field.kind, field.step)


def test_a_command_line_and_its_url_build_the_same_deployment_and_load():
    spec = Speculation(2, (0.8, 0.6), "draft-model", "llama-3.1-8b")
    deployment = Deployment(
        "qwen2.5-7b",
        "l40s",
        tp=2,
        pp=2,
        replicas=3,
        max_num_seqs=64,
        weight_dtype="fp8",
        kv_dtype="fp8",
        engine="vllm",
        vllm_version="0.12.0",
        speculation=spec,
        kv_offload_gib=100.0,
        offload_policy="arc",
    )
    load = Load(3.5, 4000, 256, 0.25, 7, None, 1000, 4, 1.1, 3, 20.0)
    args = predict_parser().parse_args(argv(VALUES))
    assert deployment_from(deployment_values(args)) == deployment
    assert load_from(vars(args)) == load
    params = predict_params_from(url(VALUES))
    assert params.deployment() == deployment and params.load() == load


def test_a_disaggregated_command_line_and_its_url_build_the_same_deployment():
    values = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "kv_dtype": "fp8", "rate": 2.0} | DISAGG
    shape = {"prompt_len": 1000, "output_len": 100}
    expected = DisaggDeployment.of("llama-3.1-8b", "h100-80gb", (2, 1), (1, 4), None, kv_dtype="fp8")
    args = predict_parser().parse_args(argv(values | shape))
    assert disagg_from(deployment_values(args)) == expected
    assert predict_params_from(url(values)).disagg_deployment() == expected


@pytest.mark.parametrize(
    "bad",
    [
        {"tp": 0},
        {"replicas": 2000},
        {"max_num_seqs": 0},
        {"turns": 0},
        {"turn_gap_s": -1.0},
        {"shared_prefix_len": 5000},
        {"spec_tokens": 17, "spec_acceptance": "0.5"},
        {"spec_tokens": 2, "spec_acceptance": "0.5,2"},
        {"spec_method": "eagle"},
        {"disagg": True, "spec_tokens": 1, "spec_acceptance": "0.5"},
        {"disagg": True, "decode_workers": 0},
    ],
)
def test_a_bad_value_has_one_message_on_the_command_line_and_the_page(bad, capsys):
    values = {"model": "qwen2.5-7b", "gpu": "l40s", "rate": 2.0, "prompt_len": 4000, "output_len": 16} | bad
    capsys.readouterr()
    assert predict_main(argv(values)) == 2
    # the command's one line (another test's worker thread may log to the captured stderr too)
    [printed] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    with pytest.raises(InvalidArgumentError) as raised:
        predict_params_from(url(values)).check()
    assert printed == f"error: {raised.value}"


def test_the_search_space_flags_and_url_fields_are_its_fields():
    """`slo`'s --gpus --max-gpus --kv-dtypes --weight-dtypes and the search mode's URL fields: one declaration, and
    the same values give the same `SloCandidates` (as written by hand) from either."""
    flags = build_slo_parser()._option_string_actions
    for field in SEARCH_FIELDS:
        assert flags[field.flag].dest == field.name
    assert [f.flag for f in SEARCH_FIELDS if f not in SEARCH_URL_FIELDS] == [
        "--tp",
        "--pp",
        "--max-num-seqs",
        "--data-parallel-size",
        "--max-meeting",
        "--routing-candidates",
        "--max-num-batched-tokens",
        "--enable-expert-parallel",
        "--routing",
    ]  # the command line's only: no URL key (--disagg is the search mode's disagg_too)
    for field in SEARCH_URL_FIELDS:
        url_field = FIELDS_BY_KEY[field.url_key]
        assert (url_field.label, url_field.kind, url_field.choices) == (
            field.label,
            field.kind,
            field.choices,
        )
    words = ["--model", "qwen2.5-7b", "--rate", "2", "--prompt-len", "100", "--output-len", "10"]
    words += [
        "--gpus",
        "l40s",
        "h100-80gb",
        "--max-gpus",
        "4",
        "--kv-dtypes",
        "fp8",
        "--weight-dtypes",
        "fp8",
    ]
    args = build_slo_parser().parse_args(words)
    query = {"mode": "search", "gpus": "l40s,h100-80gb", "max_gpus": "4", "kv": "fp8", "weights": "fp8"}
    values, errors = parse_params(query, FIELDS)
    assert errors == []
    expected = SloCandidates(
        gpus=("l40s", "h100-80gb"), max_gpus=4, kv_dtypes=("fp8",), weight_dtypes=("fp8",)
    )
    page = params_from(values).candidates()
    cli = candidates_from(vars(args))
    assert cli == expected and (page.gpus, page.max_gpus, page.kv_dtypes, page.weight_dtypes) == (
        expected.gpus,
        expected.max_gpus,
        expected.kv_dtypes,
        expected.weight_dtypes,
    )
    with pytest.raises(InvalidArgumentError, match="--kv-dtypes must be among auto, fp16"):
        SloCandidates(kv_dtypes=("int3",))


def test_the_search_lists_flags_are_their_fields_and_check_by_them(capsys):
    """`slo`'s list-valued search flags (--tp --pp --max-num-seqs --data-parallel-size, several ints each, sorted
    and each once) and --max-meeting --routing-candidates build the `SloCandidates` written by hand; a bad value
    is the message `SloCandidates` raises for it, naming the flag."""
    words = [*SHAPE_ARGV, "--rate", "2", "--tp", "4", "1", "4", "--pp", "1", "--max-num-seqs", "128", "64"]
    words += ["--data-parallel-size", "2", "--max-meeting", "5"]
    words += ["--routing-candidates", "round-robin, least-loaded"]
    expected = SloCandidates(
        tensor_parallel=(1, 4),
        pipeline_parallel=(1,),
        max_num_seqs=(64, 128),
        data_parallel=(2,),
        max_meeting=5,
        routing=("round-robin", "least-loaded"),
    )
    assert candidates_from(vars(build_slo_parser().parse_args(words))) == expected
    assert candidates_from({}) == SloCandidates()  # the flags' defaults are the search's
    for flag, value, build in (
        ("--tp", "0", lambda: SloCandidates(tensor_parallel=(0,))),
        ("--max-num-seqs", "70000", lambda: SloCandidates(max_num_seqs=(64, 70000))),
        ("--data-parallel-size", "0", lambda: SloCandidates(data_parallel=(0,))),
        ("--max-meeting", "0", lambda: SloCandidates(max_meeting=0)),
        (
            "--routing-candidates",
            "round-robin,,random",
            lambda: candidates_from({"routing_candidates": "a,,b"}),
        ),
    ):
        capsys.readouterr()
        assert slo_main([*SHAPE_ARGV, "--rate", "2", "--ttft-p95", "1", flag, value]) == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        with pytest.raises(InvalidArgumentError) as raised:
            build()
        assert line.startswith(f"error: {flag} ") and str(raised.value).startswith(f"{flag} ")
        if flag != "--routing-candidates":  # (the same rule; the message quotes the value given)
            assert line == f"error: {raised.value}"


def test_the_search_settings_flags_are_their_fields_and_the_page_builds_the_same_candidates(capsys):
    """`slo`'s --max-num-batched-tokens --enable-expert-parallel --disagg --routing are the search's setting fields
    (a deployment's fields with the search's help; --routing without a default); --disagg is the search mode's
    `disagg_too` too, and both build the same `SloCandidates`; a bad value is `SloCandidates`' message."""
    flags = build_slo_parser()._option_string_actions
    for name in ("max_num_batched_tokens", "expert_parallel", "disagg", "routing"):
        field = next(f for f in SEARCH_FIELDS if f.name == name)
        assert flags[field.flag].dest == name and flags[field.flag].help.startswith(field.help), field
    words = [*SHAPE_ARGV, "--rate", "2", "--max-num-batched-tokens", "4096", "--enable-expert-parallel"]
    words += ["--disagg", "--routing", "least-loaded", "--max-gpus", "4"]
    expected = SloCandidates(
        max_gpus=4, max_num_batched_tokens=4096, expert_parallel=True, disagg=True, routing=("least-loaded",)
    )
    assert candidates_from(vars(build_slo_parser().parse_args(words))) == expected
    page = params_from(_page("search", {"max_gpus": "4", "disagg_too": "1"})).candidates()
    assert page.disagg and page.max_gpus == 4
    # the release: slo's --vllm-version and the page's `vllm` build the same candidates (empty: today's vLLM)
    release = candidates_from({}, vllm_version="0.12.0")
    at_release = params_from(_page("search", {"vllm": "0.12.0"})).candidates()
    assert at_release.vllm_version == "0.12.0" and at_release.step_overrides() == release.step_overrides()
    assert params_from(_page("search", {"vllm": ""})).candidates().vllm_version is None
    for flag, value, build in (
        ("--max-num-batched-tokens", "0", lambda: SloCandidates(max_num_batched_tokens=0)),
        ("--max-gpus", "1", lambda: SloCandidates(max_gpus=1, disagg=True)),
    ):
        extra = [flag, value] + (["--disagg"] if flag == "--max-gpus" else [])
        capsys.readouterr()
        assert slo_main([*SHAPE_ARGV, "--rate", "2", "--ttft-p95", "1", *extra]) == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        with pytest.raises(InvalidArgumentError) as raised:
            build()
        assert line == f"error: {raised.value}"
    with pytest.raises(InvalidArgumentError) as raised:
        params_from(_page("search", {"max_gpus": "1", "disagg_too": "1"})).check()
    assert (
        str(raised.value)
        == "--disagg needs --max-gpus of at least 2 GPUs (a prefill and a decode GPU), got 1"
    )


# the latency targets: `slo`'s and `max-rate`'s flags (seconds, any percentile) and the SLO page's fields (a value
# per metric, TPOT / ITL in ms, and its percentile), one declaration (`core.planning.predict.target_fields`)
TARGET_ARGV = ["--ttft-p99", "0.5", "--tpot-p90", "0.04", "--e2e-p50", "3"]
TARGET_URL = {"ttft": "0.5", "ttft_q": "99", "tpot_ms": "40", "tpot_q": "90", "itl_ms": "auto", "e2e": "3"}
TARGET_URL |= {"e2e_q": "50"}
SHAPE_ARGV = ["--model", "qwen2.5-7b", "--prompt-len", "100", "--output-len", "10"]


def _page(mode: str, query: dict) -> dict:
    values, errors = parse_params({"mode": mode} | query, FIELDS)
    assert errors == []
    return values


def test_the_target_flags_and_url_fields_are_their_fields_and_give_the_same_targets():
    for parser in (build_slo_parser(), max_rate_parser()):
        flags = parser._option_string_actions
        for field in TARGET_FIELDS:
            assert (flags[field.flag].dest, flags[field.flag].type) == (field.name, float), field
    for metric in TARGET_METRICS:
        value, q = FIELDS_BY_KEY[metric.url_key], FIELDS_BY_KEY[metric.q_key]
        assert (value.label, value.kind, value.step) == (metric.label, "float", metric.step)
        assert (q.label, q.kind, q.choices) == (metric.q_label, "choice", (50, 90, 95, 99))
    expected = Slo(ttft_p99_s=0.5, tpot_p90_s=0.04, e2e_p50_s=3.0)  # TPOT: 40 ms on the page
    slo_args = build_slo_parser().parse_args([*SHAPE_ARGV, "--rate", "2", *TARGET_ARGV])
    assert Slo.of(targets_from_args(slo_args)) == expected
    max_rate_args = max_rate_parser().parse_args([*SHAPE_ARGV, "--gpu", "l40s", *TARGET_ARGV])
    assert targets_from_args(max_rate_args) == expected.targets()
    assert params_from(_page("search", TARGET_URL)).slo() == expected
    predict = predict_params_from(_page("predict", TARGET_URL))
    assert predict.targets_dict() == expected.targets()
    # the max-rate command the predict mode prints gives its targets back
    words = predict.cli_args()[1]
    assert targets_from_args(max_rate_parser().parse_args(words)) == expected.targets()


@pytest.mark.parametrize(
    ("flag", "seconds", "query"),
    [
        ("--ttft-p95", "-1", {"ttft": "-1", "ttft_q": "95"}),
        ("--tpot-p99", "0", {"tpot_ms": "0", "tpot_q": "99"}),
        ("--tpot-p50", "-0.005", {"tpot_ms": "-5", "tpot_q": "50"}),  # the page's ms, the message's seconds
        ("--itl-p90", "4000", {"itl_ms": "4000000", "itl_q": "90"}),
        ("--e2e-p99", "3601", {"e2e": "3601", "e2e_q": "99"}),
    ],
)
def test_a_bad_target_has_one_message_on_both_commands_and_both_page_modes(flag, seconds, query, capsys):
    printed = []
    for main, extra in ((slo_main, ["--rate", "2"]), (max_rate_main, ["--gpu", "l40s"])):
        capsys.readouterr()
        assert main([*SHAPE_ARGV, *extra, flag, seconds]) == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        printed.append(line.removeprefix("error: "))
    assert printed[0] == printed[1] and printed[0].startswith(f"{flag} (seconds) must be")
    none = {"ttft": "auto", "tpot_ms": "auto"}
    with pytest.raises(InvalidArgumentError) as search:
        params_from(_page("search", none | query)).check()
    with pytest.raises(InvalidArgumentError) as predict:
        predict_params_from(_page("predict", none | query)).targets_dict()
    assert str(search.value) == str(predict.value) == printed[0]
