"""core.serve's command line: vLLM's --kv-events-config JSON, the `*` host bound to --host, refusals."""

import json

import pytest

from core.errors import InvalidArgumentError
from core.serve.server import main, parse_kv_events_config


def test_vllms_json_with_defaults_and_star_bound_to_host():
    config = parse_kv_events_config(
        json.dumps({"enable_kv_cache_events": True, "publisher": "zmq"}), "127.0.0.1"
    )
    assert (config.endpoint, config.replay_endpoint, config.topic) == ("tcp://127.0.0.1:5557", None, "")
    config = parse_kv_events_config(
        json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001",
                    "topic": "kv-events", "buffer_steps": 50}), "127.0.0.1",
    )  # fmt: skip
    assert (config.endpoint, config.replay_endpoint, config.topic, config.buffer_steps) == (
        "tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001", "kv-events", 50,
    )  # fmt: skip
    assert parse_kv_events_config(json.dumps({"enable_kv_cache_events": False}), "127.0.0.1") is None
    assert parse_kv_events_config(None, "127.0.0.1") is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"enable_kv_cache_events": true, "publisher": "nats"}', "not supported"),
        ('{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/x"}', "tcp://"),
        ('{"enable_kv_cache_events": true, "hwm": 0}', "positive"),
    ],
)
def test_bad_configs_are_refused(text, match):
    with pytest.raises(InvalidArgumentError, match=match):
        parse_kv_events_config(text, "127.0.0.1")


def test_events_without_prefix_caching_are_refused_before_anything_starts(capsys):
    assert main(["--model", "tiny", "--kv-events-config", '{"enable_kv_cache_events": true}']) == 2
    assert "--enable-prefix-caching" in capsys.readouterr().err
