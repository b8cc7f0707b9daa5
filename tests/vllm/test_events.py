"""vLLM's KV cache events (a running vLLM 0.32, its CPU build) against the lab: a binding KVEventSubscriber hears
the vLLM that connects its PUB socket to it (its endpoint names 127.0.0.1); every block hash vLLM announces is
`vllm_block_hashes` of the prompt; the Live tree holds every block vLLM announced and none it removed, through
eviction (the replay buffer read raw is the independent record); the prompt lookup finds a prompt sent before,
tokenized by vLLM's own /tokenize, and vLLM's /detokenize gives the tree's labels."""

import time

import zmq

from core.kv.block_hash import vllm_block_hashes
from core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_event_batch
from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.prompt_lookup import PrefixLabels, detokenize, lookup_prompt, tokenize
from core.live.subscriber import KVEventSubscriber

LOOPBACK = Limits(live_hosts="127.0.0.1")


def subscribe(vllm) -> KVEventSubscriber:
    return KVEventSubscriber(
        check_events_endpoint(vllm.events_endpoint, LOOPBACK),
        topic=vllm.topic,
        replay_endpoint=check_events_endpoint(vllm.replay_endpoint, LOOPBACK),
        bind=True,
    )


def hear_pub(vllm, sub: KVEventSubscriber, timeout_s: float = 120) -> None:
    """Send one-block prompts until a batch arrives on the PUB socket itself (vLLM's connection to our bound
    socket, and our subscription over it, are in place)."""
    start, deadline = 40_000, time.monotonic() + timeout_s  # ids below the vocabulary (49,152)
    while sub.stats.received == 0:
        assert time.monotonic() < deadline, f"nothing on the PUB socket: {sub.stats}"
        vllm.complete(list(range(start, start + vllm.block_size + 1)))
        start += vllm.block_size + 1
        sub.poll(0.5)


def drain(sub: KVEventSubscriber, settle_s: float = 1.0) -> None:
    """Apply batches until none has come for `settle_s` (vLLM publishes after each engine step)."""
    quiet = time.monotonic() + settle_s
    while time.monotonic() < quiet:
        if sub.poll(0.2):
            quiet = time.monotonic() + settle_s


def replay_record(vllm) -> list:
    """Every event vLLM's replay ROUTER still buffers, in order, read with a bare DEALER socket."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(vllm.replay_endpoint)
    try:
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
        events = []
        while sock.poll(5000):
            frames = [f for f in sock.recv_multipart() if f != b""] or [b""]
            seq = int.from_bytes(frames[0], "big", signed=True)
            if seq == -1 or len(frames) < 2:
                return events
            events.extend(decode_event_batch(frames[-1]).events)
        raise AssertionError("the replay did not finish")
    finally:
        sock.close(0)
        ctx.term()


def test_binding_subscriber_hears_vllm_and_the_hashes_are_vllm_block_hashes(real_vllm):
    sub = subscribe(real_vllm)
    try:
        hear_pub(real_vllm, sub)
        bs = real_vllm.block_size
        prompts = [
            list(range(100, 100 + 3 * bs + 5)),
            [*range(100, 100 + 2 * bs), *range(9000, 9000 + 2 * bs)],
        ]
        for prompt in prompts:
            real_vllm.complete(prompt, max_tokens=2)
        drain(sub)
        announced = {
            h for e in replay_record(real_vllm) if isinstance(e, BlockStored) for h in e.block_hashes
        }
        for prompt in prompts:
            expected = vllm_block_hashes(prompt, bs)
            assert len(expected) == len(prompt) // bs and set(expected) <= announced
            assert [sub.tree.block((0, "GPU"), h) is not None for h in expected] == [True] * len(expected)
            first = sub.tree.block((0, "GPU"), expected[0])
            assert first.parent_hash is None and list(first.token_ids) == prompt[:bs]
        assert sub.stats.received > 0 and sub.stats.lost == 0 and not sub.pub_silent
    finally:
        sub.close()


def test_the_tree_holds_every_block_vllm_announced_and_none_it_removed(real_vllm):
    """Prompts of distinct text past the pool's 64 blocks evict cached blocks; the tree, fed by the PUB socket,
    equals the fold of the replay's record (stored minus removed, cleared on a reset)."""
    sub = subscribe(real_vllm)
    try:
        hear_pub(real_vllm, sub)
        bs, blocks = real_vllm.block_size, real_vllm.num_gpu_blocks_override
        for i in range(blocks // 12 + 2):  # 12 full blocks each: 84 > 64, the pool overflows
            real_vllm.complete([30_000 + i, *range(1000 * i, 1000 * i + 12 * bs)])
        drain(sub, 2.0)
        cached: set[int] = set()
        removed = 0
        for event in replay_record(real_vllm):
            if isinstance(event, BlockStored):
                cached |= set(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                cached -= set(event.block_hashes)
                removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                cached.clear()
        tree = {h for pool in sub.tree.pools() for h in sub.tree.blocks(pool)}
        assert removed > 0 and tree == cached and len(tree) <= blocks
        assert sub.stats.lost == 0 and sub.tree.unknown_removals == 0
    finally:
        sub.close()


def test_lookup_finds_a_prompt_sent_before_and_labels_come_from_detokenize(real_vllm):
    from core.live.addresses import check_metrics_url

    server = check_metrics_url(real_vllm.url + "/metrics", LOOPBACK)
    text = (
        "PagedAttention stores the key and value cache of every sequence in fixed-size blocks, so memory is "
        "allocated on demand and shared between requests with a common prefix. "
    ) * 3
    ids = tokenize(server, text)
    assert ids == real_vllm.post("/tokenize", {"model": real_vllm.model, "prompt": text})["tokens"]
    sub = subscribe(real_vllm)
    try:
        hear_pub(real_vllm, sub)
        real_vllm.complete(text, max_tokens=1)
        drain(sub)
        (found,) = lookup_prompt(ids, {"vllm": sub.tree})
        assert found.num_blocks == len(ids) // real_vllm.block_size >= 2
        assert found.cached_blocks == found.num_blocks and found.medium == "GPU"
        (other,) = lookup_prompt([*ids[:5], 7, *ids[6:]], {"vllm": sub.tree})
        assert other.cached_blocks == 0  # one token changed in the first block: nothing is shared
        first = sub.tree.block((0, "GPU"), vllm_block_hashes(ids, real_vllm.block_size)[0])
        labels = PrefixLabels()
        assert labels.fetch([first], lambda t: detokenize(server, t)) == 1
        assert text.startswith(labels.texts[first.block_hash].strip()[:40])
    finally:
        sub.close()
