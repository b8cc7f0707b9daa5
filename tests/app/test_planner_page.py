"""The Planner page under AppTest, and the URL-state helpers it is built on."""

import base64
import gzip
import io
import json
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from streamlit.proto.Metric_pb2 import Metric
from streamlit.testing.v1 import AppTest

from core.errors import InvalidArgumentError
from core.page_models.planner import (
    build_model,
    compact_config,
    compute_scenario,
    config_from_bytes,
    decode_config,
    encode_config,
    formula_lines,
    make_workload,
    model_from_config,
    plan_document,
)
from core.planning.catalog.hardware import GPUS, GPUSpec
from core.planning.catalog.models import MODELS, ModelSpec, preset_configs
from core.planning.memory.plan import plan, plan_from
from tests.conftest import page_order
from ui.planner.state import ALL_FIELDS, url_params
from ui.query_state import Field, encode_params, parse_params

# st.metric's arrow and colour, as its message carries them
DOWN, NO_ARROW = Metric.MetricDirection.DOWN, Metric.MetricDirection.NONE
RED, GREY = Metric.MetricColor.RED, Metric.MetricColor.GRAY

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
    [
        ("n", "-3", "at least 1"),
        ("n", "1e99", "whole number"),
        ("n", "101", "at most 100"),
        ("n", "four", "whole number"),
        ("u", "nan", "finite"),
        ("u", "inf", "finite"),
        ("g", "h1000", "allowed"),
        ("b", "12", "allowed"),
        ("on", "maybe", "1/0"),
        ("act", "-1", "at least 0"),
    ],
)
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
    expected = plan(
        MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
    )
    assert scenario["plan"]["kv_tokens"] == expected.kv_tokens
    assert scenario["model"]["num_kv_heads"] == 8 and scenario["gpu"]["memory_bytes"] == 81_559 * 1024**2
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
    expected = plan(
        MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
    )
    shown = metrics(at)
    assert ("KV tokens per replica", f"{expected.kv_tokens:,}") in shown
    assert ("KV blocks", f"{expected.num_blocks:,}") in shown
    assert ("Full-length requests", f"{expected.max_concurrency:,}") in shown
    assert len(at.get("plotly_chart")) == 4
    assert any("40,960 B" in md.value for md in at.markdown)  # the formula, with the numbers
    assert any("--kv-cache-dtype fp8" in code.value for code in at.code)
    assert at.query_params["a_kvdtype"] == ["fp8"] or at.query_params["a_kvdtype"] == "fp8"
    assert len(at.get("download_button")) == 1


def test_bad_query_params_give_reasons_not_tracebacks():
    at = open_planner(
        {
            "a_model": "llama-9",
            "a_tp": "-4",
            "a_ctx": "99999999999",
            "a_gpu": "h1000",
            "a_util": "7",
            "compare": "0",
        }
    )
    errors = " ".join(e.value for e in at.error)
    for text in ("`a_model`", "llama-9", "`a_tp`", "`a_ctx`", "`a_gpu`", "`a_util`"):
        assert text in errors
    # a number out of range: the message of its input's one check, the `plan` command's (tests/ui/test_input_fields.py)
    for text in ("--tp must be between 1 and 64, got -4", "--max-model-len (tokens) must be between 16 and"):
        assert text in errors
    # The page still shows the default plan, and the URL now holds valid values.
    assert ("KV tokens per replica", "972,720") in metrics(at)  # 4 x H100 at their driver-reported 79.6 GiB
    assert str(at.query_params["a_model"]).strip("[]'") == "llama-3.1-70b"
    # the reasons come first, above the answer computed with the defaults in their place
    kinds = [node.type for node in page_order(at.main)]
    assert kinds.index("error") < kinds.index("metric") < kinds.index("number_input")


def test_invalid_combination_reports_the_rule():
    at = open_planner({"a_tp": "3", "a_gpus": "3", "compare": "0"})
    assert any("not divisible by tensor_parallel=3" in e.value for e in at.error)
    at2 = open_planner({"a_ctx": "200000", "compare": "0"})
    assert any("max_position_embeddings" in e.value for e in at2.error)


def test_changing_an_input_updates_metrics_and_url():
    at = open_planner({"compare": "0"})
    at.selectbox(key="a_kvdtype").set_value("bf16").run()
    assert not at.exception
    expected = plan(
        MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="bf16", max_model_len=4096
    )
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
    # both hold max_num_seqs (256) at once: the same figure reads "±0" in grey, not a green "+0" with an up arrow
    b_concurrent = next(m for m in at.metric[5:] if m.label == "Avg concurrent, paged")
    arrow_and_colour = (b_concurrent.proto.direction, b_concurrent.proto.color)
    assert (b_concurrent.value, b_concurrent.delta, arrow_and_colour) == ("256", "±0", (NO_ARROW, GREY))
    assert (b_tokens.proto.direction, b_tokens.proto.color) == (DOWN, RED)  # the control: B holds fewer


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
    at = open_planner(
        {
            "compare": "0",
            "a_model": "llama-3.1-8b",
            "a_gpu": "custom",
            "a_gpu_mem": "48",
            "a_gpu_bw": "1000",
            "a_gpus": "1",
            "a_tp": "1",
            "a_kvdtype": "auto",
        }
    )
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


def test_changing_the_model_offers_the_smallest_deployment_that_fits():
    """The default scenario A is Llama-3.1-70B on 4 x H100 at TP 4; switched to Llama-3.1-8B it is moved to one
    H100 (the smallest deployment that fits, checked against `plan`), and the page says so; a model that fits on
    no 8 GPUs says that instead."""
    at = open_planner({"compare": "0"})
    at.selectbox(key="a_model").set_value("llama-3.1-8b").run()
    assert not at.exception and not at.error
    assert (at.number_input(key="a_gpus").value, at.number_input(key="a_tp").value) == (1, 1)
    assert plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], kv_dtype="fp8", max_model_len=4096).fits
    assert any("smallest that fits (was 4 at TP 4)" in i.value for i in at.info)
    assert "a_gpus=1" in "&".join(
        f"{k}={v[-1] if isinstance(v, list) else v}" for k, v in at.query_params.items()
    )
    at.selectbox(key="a_gpu").set_value("l4").run()
    at.selectbox(key="a_model").set_value("llama-3.1-405b").run()
    assert not at.exception
    assert any("No deployment of up to 8 GPUs" in i.value for i in at.info)
    assert not plan(
        MODELS["llama-3.1-405b"],
        GPUS["l4"],
        num_gpus=8,
        tensor_parallel=8,
        kv_dtype="fp8",
        max_model_len=4096,
    ).fits


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


# ---------------------------------------------------------------------------------------------------------
# Hostile input: every URL parameter, pasted and uploaded config.json files
# ---------------------------------------------------------------------------------------------------------

HOSTILE_VALUES = ["nan", "-1e308", "1e308", "-7", "🧱ü\u202e\x00", "9" * 5000, "", "[1, 2]", "0x10"]


@pytest.mark.parametrize("raw", HOSTILE_VALUES)
def test_hostile_values_in_every_url_parameter(raw):
    params = {field.key: raw for field in ALL_FIELDS}
    params.update({"zz_unknown": raw, "a_model": "custom"} if raw == "" else {"zz_unknown": raw})
    at = open_planner(params)  # asserts no exception
    # Each field either parsed the value (within its bounds) or was refused with a reason and its default.
    for key, value in at.session_state["_planner_values"].items():
        field = next(f for f in ALL_FIELDS if f.key == key)
        if field.kind in ("int", "float") and value is not None:
            assert field.minimum <= value <= field.maximum
    assert at.error, "a hostile URL must be reported"
    assert "zz_unknown" not in " ".join(e.value for e in at.error)  # unknown keys are ignored


def test_hostile_custom_configs_in_the_url():
    bomb = base64.urlsafe_b64encode(zlib.compress(b"{" + b" " * 10_000_000 + b"}", 9)).decode().rstrip("=")
    for blob in (
        "!!!",
        encode_config({"a": 1})[:-3] + "zzz",
        bomb,
        encode_config({"num_hidden_layers": "x"}),
    ):
        at = open_planner({"compare": "0", "a_model": "custom", "a_config": blob})
        errors = " ".join(e.value for e in at.error)
        assert "Scenario A" in errors or "custom" in errors.lower(), errors


def test_bad_pasted_config_changes_nothing():
    at = open_planner({"compare": "0", "a_model": "custom"})
    config = preset_configs()["mistral-7b"]["config"]
    at.text_area(key="a_config_text").set_value(json.dumps(config)).run()
    good = metrics(at)
    blob = at.session_state["_planner_values"]["a_config"]
    bad_texts = {
        "": "paste or upload",
        "x" * 200_001: "at most 200,000",
        "[" * 50_000 + "]" * 50_000: "cannot be read",
        "[1, 2]": "JSON object",
        json.dumps({**config, "num_hidden_layers": "thirty-two"}): "layers",
        json.dumps({**config, "hidden_size": [4096]}): "hidden",
        json.dumps({**config, "vocab_size": 10**400}): "out of range",
        '{"vocab_size": ' + "9" * 5000 + "}": "cannot be read",
    }
    for text, reason in bad_texts.items():
        at.text_area(key="a_config_text").set_value(text).run()
        assert not at.exception, at.exception
        assert any(reason in e.value for e in at.error), (reason, [e.value for e in at.error])
        assert metrics(at) == good and at.session_state["_planner_values"]["a_config"] == blob


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
        (b'{"a": "\x00"}', "binary"),
        (b" " * 1_000_000, "bytes"),
        (b"[]", "JSON object"),
        (b"\xef\xbb\xbf{}", None),
    ],
)
def test_uploaded_config_is_checked(data, reason):
    if reason is None:
        assert config_from_bytes(data) == {}  # a UTF-8 byte-order mark is accepted
        return
    with pytest.raises(InvalidArgumentError, match=reason):
        config_from_bytes(data)


def test_model_from_config_reports_wrong_types():
    config = dict(preset_configs()["llama-3.1-8b"]["config"])
    for key, value in (("num_hidden_layers", "32"), ("num_attention_heads", None), ("torch_dtype", [1])):
        with pytest.raises(InvalidArgumentError):
            model_from_config({**config, key: value})


def test_replanning_from_the_kept_inputs():
    first = plan(
        MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
    )
    other = plan_from(replace(first.inputs, gpu=GPUS["h200-141gb"]))
    expected = plan(
        MODELS["llama-3.1-70b"], GPUS["h200-141gb"], tensor_parallel=4, kv_dtype="fp8", max_model_len=4096
    )
    assert other == expected and other.kv_tokens > first.kv_tokens


def test_hybrid_model_shows_groups_comparison_and_flags():
    at = open_planner(
        {
            "a_model": "gpt-oss-20b",
            "a_gpu": "h100-80gb",
            "a_gpus": "1",
            "a_tp": "1",
            "a_kvdtype": "auto",
            "a_ctx": "131072",
            "compare": "0",
        }
    )
    assert not at.exception and not at.error
    expected = plan(MODELS["gpt-oss-20b"], GPUS["h100-80gb"], max_model_len=131_072)
    assert ("Full-length requests", f"{expected.max_concurrency:,}") in metrics(at)
    table = at.dataframe[0].value
    assert list(table["kind"]) == ["sliding_window", "full"]
    assert list(table["blocks per 131,072-token request"]) == [521, 8192]
    captions = " ".join(c.value for c in at.caption)
    assert "Hybrid KV cache manager on: 8,713 blocks" in captions and "off (--disable-hybrid" in captions
    assert any("cdiv(min(128 − 1 + 8,192, 131,072), 16) + 1" in md.value for md in at.markdown)
    at.toggle(key="a_hybrid").set_value(False).run()
    assert not at.exception
    assert any("--disable-hybrid-kv-cache-manager" in code.value for code in at.code)
    assert str(at.query_params["a_hybrid"]).strip("[]'") in ("0", "false", "False")


def test_safetensors_index_in_the_url_gives_exact_weights():
    values, _ = parse_params(
        {"a_model": "gpt-oss-20b", "a_ckpt": "13761264768", "a_ctx": "8192", "a_gpus": "1", "a_tp": "1"},
        ALL_FIELDS,
    )
    result = compute_scenario(values, "a_", None)
    assert result.plan.weights_bytes == 13_761_264_768
    assert any("13,761,264,768 B (safetensors index, exact)" in line for line in formula_lines(result))


def test_hostile_uploads_on_the_page_change_nothing():
    """A bad config.json or safetensors index upload shows the reason; the scenario keeps its config and weights."""
    at = open_planner({"compare": "0", "a_model": "custom"})
    config = preset_configs()["mistral-7b"]["config"]
    at.text_area(key="a_config_text").set_value(json.dumps(config)).run()
    good, text = metrics(at), at.session_state["a_config_text"]
    bad_configs = {
        gzip.compress(json.dumps(config).encode()): "a gzip compressed archive: upload the uncompressed",
        b'{"a":' * 30_000: "nested too deeply",
        b"": "is empty",
        b"\x89PNG\r\n\x1a\n\x00\x00": "binary",
        json.dumps(
            {**config, "num_hidden_layers": -1}
        ).encode(): "'num_hidden_layers' (number of layers) = -1",
        json.dumps({"hidden_size": 4096}).encode(): "lacks the number of",
    }
    for data, reason in bad_configs.items():
        at.file_uploader(key="a_upload").set_value(("config.json", data, "application/json")).run()
        assert not at.exception, at.exception
        errors = [e.value for e in at.error]
        assert any(e.startswith("Upload not used: ") and reason in e for e in errors), (reason, errors)
        assert metrics(at) == good and at.session_state["a_config_text"] == text
    good_index = json.dumps({"metadata": {"total_size": 14_483_464_192}, "weight_map": {}}).encode()
    for data, reason in {
        b"[" * 100_000: "nested too deeply",
        zip_of(good_index): "a zip compressed archive",
    }.items():
        at.file_uploader(key="a_index_upload").set_value(("index.json", data, "application/json")).run()
        assert not at.exception, at.exception
        assert any(e.startswith("Upload not used: ") and reason in e for e in (e.value for e in at.error))
        assert at.session_state["_planner_values"]["a_ckpt"] is None and metrics(at) == good
    at.file_uploader(key="a_index_upload").set_value(("index.json", good_index, "application/json")).run()
    assert not at.exception and at.session_state["_planner_values"]["a_ckpt"] == 14_483_464_192
    assert any("14,483,464,192 B from the uploaded index" in c.value for c in at.caption)


def zip_of(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model.safetensors.index.json", data)
    return buffer.getvalue()


def test_the_presets_are_drawn_on_request_and_the_request_is_in_the_url():
    """Off by default (their table and JSON viewers cost a browser ~0.4 s before the charts appear); `presets=1`
    shows every model and GPU preset and a config template, and the toggle writes it into the URL."""
    at = open_planner({"compare": "0"})
    assert len(at.dataframe) == 0 and len(at.json) == 0 and "presets" not in at.query_params
    at.toggle(key="presets").set_value(True).run()
    assert not at.exception
    models, gpus = (table.value for table in at.dataframe)
    assert len(models) == len(MODELS) and len(gpus) == len(GPUS)
    assert at.query_params["presets"] == "1"
    shared = open_planner({"compare": "0", "presets": "1"})
    assert len(shared.dataframe) == 2 and len(shared.json) == 1


def test_a_host_kv_tier_from_the_url_shows_its_tokens_and_flags():
    """llama-3.1-70b fp8 on 4 x H100 (TP4): 80 layers x 8 KV heads x 128 x 2 x 1 B = 163,840 B a token, a
    16-token block 655,360 B a rank over 4 ranks = 2,621,440 B (page-aligned already); 100 GiB holds
    40,960 blocks = 655,360 tokens, by vLLM's arithmetic."""
    at = open_planner({"a_offload": "100", "compare": "0"})
    assert not at.error and not at.exception
    shown = " ".join(md.value for md in at.markdown)
    assert "655,360 tokens" in shown and "40,960 host blocks" in shown
    assert any("--kv-offloading-size 100 --kv-offloading-backend native" in c.value for c in at.code)
    assert "100" in str(at.query_params["a_offload"])
    bad = open_planner({"a_offload": "nan", "compare": "0"})
    assert any("`a_offload`" in e.value for e in bad.error) and not bad.exception
    assert not any("kv-offloading" in c.value for c in bad.code)  # the default (no tier) is drawn instead


def test_moe_data_parallel_attention_and_expert_parallel_from_the_url():
    """Qwen3-235B-A22B on 8 x H200 as 2 DP ranks of TP 4 with EP: the page draws core's plan (KV per DP rank, 16 of
    128 experts per GPU), the weights formula and `--data-parallel-size 2 --enable-expert-parallel`; both inputs
    live in the URL, and a model change resets them."""
    at = open_planner(
        {
            "a_model": "qwen3-235b-a22b",
            "a_gpu": "h200-141gb",
            "a_gpus": "8",
            "a_tp": "4",
            "a_dp": "2",
            "a_ep": "1",
            "a_kvdtype": "auto",
            "a_ctx": "8192",
            "compare": "0",
        }
    )
    assert not at.exception and not at.error
    expected = plan(
        MODELS["qwen3-235b-a22b"],
        GPUS["h200-141gb"],
        num_gpus=8,
        tensor_parallel=4,
        data_parallel=2,
        expert_parallel=True,
        max_model_len=8192,
    )
    assert ("KV tokens per replica", f"{expected.kv_tokens:,}") in metrics(at)
    assert any("--data-parallel-size 2" in c.value and "--enable-expert-parallel" in c.value for c in at.code)
    shown = " ".join(md.value for md in at.markdown)
    assert "16 of 128 whole experts (expert parallel over 8 GPUs)" in shown
    assert f"× 2 DP ranks = **{expected.max_concurrency_total:,}**" in shown
    assert "2" in str(at.query_params["a_dp"])
    at.selectbox(key="a_model").set_value("llama-3.1-8b").run()
    assert not at.exception
    assert "a_dp" not in at.query_params and "a_ep" not in at.query_params
