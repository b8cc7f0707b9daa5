"""The Planner page under AppTest, and the URL-state helpers it is built on."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from core.errors import InvalidArgumentError
from core.planning.hardware import GPUS, GPUSpec
from core.planning.models import MODELS, ModelSpec, preset_configs
from core.planning.plan import plan
from core.planning.scenario import (
    build_model,
    compact_config,
    compute_scenario,
    decode_config,
    encode_config,
    make_workload,
    plan_document,
)
from ui.planner_state import ALL_FIELDS, url_params
from ui.query_state import Field, encode_params, parse_params

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------------------
# ui.query_state (no streamlit)
# ---------------------------------------------------------------------------------------------------------

FIELDS = [
    Field("n", 4, "int", minimum=1, maximum=100),
    Field("u", 0.9, "float", minimum=0.05, maximum=1.0),
    Field("g", "h100", "choice", ("h100", "a100")),
    Field("b", 16, "choice", (8, 16, 32)),
    Field("on", True, "bool"),
    Field("act", None, "float", minimum=0, optional=True),
]


def test_parse_params_accepts_valid_values_and_round_trips():
    values, errors = parse_params(
        {"n": "8", "u": "0.5", "g": "a100", "b": "32", "on": "0", "act": "2.5"}, FIELDS
    )
    assert errors == []
    assert values == {"n": 8, "u": 0.5, "g": "a100", "b": 32, "on": False, "act": 2.5}
    assert parse_params(encode_params(values, FIELDS), FIELDS) == (values, [])
    defaults, _ = parse_params({}, FIELDS)
    assert defaults == {"n": 4, "u": 0.9, "g": "h100", "b": 16, "on": True, "act": None}
    assert encode_params(defaults, FIELDS)["act"] == "auto"


@pytest.mark.parametrize(
    "key, raw, reason",
    [("n", "-3", "at least 1"), ("n", "1e99", "whole number"), ("n", "101", "at most 100"),
     ("n", "four", "whole number"), ("u", "nan", "finite"), ("u", "inf", "finite"), ("g", "h1000", "allowed"),
     ("b", "12", "allowed"), ("on", "maybe", "1/0"), ("act", "-1", "at least 0")],
)  # fmt: skip
def test_parse_params_rejects_with_reason_and_uses_default(key, raw, reason):
    values, errors = parse_params({key: raw}, FIELDS)
    default = next(f.default for f in FIELDS if f.key == key)
    assert values[key] == default
    assert len(errors) == 1 and key in errors[0] and reason in errors[0]


def test_config_round_trip_and_garbage():
    config = preset_configs()["gemma-2-9b"]["config"]
    decoded = decode_config(encode_config(config))
    assert decoded == compact_config(config) and decoded["num_key_value_heads"] == 8
    assert "architectures" in config and "architectures" not in decoded  # only the fields the planner reads
    for garbage in ("!!!", "abc", encode_config({"a": 1})[:-3] + "zzz"):
        with pytest.raises(InvalidArgumentError, match="cannot be read"):
            decode_config(garbage)
    with pytest.raises(InvalidArgumentError, match="more than 65,536 bytes"):
        decode_config(encode_config({"_name_or_path": "x" * 100_000}))


def test_custom_model_survives_the_url():
    config = preset_configs()["qwen2.5-7b"]["config"]
    values, _ = parse_params({"a_model": "custom", "a_config": encode_config(config)}, ALL_FIELDS)
    model = build_model(values, "a_")
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (28, 4, 128)
    assert "a_config" in url_params(values)
    assert "a_config" not in url_params({**values, "a_model": "qwen2.5-7b"})


def test_plan_document_is_json_and_matches_core():
    values, _ = parse_params({}, ALL_FIELDS)
    requests = make_workload(values, 4096)
    results = {"Scenario A": compute_scenario(values, "a_", requests)}
    document = json.loads(json.dumps(plan_document(values, results)))
    scenario = document["scenarios"]["Scenario A"]
    expected = plan(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="fp8",
                    max_model_len=4096)  # fmt: skip
    assert scenario["plan"]["kv_tokens"] == expected.kv_tokens
    assert scenario["model"]["num_kv_heads"] == 8 and scenario["gpu"]["memory_bytes"] == 80 * 1024**3
    assert scenario["workload_what_if"]["num_requests"] == 1000
    assert len(scenario["fragmentation_by_block_size"]) == 9
    assert document["inputs"]["a_kvdtype"] == "fp8"


def test_workload_lengths_fit_max_len():
    values, _ = parse_params({}, ALL_FIELDS)
    requests = make_workload(values, 1024)
    assert len(requests) == 1000 and max(p + o for p, o in requests) <= 1024


# ---------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------


def open_planner(params: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    for key, value in (params or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    at.switch_page("app_pages/planner.py")
    at.run()
    assert not at.exception, at.exception
    return at


def metrics(at: AppTest) -> list[tuple[str, str]]:
    return [(m.label, m.value) for m in at.metric]


def test_defaults_draw_the_plan_of_core():
    at = open_planner()
    assert not at.error
    expected = plan(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="fp8",
                    max_model_len=4096)  # fmt: skip
    shown = metrics(at)
    assert ("KV tokens per replica", f"{expected.kv_tokens:,}") in shown
    assert ("KV blocks", f"{expected.num_blocks:,}") in shown
    assert ("Max requests at max_model_len", f"{expected.max_concurrency:,}") in shown
    assert len(at.get("plotly_chart")) == 4
    assert any("40,960 B" in md.value for md in at.markdown)  # the formula, with the numbers
    assert any("--kv-cache-dtype fp8" in code.value for code in at.code)
    assert at.query_params["a_kvdtype"] == ["fp8"] or at.query_params["a_kvdtype"] == "fp8"
    assert len(at.get("download_button")) == 1


def test_bad_query_params_give_reasons_not_tracebacks():
    at = open_planner({"a_model": "llama-9", "a_tp": "-4", "a_ctx": "99999999999", "a_gpu": "h1000",
                       "a_util": "7", "compare": "0"})  # fmt: skip
    errors = " ".join(e.value for e in at.error)
    for text in ("`a_model`", "llama-9", "`a_tp`", "at least 1", "`a_ctx`", "at most", "`a_gpu`", "`a_util`"):
        assert text in errors
    # The page still shows the default plan, and the URL now holds valid values.
    assert ("KV tokens per replica", "981,040") in metrics(at)
    assert str(at.query_params["a_model"]).strip("[]'") == "llama-3.1-70b"


def test_invalid_combination_reports_the_rule():
    at = open_planner({"a_tp": "3", "a_gpus": "3", "compare": "0"})
    assert any("not divisible by tensor_parallel=3" in e.value for e in at.error)
    at2 = open_planner({"a_ctx": "200000", "compare": "0"})
    assert any("max_position_embeddings" in e.value for e in at2.error)


def test_changing_an_input_updates_metrics_and_url():
    at = open_planner({"compare": "0"})
    at.selectbox(key="a_kvdtype").set_value("bf16").run()
    assert not at.exception
    expected = plan(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="bf16",
                    max_model_len=4096)  # fmt: skip
    assert ("KV tokens per replica", f"{expected.kv_tokens:,}") in metrics(at)
    assert "bf16" in str(at.query_params["a_kvdtype"])


def test_does_not_fit_verdict_and_scenario_b_deltas():
    at = open_planner({"b_tp": "1", "b_gpus": "1", "b_gpu": "h100-80gb"})
    errors = [e.value for e in at.error]
    assert any(e.startswith("Does not fit") and "tensor_parallel >= 2" in e for e in errors)
    at = open_planner()  # A: 4 x H100, B: 2 x H200
    b_tokens = next(m for m in at.metric[5:] if m.label == "KV tokens per replica")
    a_plan = plan(
        MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
    )
    b_plan = plan(
        MODELS["llama-3.1-70b"], GPUS["h200-141gb"], tensor_parallel=2, kv_dtype="fp8", max_model_len=4096
    )
    assert b_tokens.value == f"{b_plan.kv_tokens:,}"
    assert b_tokens.delta == f"{b_plan.kv_tokens - a_plan.kv_tokens:+,}"


def test_custom_config_paste_and_bad_json():
    at = open_planner({"compare": "0", "a_model": "custom"})
    assert any("paste or upload" in e.value for e in at.error)
    config = preset_configs()["mistral-7b"]["config"]
    at.text_area(key="a_config_text").set_value(json.dumps(config)).run()
    assert not at.exception
    # A pasted config has no published parameter count: it is estimated from the shapes.
    model = ModelSpec.from_hf_config(config)
    assert model.params_estimated and model.num_params == pytest.approx(
        MODELS["mistral-7b"].num_params, rel=1e-3
    )
    expected = plan(
        model, GPUS["h100-80gb"], num_gpus=4, tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
    )
    assert ("KV blocks", f"{expected.num_blocks:,}") in metrics(at)
    assert str(at.query_params["a_model"]).strip("[]'") == "custom" and "a_config" in at.query_params
    at.text_area(key="a_config_text").set_value("{not json").run()
    assert not at.exception
    assert any("not valid JSON" in e.value for e in at.error)


def test_custom_gpu_from_url():
    at = open_planner({"compare": "0", "a_model": "llama-3.1-8b", "a_gpu": "custom", "a_gpu_mem": "48",
                       "a_gpu_bw": "1000", "a_gpus": "1", "a_tp": "1", "a_kvdtype": "auto"})  # fmt: skip
    expected = plan(MODELS["llama-3.1-8b"], GPUSpec.custom("x", 48, 1000), max_model_len=4096)
    assert ("KV blocks", f"{expected.num_blocks:,}") in metrics(at)


def test_switching_to_a_shorter_model_clamps_max_model_len():
    at = open_planner({"compare": "0", "a_ctx": "8192", "a_tp": "1", "a_gpus": "1"})
    at.selectbox(key="a_model").set_value("opt-13b").run()
    assert not at.exception and not at.error
    assert at.number_input(key="a_ctx").value == 2048
    expected = plan(MODELS["opt-13b"], GPUS["h100-80gb"], kv_dtype="fp8", max_model_len=2048)
    assert ("KV blocks", f"{expected.num_blocks:,}") in metrics(at)
    assert "2048" in str(at.query_params["a_ctx"])


def test_what_if_survives_a_visit_to_another_page():
    at = open_planner({"compare": "0"})
    at.selectbox(key="a_kvdtype").set_value("bf16").run()
    at.number_input(key="a_ctx").set_value(8192).run()
    at.switch_page("app_pages/playground.py").run()
    assert not at.exception
    at.switch_page("app_pages/planner.py").run()
    assert not at.exception
    assert at.selectbox(key="a_kvdtype").value == "bf16" and at.number_input(key="a_ctx").value == 8192
    assert "8192" in str(at.query_params["a_ctx"])
