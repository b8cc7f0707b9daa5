"""Property: the KV-event decoder, given real msgpack frames mutated at random (bytes flipped, inserted, deleted,
the frame cut or spliced with another; or a value anywhere inside the batch replaced by any msgpack value), either
raises KVEventDecodeError or returns a well-typed batch that re-encodes to itself; and the subscriber fed such a
frame never raises, leaves its cached-block tree exactly as it was when the frame is bad, applies exactly the
decoded batch when it is good, and goes on applying the next good frame.

Seeds: batches the engine's own KV cache manager queued while serving real requests (core.kv, vLLM's current map
format), the same events in the older positional format, and a batch sent as a map."""

import copy
import functools

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.engine import Engine, SamplingParams
from core.engine.config import TINY_LLAMA
from core.errors import KVEventDecodeError
from core.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_event_batch,
    encode_event_batch,
)
from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.subscriber import KVEventSubscriber
from core.serve.launcher import free_port

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MSGPACK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@functools.cache
def seeds() -> tuple[bytes, ...]:
    """Frames from a real run: the tiny engine with prefix caching and events, two prompts sharing a prefix and
    a pool small enough that a third evicts (BlockRemoved), then a cache reset (AllBlocksCleared)."""
    engine = Engine.from_config(
        TINY_LLAMA,
        num_blocks=12,
        block_size=4,
        device="cpu",
        warmup=False,
        enable_prefix_caching=True,
        enable_kv_cache_events=True,
    )
    batches = []
    for prompt in ([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 20], list(range(30, 62))):
        engine.generate([prompt], SamplingParams(4, temperature=0.0, ignore_eos=True))
        batches.append(engine.manager.take_events())
    engine.manager.reset_prefix_cache()
    batches.append(engine.manager.take_events())
    assert {type(e) for b in batches for e in b} == {BlockStored, BlockRemoved, AllBlocksCleared}
    frames = [encode_event_batch(b, 1.7e9 + i, i % 2 or None) for i, b in enumerate(batches) if b]
    positional = [[type(e).__name__, *[getattr(e, f) for f in e.__struct_fields__]] for e in batches[0]]
    frames.append(msgspec.msgpack.encode([1.7e9, positional]))
    frames.append(msgspec.msgpack.encode({"ts": 1.7e9, "events": [], "data_parallel_rank": 0}))
    return tuple(frames)


def _paths(value, path=()):
    yield path
    if isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))


@st.composite
def mutated_frame(draw) -> bytes:
    frames = seeds()
    data = draw(st.sampled_from(frames))
    if draw(st.booleans()):  # a value somewhere inside replaced: well-formed msgpack, wrong content
        tree = msgspec.msgpack.decode(data)
        path = draw(st.sampled_from(list(_paths(tree))))
        new = draw(MSGPACK)
        if not path:
            return msgspec.msgpack.encode(new)
        node = tree
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = new
        return msgspec.msgpack.encode(tree)
    raw = bytearray(data)
    for op in draw(
        st.lists(st.sampled_from(["flip", "insert", "delete", "cut", "splice"]), min_size=1, max_size=3)
    ):
        i = draw(st.integers(0, len(raw)))
        if op == "flip" and i < len(raw):
            raw[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            raw[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del raw[i : i + draw(st.integers(1, 8))]
        elif op == "cut":
            del raw[i:]
        elif op == "splice":
            other = draw(st.sampled_from(frames))
            raw[i:] = other[draw(st.integers(0, len(other))) :]
    return bytes(raw)


def _well_typed(batch: KVEventBatch) -> None:
    assert type(batch.ts) is float and (
        batch.data_parallel_rank is None or type(batch.data_parallel_rank) is int
    )
    for e in batch.events:
        assert type(e) in (BlockStored, BlockRemoved, AllBlocksCleared)
        if isinstance(e, BlockStored | BlockRemoved):
            assert all(type(h) in (int, bytes) for h in e.block_hashes)
        if isinstance(e, BlockStored):
            assert type(e.block_size) is int and e.block_size >= 1
            assert all(type(t) is int for t in e.token_ids)
    again = decode_event_batch(encode_event_batch(batch.events, batch.ts, batch.data_parallel_rank))
    assert again == batch


@FUZZ
@given(payload=mutated_frame())
def test_the_decoder_gives_a_clear_error_or_a_valid_batch(payload):
    try:
        batch = decode_event_batch(payload)
    except KVEventDecodeError as err:
        assert str(err)
        return
    _well_typed(batch)


@pytest.fixture(scope="module")
def endpoint():
    return check_events_endpoint(f"tcp://127.0.0.1:{free_port()}", Limits(live_hosts="127.0.0.1"))


def _state(tree) -> tuple[dict, set]:
    """Every cached block per pool, and every (pool, parent, child) link: the whole tree, comparable."""
    blocks = {pool: tree.blocks(pool) for pool in tree.pools()}
    links = {
        (pool, parent, child)
        for pool, bs in blocks.items()
        for parent in [None, *bs]
        for child in tree.children(pool, parent)
    }
    return blocks, links


@FUZZ
@given(payload=mutated_frame(), frames=st.integers(1, 3))
def test_a_bad_frame_leaves_the_tree_unchanged_and_the_subscriber_working(endpoint, payload, frames):
    sub = KVEventSubscriber(endpoint)
    try:
        history = seeds()[:frames]
        for seq, good in enumerate(history):
            sub.on_message([b"kv-events", seq.to_bytes(8, "big"), good])
        before, reference = _state(sub.tree), copy.deepcopy(sub.tree)
        bad_before = sub.stats.bad_messages
        seq = len(history)
        sub.on_message([b"kv-events", seq.to_bytes(8, "big"), payload])  # never raises
        try:
            reference.apply_batch(decode_event_batch(payload))
            assert _state(sub.tree) == _state(reference) and sub.stats.bad_messages == bad_before
        except KVEventDecodeError:
            assert _state(sub.tree) == before and sub.stats.bad_messages == bad_before + 1
        assert sub.stats.last_seq == seq and sub.stats.lost == 0
        stored = BlockStored([10**6 + seq], None, [7] * 4, 4, None, "GPU", None)
        sub.on_message([b"kv-events", (seq + 1).to_bytes(8, "big"), encode_event_batch([stored], 0.0)])
        assert 10**6 + seq in sub.tree.blocks((0, "GPU"))  # the next good frame is applied
    finally:
        sub.close()


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"kv-events"],
        [b"t", b"\x00" * 7, b"x"],
        [b"t", b"\x00" * 9, b"x"],
        [b"t", b"\x00" * 8, b"x", b"y"],
    ],
)
def test_a_message_of_the_wrong_shape_changes_nothing(endpoint, frames):
    sub = KVEventSubscriber(endpoint)
    try:
        sub.on_message([b"kv-events", (0).to_bytes(8, "big"), seeds()[0]])
        before = _state(sub.tree)
        sub.on_message(frames)
        assert _state(sub.tree) == before and sub.stats.bad_messages == 1 and sub.stats.last_seq == 0
    finally:
        sub.close()


def test_a_bad_frame_that_looks_like_a_restart_does_not_clear_the_tree(endpoint):
    """A seq lower than one already seen means the publisher restarted, and the tree is cleared: but only when the
    frame itself is good. A garbage frame with a low seq is counted and ignored."""
    sub = KVEventSubscriber(endpoint)
    try:
        for seq, good in enumerate(seeds()[:2]):
            sub.on_message([b"kv-events", seq.to_bytes(8, "big"), good])
        before = _state(sub.tree)
        assert before[0]
        sub.on_message([b"kv-events", (0).to_bytes(8, "big"), b"\xc1garbage"])
        assert _state(sub.tree) == before and sub.stats.restarts == 0 and sub.stats.last_seq == 1
        sub.on_message([b"kv-events", (0).to_bytes(8, "big"), encode_event_batch([], 0.0)])  # a real restart
        assert sub.stats.restarts == 1 and sub.tree.num_blocks() == 0
    finally:
        sub.close()
