"""KV cache events against vLLM's wire format, written out by hand: a batch is the msgpack array
`[ts, events, data_parallel_rank]`; an event is a map tagged by "type" (current vLLM) or, from older vLLM, a
positional array `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name, ...]`. Expected payloads are built from plain lists and dicts, never from the code under test."""

import pickle

import msgspec
import pytest

from core.errors import KVEventDecodeError, LabError
from core.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_event_batch,
    encode_event_batch,
)

STORED_MAP = {
    "type": "BlockStored",
    "block_hashes": [11, 22],
    "parent_block_hash": None,
    "token_ids": [1, 2, 3, 4],
    "block_size": 2,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
    "group_idx": 1,
    "kv_cache_spec_kind": "sliding_window",
    "kv_cache_spec_sliding_window": 6,
}
REMOVED_MAP = {"type": "BlockRemoved", "block_hashes": [22], "medium": "GPU", "group_idx": 1}
CLEARED_MAP = {"type": "AllBlocksCleared"}

STORED = BlockStored(
    block_hashes=[11, 22],
    parent_block_hash=None,
    token_ids=[1, 2, 3, 4],
    block_size=2,
    lora_id=None,
    medium="GPU",
    lora_name=None,
    group_idx=1,
    kv_cache_spec_kind="sliding_window",
    kv_cache_spec_sliding_window=6,
)
REMOVED = BlockRemoved(block_hashes=[22], medium="GPU", group_idx=1)


def test_encode_writes_the_current_format():
    payload = encode_event_batch([STORED, REMOVED, AllBlocksCleared()], ts=12.5, data_parallel_rank=2)
    assert msgspec.msgpack.decode(payload) == [12.5, [STORED_MAP, REMOVED_MAP, CLEARED_MAP], 2]


def test_encode_omits_unset_optional_fields_but_keeps_the_seven_always_sent():
    stored = BlockStored(
        block_hashes=[7],
        parent_block_hash=5,
        token_ids=[9, 9],
        block_size=2,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    raw = msgspec.msgpack.decode(
        encode_event_batch([stored, BlockRemoved(block_hashes=[5], medium=None)], 0.0)
    )
    assert raw[0] == 0.0 and raw[2] is None  # an unset rank is nil (msgspec writes array-like defaults)
    assert raw[1][0] == {
        "type": "BlockStored",
        "block_hashes": [7],
        "parent_block_hash": 5,
        "token_ids": [9, 9],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    assert raw[1][1] == {"type": "BlockRemoved", "block_hashes": [5], "medium": None}


def test_decode_current_format_built_by_hand():
    payload = msgspec.msgpack.encode([3.25, [STORED_MAP, REMOVED_MAP, CLEARED_MAP], 0])
    batch = decode_event_batch(payload)
    assert batch == KVEventBatch(ts=3.25, events=[STORED, REMOVED, AllBlocksCleared()], data_parallel_rank=0)


def test_decode_older_positional_format():
    legacy = [
        "BlockStored",
        [11, 22],
        None,
        [1, 2, 3, 4],
        2,
        None,
        "GPU",
        None,
        None,
        1,
        "sliding_window",
        6,
    ]
    payload = msgspec.msgpack.encode([3.25, [legacy, ["BlockRemoved", [22], "GPU", 1], ["AllBlocksCleared"]]])
    batch = decode_event_batch(payload)
    assert batch.ts == 3.25 and batch.data_parallel_rank is None
    assert batch.events == [STORED, REMOVED, AllBlocksCleared()]


def test_decode_oldest_positional_format_without_medium_or_lora_name():
    payload = msgspec.msgpack.encode([1, [["BlockStored", [5], 4, [7, 8], 2, None], ["BlockRemoved", [5]]]])
    stored, removed = decode_event_batch(payload).events
    assert stored == BlockStored(
        block_hashes=[5],
        parent_block_hash=4,
        token_ids=[7, 8],
        block_size=2,
        lora_id=None,
        medium=None,
        lora_name=None,
    )
    assert removed == BlockRemoved(block_hashes=[5], medium=None)


def test_unknown_fields_are_ignored_in_both_formats():
    future_map = {**STORED_MAP, "cache_salt": "tenant-a", "some_new_field": [1, 2]}
    future_positional = ["BlockRemoved", [22], "GPU", 1, "an unknown trailing field", 42]
    payload = msgspec.msgpack.encode([1.0, [future_map, future_positional], 0, "unknown batch field"])
    assert decode_event_batch(payload).events == [STORED, REMOVED]


def test_bytes_hashes_and_chained_parent_round_trip():
    stored = BlockStored(
        block_hashes=[b"\x01" * 32, b"\x02" * 32],
        parent_block_hash=b"\x00" * 32,
        token_ids=[1, 2, 3, 4],
        block_size=2,
        lora_id=3,
        medium="CPU",
        lora_name="adapter",
        session_id="s1",
        extra_keys=[None, None],
    )
    events = [stored, BlockRemoved(block_hashes=[2**64 - 1], medium="GPU"), AllBlocksCleared()]
    batch = decode_event_batch(encode_event_batch(events, ts=99.0, data_parallel_rank=7))
    assert batch == KVEventBatch(ts=99.0, events=events, data_parallel_rank=7)


def test_a_batch_sent_as_a_map_is_read_too():
    payload = msgspec.msgpack.encode({"ts": 2.0, "events": [CLEARED_MAP]})
    assert decode_event_batch(payload) == KVEventBatch(ts=2.0, events=[AllBlocksCleared()])


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # a byte msgpack never uses
        b"not msgpack at all",
        msgspec.msgpack.encode(1.0),
        msgspec.msgpack.encode([1.0]),
        msgspec.msgpack.encode(["now", []]),
        msgspec.msgpack.encode([True, []]),
        msgspec.msgpack.encode([1.0, {"type": "AllBlocksCleared"}]),
        msgspec.msgpack.encode([1.0, [], "rank zero"]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockEvicted", "block_hashes": [1]}]]),
        msgspec.msgpack.encode([1.0, [{"block_hashes": [1]}]]),
        msgspec.msgpack.encode([1.0, [["NoSuchEvent", [1]]]]),
        msgspec.msgpack.encode([1.0, [[]]]),
        msgspec.msgpack.encode([1.0, [42]]),
        msgspec.msgpack.encode([1.0, [{**STORED_MAP, "block_hashes": "abc"}]]),
        msgspec.msgpack.encode([1.0, [{**STORED_MAP, "token_ids": [1.5]}]]),
        msgspec.msgpack.encode([1.0, [{k: v for k, v in STORED_MAP.items() if k != "token_ids"}]]),
        msgspec.msgpack.encode([1.0, [{**REMOVED_MAP, "block_hashes": [None]}]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1, 2], "two"]]]),
    ],
)
def test_garbage_is_refused_with_a_typed_error(payload):
    with pytest.raises(KVEventDecodeError) as info:
        decode_event_batch(payload)
    assert isinstance(info.value, LabError) and str(info.value)


def test_decode_error_survives_pickling():
    with pytest.raises(KVEventDecodeError) as info:
        decode_event_batch(b"\xc1")
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is KVEventDecodeError and str(copy) == str(info.value)
