"""core.serve as vLLM's stand-in for the Live page's prompt lookup: /tokenize and /detokenize in vLLM's shapes
(the ids a completion of the same text is charged for; text back from ids), and KV events whose block hashes are
vLLM's (`vllm_block_hashes`, itself checked against vLLM's code in tests/kv/test_block_hash.py) over a real ZMQ
socket, the PUB socket connecting to a binding subscriber when the endpoint names a host, as vLLM does."""

import json
import time

from core.kv.block_hash import vllm_block_hashes
from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.prompt_lookup import lookup_prompt
from core.live.subscriber import KVEventSubscriber
from core.serve.launcher import free_port
from core.serve.server import parse_kv_events_config
from tests.serve.inproc import InProcessServer

TEXT = "The paged KV cache keeps each sequence's keys and values in fixed-size blocks."


def test_tokenize_detokenize_real_model(real_server):
    status, body = real_server.post("/tokenize", {"prompt": TEXT, "return_token_strs": True})
    assert status == 200 and set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) > 5
    status, done = real_server.post("/v1/completions", {"prompt": TEXT, "max_tokens": 1})
    assert status == 200 and done["usage"]["prompt_tokens"] == body["count"]
    status, back = real_server.post("/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and back == {"prompt": TEXT}
    status, err = real_server.post("/tokenize", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 400 and err["error"]["param"] == "messages"
    status, err = real_server.post("/detokenize", {"tokens": [1, -1]})
    assert status == 400 and err["error"]["param"] == "tokens[1]"


def test_core_serve_publishes_vllms_hashes_to_a_binding_subscriber():
    port = free_port()
    config = parse_kv_events_config(
        json.dumps(
            {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv-events"}
        ),
        "127.0.0.1",
    )
    assert not config.bind  # a named host: core.serve connects, as vLLM does
    limits = Limits(live_hosts="127.0.0.1")
    sub = KVEventSubscriber(check_events_endpoint(f"tcp://127.0.0.1:{port}", limits), bind=True)
    server = InProcessServer("tiny", num_blocks=64, prefix_caching=True, events=config)
    try:
        status, err = server.post("/tokenize", {"prompt": "hi"})
        assert status == 400 and "no tokenizer" in err["error"]["message"]
        warm, deadline = 200, time.monotonic() + 60
        while (
            sub.stats.applied == 0 and time.monotonic() < deadline
        ):  # until the subscription reached the PUB
            server.post("/v1/completions", {"prompt": list(range(warm, warm + 16)), "max_tokens": 1})
            warm += 16  # a new block each time: a prefix-cache hit is not announced again
            sub.poll(0.2)
        prompts = [list(range(1, 41)), [*range(1, 33), 99, 98, 97, 96, 95, 94, 93, 92, 91]]
        for prompt in prompts:
            status, _ = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 1})
            assert status == 200
        expected = {h for p in prompts for h in vllm_block_hashes(p, 16)}
        stored: list[int] = []
        while time.monotonic() < deadline and not expected <= set(stored):
            sub.poll(0.2)
            stored = [h for p in sub.tree.pools() for h in sub.tree.blocks(p)]
        assert expected <= set(stored), (sorted(expected), sorted(stored))
        first = sub.tree.block((0, "GPU"), vllm_block_hashes(prompts[0], 16)[0])
        assert first.parent_hash is None and first.token_ids == tuple(range(1, 17))
        (found,) = lookup_prompt([*range(1, 33), 99, 98, 97, 96, 95, 94, 93, 92, 91, 5], {"tiny": sub.tree})
        assert (found.cached_blocks, found.num_blocks) == (2, 2)
    finally:
        server.stop()
        sub.close()
