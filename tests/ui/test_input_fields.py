"""Every input declared once: for each field of the planner's input groups (`core.fields.InputField`), the
command-line flag (`predict`'s parser), the SLO planner page's URL field and its widget come from the one
declaration, and a command line and the equivalent URL build the same `Deployment` / `Load` /
`DisaggDeployment`, the ones written out by hand here; a bad value has one message, the command line's and the
page's (the page's widgets: tests/app/test_slo_predict_page.py)."""

import pytest

from core.errors import InvalidArgumentError
from core.planning.commands.predict_cli import deployment_values, predict_main, predict_parser
from core.planning.commands.slo_cli import build_parser as build_slo_parser
from core.planning.cost.speculative import Speculation
from core.planning.predict.disagg import DisaggDeployment
from core.planning.predict.inputs import deployment_from, disagg_from, load_from
from core.planning.predict.load import Load
from core.planning.predict.prediction import Deployment
from core.planning.search.slo_candidates import SEARCH_FIELDS, SloCandidates
from ui.query_state import parse_params
from ui.slo_planner_state import FIELDS, PREDICT_INPUTS, params_from, predict_params_from

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
    "engine": "trtllm",
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
        engine="trtllm",
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
    cli = SloCandidates(**{f.name: getattr(args, f.name) for f in SEARCH_FIELDS})
    assert cli == expected and (page.gpus, page.max_gpus, page.kv_dtypes, page.weight_dtypes) == (
        expected.gpus,
        expected.max_gpus,
        expected.kv_dtypes,
        expected.weight_dtypes,
    )
    with pytest.raises(InvalidArgumentError, match="--kv-dtypes must be among auto, fp16"):
        SloCandidates(kv_dtypes=("int3",))
