"""Every input declared once, the Capacity Planner's side: for each field of the `plan` command's inputs
(`core.planning.predict.plan_fields`: the deployment under the page's "a_" / "b_" keys, and vLLM on a CPU,
`CPU_FIELDS`), the command-line flag, the page's URL field and its widget come from the one declaration, a command
line and the equivalent URL build the same `PlanInputs` / `CpuKVInputs`, and a bad value has the command's
message on the page (the predict / SLO side: tests/ui/test_input_fields.py)."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from core.page_models.planner_scenario import cpu_plan, plan_inputs
from core.planning.catalog.hardware import get_gpu
from core.planning.catalog.models import get_model
from core.planning.commands.capacity import build_parser as build_plan_parser
from core.planning.commands.capacity import capacity_main
from core.planning.memory.cpu_kv import CpuKVInputs, plan_cpu_kv
from core.planning.memory.plan import PlanInputs
from core.planning.predict.inputs import (
    cpu_inputs_from,
    plan_inputs_from,
)
from core.planning.predict.plan_fields import CPU_FIELDS, PLANNER_FIELDS
from ui.planner.state import ALL_FIELDS as PLANNER_URL_FIELDS
from ui.planner.state import scenario_fields
from ui.query_state import parse_params

# the Capacity Planner page (`plan`'s inputs, two scenarios "a_" / "b_"): a value other than the page's seed for
# every input of a preset model on a preset GPU, by field name
PLAN_VALUES = {
    "model": "qwen2.5-7b",
    "gpu": "l40s",
    "num_gpus": 8,
    "tp": 2,
    "pp": 2,
    "weight_dtype": "fp8",
    "kv_dtype": "bf16",
    "gpu_memory_utilization": 0.85,
    "block_size": 32,
    "max_model_len": 8192,
    "activation_reserve_gib": 1.5,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 4096,
    "data_parallel": 2,
    "hybrid_kv_cache_manager": False,
}
PLANNER_BY_NAME = {field.name: field for field in PLANNER_FIELDS}


def test_the_planner_inputs_are_the_plan_commands_flags_and_url_fields_and_build_the_same_plan():
    flags = build_plan_parser()._option_string_actions
    for prefix in ("a_", "b_"):
        url_fields = {f.key: f for f in scenario_fields(prefix)}
        for field in PLANNER_FIELDS:
            assert flags[field.flag].dest == field.name, field
            url = url_fields[prefix + field.url_key]
            declared = (field.label, field.step, field.minimum, field.maximum)
            assert (url.label, url.step, url.minimum, url.maximum) == declared, field
    words = [w for name, v in PLAN_VALUES.items() for w in PLANNER_BY_NAME[name].words(v)]
    assert "--disable-hybrid-kv-cache-manager" in words
    args = build_plan_parser().parse_args(words)
    url_fields = {f.key: f for f in scenario_fields("a_")}
    query = {"compare": "0"}
    for name, value in PLAN_VALUES.items():
        key = f"a_{PLANNER_BY_NAME[name].url_key}"
        query[key] = url_fields[key].encode(value)
    values, errors = parse_params(query, PLANNER_URL_FIELDS)
    assert errors == []
    expected = PlanInputs(
        get_model("qwen2.5-7b"),
        get_gpu("l40s"),
        num_gpus=8,
        tensor_parallel=2,
        pipeline_parallel=2,
        weight_dtype="fp8",
        kv_dtype="bf16",
        gpu_memory_utilization=0.85,
        block_size=32,
        max_model_len=8192,
        activation_reserve=int(1.5 * 1024**3),
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        data_parallel=2,
        hybrid_kv_cache_manager=False,
    )
    assert plan_inputs_from(vars(args)) == expected
    assert plan_inputs(values, "a_") == expected


def _widget(at: AppTest, key: str):
    for kind in ("number_input", "selectbox", "slider", "toggle", "checkbox"):
        found = [w for w in getattr(at, kind) if w.key == key]
        if found:
            return found[0]
    raise AssertionError(f"no widget keyed {key}")


def test_the_planner_widgets_are_the_fields_and_a_bad_value_says_what_plan_says(capsys):
    """One run of the Capacity Planner page (a custom GPU, so its figures are drawn too): every widget of a
    scenario's deployment has its field's label and key; a bad value in the URL is refused with the message the
    `plan` command prints for the same value."""
    bad = {"tp": "100", "gpu_memory_utilization": "7", "max_model_len": "10", "max_num_seqs": "0"}
    printed = []
    for name, value in bad.items():
        capsys.readouterr()
        assert capacity_main([PLANNER_BY_NAME[name].flag, value]) == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        printed.append(line.removeprefix("error: "))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app_pages" / "planner.py"))
    at.query_params.update({"a_gpu": "custom", "compare": "0", "cpu": "1"})  # the CPU section drawn too
    at.query_params.update({f"a_{PLANNER_BY_NAME[name].url_key}": value for name, value in bad.items()})
    at.run(timeout=120)
    assert not at.exception, at.exception
    shown = [e.value for e in at.error]
    for message in printed:
        assert sum(message in e for e in shown) == 1, (message, shown)
    for field in PLANNER_FIELDS:
        assert _widget(at, f"a_{field.url_key}").label == field.label, field
    for field in CPU_FIELDS:  # `plan`'s CPU flags
        assert _widget(at, field.url_key).label == field.label, field
    for field in PLANNER_URL_FIELDS:  # the page's own (the workload, the switches): one label, URL and widget
        if not field.key.startswith(("a_", "b_", "cpu_")):
            assert _widget(at, field.key).label == field.label, field


# vLLM on a CPU: `plan --cpu-kv-cache-space-gib`'s flags and the Capacity Planner page's CPU section (scenario A's
# model, max_model_len, max_num_batched_tokens and hybrid switch), one declaration (`CPU_FIELDS`)
CPU_ARGV = [
    "--model",
    "gemma-3-27b",
    "--cpu-kv-cache-space-gib",
    "8",
    "--block-size",
    "64",
    "--dtype",
    "float16",
]
CPU_ARGV += ["--kv-dtype", "fp8", "--max-model-len", "8192", "--max-num-batched-tokens", "4096"]
CPU_ARGV += ["--disable-hybrid-kv-cache-manager"]
CPU_URL = {"compare": "0", "a_model": "gemma-3-27b", "a_ctx": "8192", "a_mbt": "4096", "a_hybrid": "0"}
CPU_URL |= {"cpu": "1", "cpu_gib": "8", "cpu_block": "64", "cpu_dtype": "float16", "cpu_kvdtype": "fp8"}


def test_the_cpu_inputs_are_the_plan_commands_flags_and_url_fields_and_build_the_same_cpu_plan():
    flags = build_plan_parser()._option_string_actions
    url_fields = {f.key: f for f in PLANNER_URL_FIELDS}
    for field in CPU_FIELDS:
        assert flags[field.flag].dest == field.name, field
        url = url_fields[field.url_key]
        assert (url.label, url.kind, url.minimum, url.maximum) == (
            field.label,
            field.kind,
            field.minimum,
            field.maximum,
        ), field
    assert url_fields["cpu_block"].choices == CPU_FIELDS[1].choices  # the CPU backend's (multiples of 32)
    expected = CpuKVInputs.from_space_gib(
        get_model("gemma-3-27b"),
        8,
        block_size=64,
        dtype="float16",
        kv_cache_dtype="fp8",
        max_model_len=8192,
        max_num_batched_tokens=4096,
        hybrid_kv_cache_manager=False,
    )
    args = build_plan_parser().parse_args(CPU_ARGV)
    assert cpu_inputs_from(vars(args) | {"model": get_model("gemma-3-27b")}) == expected
    values, errors = parse_params(CPU_URL, PLANNER_URL_FIELDS)
    assert errors == []
    assert cpu_plan(values) == plan_cpu_kv(expected)


@pytest.mark.parametrize(("flag", "value", "key"), [("--cpu-kv-cache-space-gib", "0", "cpu_gib")])
def test_a_bad_cpu_value_has_the_plan_commands_message_in_the_url(flag, value, key, capsys):
    capsys.readouterr()
    assert capacity_main(["--model", "llama-3.1-8b", flag, value]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: {flag} (GiB) must be")
    _, errors = parse_params({key: value}, PLANNER_URL_FIELDS)
    [error] = errors
    assert line.removeprefix("error: ") in error
    for argv in (["--dtype", "float64"], ["--dtype", "float64", "--cpu-kv-cache-space-gib", "1"]):
        assert capacity_main(argv) == 2  # a GPU plan refuses a bad --dtype too, as the CPU plan does
        [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        assert line == "error: --dtype must be one of auto, float32, float16, bfloat16, got 'float64'"
