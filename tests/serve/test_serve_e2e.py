"""End to end: `python -m core.serve --model tiny` on loopback, completions over HTTP, /metrics read with our own
parser, BlockStored events received on ZMQ rebuilding a tree equal to what the engine cached. The server is stopped
by the fixture. The expected cache is derived independently: every full block of the tokens each sequence wrote
(prompt + all generated tokens but the last, which is sampled and never fed back). Hash values are the server
process's own (Python 3.11 hashes None by address), so blocks are compared by the token prefix each one ends:
the chain of parents from a root must spell exactly the prefixes the sequences wrote."""

import time

import pytest

from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.metrics import parse_vllm_metrics
from core.live.subscriber import KVEventSubscriber
from core.serve.launcher import LoopbackServer

BS = 16
PREFIX = list(range(1, 33))  # two full blocks shared by every prompt
PROMPTS = [[*PREFIX, 100 + i, 200 + i] for i in range(3)]


@pytest.fixture(scope="module")
def server():
    s = LoopbackServer("tiny", num_blocks=128, extra_args=("--block-size", str(BS)))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def subscriber(server):
    limits = Limits(live_hosts="127.0.0.1")  # loopback, any port: the test's own servers
    sub = KVEventSubscriber(
        check_events_endpoint(f"tcp://127.0.0.1:{server.events_port}", limits),
        replay_endpoint=check_events_endpoint(f"tcp://127.0.0.1:{server.replay_port}", limits),
    )
    time.sleep(0.5)  # the subscription reaches the publisher
    yield sub
    sub.close()


def expected_prefixes(sequences: list[list[int]]) -> set[tuple[int, ...]]:
    """Every token prefix ending at a full block boundary of a written sequence."""
    return {tuple(tokens[: (i + 1) * BS]) for tokens in sequences for i in range(len(tokens) // BS)}


def tree_prefixes(blocks) -> set[tuple[int, ...]]:
    """The token prefix each cached block ends, following parent hashes to a root (None)."""
    out = set()
    for block in blocks.values():
        chain, node = [], block
        while node is not None:
            chain.append(node.token_ids)
            node = blocks.get(node.parent_hash) if node.parent_hash is not None else None
        out.add(tuple(t for piece in reversed(chain) for t in piece))
    return out


def test_completions_metrics_and_events(server, subscriber):
    written = []
    completion_tokens = 0
    for prompt in PROMPTS:  # one after another: the 2nd and 3rd hit the cached prefix
        status, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 20, "temperature": 0})
        assert status == 200, body
        (choice,) = body["choices"]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 20
        assert body["usage"] == {
            "prompt_tokens": 34,
            "completion_tokens": 20,
            "total_tokens": 54,
            "prompt_tokens_details": None,
        }
        written.append(prompt + choice["token_ids"][:-1])
        completion_tokens += 20
    status, text = server.get("/metrics")
    m = parse_vllm_metrics(text.decode())
    assert m.engines == ("0",) and m.model_names == ("tiny",)
    assert (m.num_gpu_blocks, m.block_size) == (128, BS)
    assert m.prompt_tokens == 3 * 34 and m.generation_tokens == completion_tokens
    assert (
        m.prefix_cache_queries == 3 * 34 and m.prefix_cache_hits == 2 * 32
    )  # 2 cached blocks per later prompt
    assert m.ttft.count == 3 and m.itl.count == 3 * 19 and m.e2e.count == 3
    assert m.num_requests_running == 0 and m.request_success == 3
    expected = expected_prefixes(written)  # 2 shared prefix blocks + 1 per sequence: 128 blocks evict nothing
    deadline = time.monotonic() + 10
    while subscriber.tree.num_blocks() < len(expected) and time.monotonic() < deadline:
        subscriber.poll(0.2)
    blocks = subscriber.tree.blocks((0, "GPU"))
    assert len(blocks) == len(expected) == 5
    assert all(b.parent_hash is None or b.parent_hash in blocks for b in blocks.values())  # no orphans
    assert tree_prefixes(blocks) == expected
    assert subscriber.stats.lost == 0 and subscriber.stats.bad_messages == 0
    top = subscriber.tree.most_shared((0, "GPU"), 1)[0]
    assert top.block.token_ids == tuple(PREFIX[:BS]) and top.leaves == 3  # the shared prefix's first block


def test_streaming_chunks_and_usage(server):
    status, chunks = server.post(
        "/v1/completions",
        {
            "prompt": [5, 6, 7],
            "max_tokens": 4,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200 and chunks[-1] == "[DONE]"
    by_index = {0: [], 1: []}
    finish = {}
    for c in chunks[:-2]:
        (choice,) = c["choices"]
        assert c["object"] == "text_completion"
        by_index[choice["index"]] += choice["token_ids"]
        if choice["finish_reason"]:
            finish[choice["index"]] = choice["finish_reason"]
    assert [len(v) for v in by_index.values()] == [4, 4] and finish == {0: "length", 1: "length"}
    assert chunks[-2]["usage"]["completion_tokens"] == 8 and chunks[-2]["choices"] == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json", None),
        ([1, 2], None),
        ({"prompt": "text needs a tokenizer", "max_tokens": 3}, "prompt"),
        ({"prompt": [], "max_tokens": 3}, "prompt"),
        ({"prompt": [1, 2**40], "max_tokens": 3}, "prompt[1]"),
        ({"prompt": [1, 2], "max_tokens": 0}, None),
        ({"prompt": [1, 2], "max_tokens": "many"}, "max_tokens"),
        ({"prompt": [1, 2], "temperature": -1}, None),
        ({"prompt": [1, 2], "top_p": 0}, None),
        ({"prompt": [1, 2], "n": 0}, None),
        ({"prompt": [1, 2], "stop": ["\n"]}, "stop"),
        ({"prompt": [1, 2], "max_tokens": 10**6}, "max_tokens"),  # past the 512-token context
        ({"prompt": [1, 2], "max_tokens": 500, "n": 8}, "prompt"),  # 8 x 32 blocks can never fit 128
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),  # chat on a model without a template
    ],
)
def test_bad_requests_are_openai_400s(server, body, param):
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    status, answer = server.post(path, body)
    assert status == 400, answer
    assert answer["error"]["code"] == 400 and answer["error"]["type"] == "BadRequestError"
    assert answer["error"]["message"] and (param is None or answer["error"]["param"] == param)


def test_other_model_name_is_404_and_models_health(server):
    status, answer = server.post("/v1/completions", {"model": "gpt-4", "prompt": [1], "max_tokens": 1})
    assert status == 404 and "gpt-4" in answer["error"]["message"]
    assert server.get("/health")[0] == 200
    import json

    models = json.loads(server.get("/v1/models")[1])
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 512
