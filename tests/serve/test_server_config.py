"""core.serve's command line: vLLM's --kv-events-config JSON, the `*` host bound to --host, refusals."""

import json

import pytest

from core.errors import InvalidArgumentError
from core.serve.server import KVEventsConfig, ServeConfig, main, make_parser, parse_kv_events_config


def test_vllms_json_with_defaults_and_star_bound_to_host():
    config = parse_kv_events_config(
        json.dumps({"enable_kv_cache_events": True, "publisher": "zmq"}), "127.0.0.1"
    )
    assert (config.endpoint, config.replay_endpoint, config.topic) == ("tcp://127.0.0.1:5557", None, "")
    config = parse_kv_events_config(
        json.dumps(
            {
                "enable_kv_cache_events": True,
                "endpoint": "tcp://*:6000",
                "replay_endpoint": "tcp://*:6001",
                "topic": "kv-events",
                "buffer_steps": 50,
            }
        ),
        "127.0.0.1",
    )
    assert (config.endpoint, config.replay_endpoint, config.topic, config.buffer_steps) == (
        "tcp://127.0.0.1:6000",
        "tcp://127.0.0.1:6001",
        "kv-events",
        50,
    )
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


def test_every_flag_reaches_the_serve_config():
    """`ServeConfig.from_args`: the one object `build_served` and `build_engine` take, flag by flag."""
    argv = [
        "--model",
        "m.gguf",
        "--served-model-name",
        "x",
        "--host",
        "127.0.0.2",
        "--block-size",
        "8",
        "--num-blocks",
        "99",
        "--max-num-seqs",
        "3",
        "--enable-prefix-caching",
        "--seed",
        "5",
        "--kv-events-config",
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:7000"}',
    ]
    assert ServeConfig.from_args(make_parser().parse_args(argv)) == ServeConfig(
        "m.gguf",
        served_name="x",
        block_size=8,
        num_blocks=99,
        prefix_caching=True,
        seed=5,
        max_num_seqs=3,
        events=KVEventsConfig("tcp://127.0.0.2:7000", None, "", 10_000, 100_000),
    )
    assert (
        ServeConfig.from_args(make_parser().parse_args([])) == ServeConfig()
    )  # the flags' defaults are its own
