"""/v1/models as vLLM answers it (vllm/entrypoints/openai/models/serving.py: a ModelCard per served model with
`root` the path it loaded and `max_model_len`), and the config.json read from a local model folder."""

import json

import pytest

from core.errors import MetricsFormatError
from core.limits import Limits
from core.live.addresses import check_metrics_url
from core.live.served_model import (
    MAX_CONFIG_BYTES,
    ServedModel,
    is_loopback,
    local_hf_config,
    models_url,
    parse_models,
)

VLLM_BODY = {  # vLLM 0.32's answer for `vllm serve /models/smollm2-hf --served-model-name smollm2`
    "object": "list",
    "data": [
        {
            "id": "smollm2",
            "object": "model",
            "created": 1765000000,
            "owned_by": "vllm",
            "root": "/models/smollm2-hf",
            "parent": None,
            "max_model_len": 2048,
            "permission": [{"id": "modelperm-1", "object": "model_permission"}],
        }
    ],
}


def test_parse_vllm_models():
    assert parse_models(json.dumps(VLLM_BODY)) == (ServedModel("smollm2", "/models/smollm2-hf", 2048),)
    bare = {"data": [{"id": "m", "root": "", "max_model_len": True}]}  # no root, a bool is not a length
    assert parse_models(json.dumps(bare)) == (ServedModel("m", None, None),)
    for bad in ("not json", "[]", '{"data": [{"root": "/x"}]}'):
        with pytest.raises(MetricsFormatError):
            parse_models(bad)


def test_models_url_keeps_the_checked_host():
    url = check_metrics_url("http://127.0.0.1:8000/metrics?x=1", Limits())
    models = models_url(url)
    assert models.url == "http://127.0.0.1:8000/v1/models"
    assert (models.host, models.port, models.policy) == (url.host, url.port, url.policy)


def test_local_config_only_from_this_machine(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert local_hf_config(str(tmp_path), "127.0.0.1") == {"model_type": "llama"}
    assert local_hf_config(str(tmp_path), "[::1]") == {"model_type": "llama"}
    assert local_hf_config(str(tmp_path), "localhost") == {"model_type": "llama"}
    assert local_hf_config(str(tmp_path), "10.0.0.5") is None  # another machine's path means nothing here
    assert local_hf_config(str(tmp_path / "missing"), "127.0.0.1") is None
    # a repository's name: nothing is downloaded
    assert local_hf_config("HuggingFaceTB/SmolLM2-135M-Instruct", "127.0.0.1") is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert local_hf_config(str(tmp_path), "127.0.0.1") is None
    (tmp_path / "config.json").write_text(" " * (MAX_CONFIG_BYTES + 1) + "{}")
    assert local_hf_config(str(tmp_path), "127.0.0.1") is None
    assert is_loopback("127.0.0.2") and not is_loopback("lab.example")
