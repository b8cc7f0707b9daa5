"""KV cache events in vLLM's wire format (`vllm/distributed/kv_events.py`): what a block pool publishes when
full blocks enter its prefix cache, when a cached block is evicted, and when the cache is reset.

Wire format (msgpack, as msgspec encodes vLLM's structs):
- A batch is an ARRAY `[ts, events, data_parallel_rank]`, the rank nil when unset (msgspec writes an
  array-like struct's defaults too); senders from before the rank field send `[ts, events]`.
- An event, in vLLM's current format, is a MAP tagged by `"type"` ("BlockStored" | "BlockRemoved" |
  "AllBlocksCleared") with the fields by name; optional fields are omitted when unset (None).
- Before mid-2026 vLLM sent every event as a positional ARRAY: `["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx,
  kv_cache_spec_kind, kv_cache_spec_sliding_window]`, `["BlockRemoved", block_hashes, medium, group_idx]`,
  `["AllBlocksCleared"]`, trailing unset fields dropped.

`encode_event_batch` writes the current format; `decode_event_batch` reads both (and a batch sent as a map),
ignores fields it does not know, fills the nullable fields an older sender left out with None, and raises
`KVEventDecodeError` on anything else (not msgpack, not a batch, an unknown event type, a field of the wrong
type, a BlockStored whose block_size is below 1). Error messages name the field and the type or size of what
was there, never its content. Block hashes are ints or bytes (vLLM's `ExternalBlockHash`); no event carries
block ids, ref counts or request ids.

When each event fires (the pool in `core.kv.block_pool` follows this):
- BlockStored: newly full blocks entered the prefix cache. `block_hashes` chain: the first block's parent is
  `parent_block_hash` (None for a prompt's first block), each later block's parent is the block before it;
  `token_ids` are the tokens of all the blocks in order (`block_size` x len(block_hashes)).
- BlockRemoved: cached blocks were evicted because their slots are reused. Freeing a request removes nothing.
- AllBlocksCleared: the prefix cache was reset.
"""

import re
from typing import Any

import msgspec

from core.errors import KVEventDecodeError

MEDIUM_GPU = "GPU"  # the `medium` of the device KV cache ("CPU" / "STORAGE" for offloaded tiers)
MEDIUM_CPU = "CPU"  # the `medium` of the host-memory tier (`core.kv.host_tier`, vLLM's native offloading)

BlockHash = int | bytes


class KVCacheEvent(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Base of the three events: encoded as a map whose `"type"` is the class name."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the prefix cache. The seven fields without a default are always sent (None
    included); the rest are omitted when None."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: Any = None
    ownership: Any = None
    session_id: Any = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted (their slots reused). `group_idx` is omitted when None."""

    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    """The prefix cache was reset: every cached hash is gone."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One published batch: `ts` (seconds since the epoch, float), the events in order, and the data-parallel
    rank of the engine that sent them (None: unset)."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


# Field order of the older all-positional encoding (after the tag), per event type.
_POSITIONAL_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
# Nullable fields without a default: an older sender (before `medium`, `lora_name`) leaves them out.
_NULLABLE_REQUIRED = {
    "BlockStored": ("lora_id", "medium", "lora_name"),
    "BlockRemoved": ("medium",),
    "AllBlocksCleared": (),
}


def encode_event_batch(events: list[KVEvent], ts: float, data_parallel_rank: int | None = None) -> bytes:
    """The msgpack bytes vLLM publishes for `events` at time `ts` (the third ZMQ frame after topic and
    sequence number): `[ts, [event maps...], data_parallel_rank]`, the rank nil when None."""
    return msgspec.msgpack.encode(
        KVEventBatch(ts=float(ts), events=list(events), data_parallel_rank=data_parallel_rank)
    )


def decode_event_batch(payload: bytes) -> KVEventBatch:
    """The batch in `payload`, in the current (map events) or the older (positional events) format.

    Returns a `KVEventBatch` whose events are `BlockStored` / `BlockRemoved` / `AllBlocksCleared`; unknown
    fields are dropped. Raises `KVEventDecodeError` when the payload is not such a batch.
    """
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, TypeError, ValueError, RecursionError):
        raise KVEventDecodeError(f"KV event payload is not msgpack ({_describe(payload)})") from None
    if isinstance(raw, dict):  # tolerated: a batch struct sent by name
        fields = (raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank"))
    elif isinstance(raw, list) and len(raw) >= 2:
        fields = (raw[0], raw[1], raw[2] if len(raw) > 2 else None)
    else:
        raise KVEventDecodeError(
            f"a KV event batch is an array [ts, events] or [ts, events, data_parallel_rank], got {_describe(raw)}"
        )
    ts, events, rank = fields
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KVEventDecodeError(f"batch ts must be a number, got {_describe(ts)}")
    if not isinstance(events, list):
        raise KVEventDecodeError(f"batch events must be an array, got {_describe(events)}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise KVEventDecodeError(f"batch data_parallel_rank must be an int or absent, got {_describe(rank)}")
    decoded = [_decode_event(event, index) for index, event in enumerate(events)]
    return KVEventBatch(ts=float(ts), events=decoded, data_parallel_rank=rank)


def _decode_event(raw: object, index: int) -> KVEvent:
    """One event from its map (current) or positional array (older) form."""
    if isinstance(raw, dict):
        tag, by_name = raw.get("type"), raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        names = _POSITIONAL_FIELDS.get(tag, ()) if isinstance(tag, str) else ()
        by_name = dict(zip(names, raw[1:], strict=False))  # trailing unknown positions are ignored
    else:
        raise KVEventDecodeError(f"event {index} must be a map or a tagged array, got {_describe(raw)}")
    if not isinstance(tag, str) or tag not in _POSITIONAL_FIELDS:
        allowed = ", ".join(_POSITIONAL_FIELDS)
        shown = repr(tag) if isinstance(tag, str) and re.fullmatch(r"[A-Za-z]{1,40}", tag) else _describe(tag)
        raise KVEventDecodeError(f"event {index} has type {shown}; known types: {allowed}")
    fields = dict.fromkeys(_NULLABLE_REQUIRED[tag])
    fields.update(by_name)
    fields["type"] = tag
    try:
        event = msgspec.convert(fields, KVEvent, strict=True)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:  # msgspec names the field, not its value
        raise KVEventDecodeError(f"event {index} ({tag}) is malformed: {exc}") from None
    if isinstance(event, BlockStored) and event.block_size < 1:
        raise KVEventDecodeError(
            f"event {index} (BlockStored) has block_size {event.block_size}; it must be >= 1"
        )
    return event


def _describe(value: object) -> str:
    """The type and size of a wire value, never its content (the message may be shown to anyone)."""
    kind = {bytes: "binary", str: "str", list: "array", dict: "map", bool: "bool", type(None): "nil"}.get(
        type(value), type(value).__name__
    )
    size = f" of {len(value):,}" if isinstance(value, bytes | str | list | dict) else ""
    unit = {bytes: " bytes", str: " characters", list: " items", dict: " entries"}.get(type(value), "")
    return f"{kind}{size}{unit}"
