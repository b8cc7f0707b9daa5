"""Prefix-cache keys of full blocks, chained like vLLM's `hash_block_tokens` (`vllm/v1/core/kv_cache_utils.py`).

A full block's key is a hash of (its parent block's key, its tokens): equal keys mean equal prefixes up to a
hash collision, which is why the pool also compares the block's tokens and parent key before a hit. Two key
functions, either one usable by the KV core (`KVCacheManager` / `BlockManager` take `block_hasher`):

- `hash_block_tokens` (the default): Python's `hash` of a tuple of ints (None for a first block), which does not
  depend on PYTHONHASHSEED, so keys are stable across processes and runs; they are signed 64-bit ints. Fast,
  and nothing a real vLLM would send.
- `VllmBlockHasher`: vLLM 0.32's `--prefix-caching-hash-algo sha256` (its default) or `sha256_cbor`. A key is
  the 32-byte digest of the serialized (parent digest, block tokens as a tuple, extra keys or None) triple:
  `pickle.dumps(..., protocol=HIGHEST_PROTOCOL)` for sha256, canonical CBOR (RFC 8949 section 4.2.1) for
  sha256_cbor. A first block's parent is NONE_HASH, the digest of the seed string: PYTHONHASHSEED when set,
  else "vllm-none-hash". The pool keys blocks by the full digest, as vLLM does; KV events carry its low 64
  bits as an int (`event_block_hash`, vLLM's `maybe_convert_block_hash` with
  VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default).

`vllm_block_hashes` gives the ints a vLLM's BlockStored events carry for the full blocks of a prompt. Extra keys
(vLLM's `generate_block_hash_extra_keys`): a LoRA adapter adds ("lora", name, path) to every block, a
`cache_salt` adds ("cache_salt", salt) to the first block only (after the LoRA key). Multimodal inputs and
prompt embeddings also change vLLM's keys; they are refused by name (`BlockHashError`), as are the xxhash
algorithms (a random seed per process unless PYTHONHASHSEED is set, and a package the lab does not ship).
"""

import hashlib
import os
import pickle
import struct
from collections.abc import Mapping, Sequence

from core.common import check_int
from core.errors import BlockHashError

BlockKey = tuple  # (parent block hash or None, the block's tokens as a tuple)

VLLM_HASH_ALGOS = ("sha256", "sha256_cbor")  # vLLM's --prefix-caching-hash-algo values reproduced here
DEFAULT_NONE_HASH_SEED = (
    "vllm-none-hash"  # vLLM's seed for the cryptographic algorithms without PYTHONHASHSEED
)
EXTRA_KEY_NAMES = ("cache_salt", "lora_name", "lora_path")
_REFUSED_EXTRA_KEYS = {
    "mm_hashes": "multimodal extra keys",
    "multimodal": "multimodal extra keys",
    "mm": "multimodal extra keys",
    "prompt_embeds": "prompt-embeds extra keys",
}
_MASK64 = (1 << 64) - 1


def hash_block_tokens(parent_block_hash: int | None, tokens: tuple) -> int:
    """The chained key of one full block holding `tokens` after the block whose key is `parent_block_hash`."""
    return hash((parent_block_hash, tokens))


def extend_block_hashes(
    hashes: list, token_ids: Sequence[int], block_size: int, num_blocks: int, hash_fn=hash_block_tokens
) -> None:
    """Append to `hashes` (the keys of the first len(hashes) full blocks of `token_ids`) the keys of the next
    blocks, up to `num_blocks` keys in all, computed by `hash_fn(parent, tokens)`. The caller guarantees
    `num_blocks * block_size <= len(token_ids)`."""
    start = len(hashes)
    if start >= num_blocks:
        return
    parent = hashes[-1] if hashes else None
    window = token_ids[start * block_size : num_blocks * block_size]  # one copy; each block a slice of it
    if type(window) is not tuple:
        window = tuple(window)
    if hash_fn is hash_block_tokens:  # the default key, inlined (the same values): the simulator's hot loop
        for offset in range(0, len(window), block_size):
            parent = hash((parent, window[offset : offset + block_size]))
            hashes.append(parent)
        return
    for offset in range(0, len(window), block_size):
        parent = hash_fn(parent, window[offset : offset + block_size])
        hashes.append(parent)


class PrefixChains:
    """The chained keys of recently hashed prompts, found by their first block's key, so that a prompt that
    starts with another's tokens (a shared system prompt, a conversation's next turn) reuses that prompt's keys
    instead of hashing its blocks again (vLLM computes a request's `block_hashes` once; this also computes a
    shared prefix's chain once). A chain is reused only as far as its tokens equal the prompt's, compared token
    for token, so the keys are exactly those `extend_block_hashes` computes. When a prompt diverges from a
    chain, the chain is cut to their common full blocks (the prefix they share); chains hold at most
    `max_tokens` tokens in all, the least recently used dropped first.

    Only for `hash_block_tokens` (equal ids give equal keys whatever their int type); another key function
    (a `VllmBlockHasher` pickles the ids, so an np.int64 id and an int id of equal value get different keys)
    is hashed block by block."""

    __slots__ = ("_chains", "_tokens", "block_size", "hash_fn", "max_tokens")

    def __init__(self, block_size: int, hash_fn=hash_block_tokens, max_tokens: int = 1 << 20):
        self.block_size = block_size
        self.hash_fn = hash_fn
        self.max_tokens = max_tokens
        self._chains: dict = {}  # first block's key -> [tokens, keys, block keys or None]; LRU order
        self._tokens = 0  # tokens held by the chains

    def keys(self, token_ids: tuple, num_blocks: int) -> list:
        """The chained keys of the first `num_blocks` full blocks of `token_ids` (a tuple of at least
        `num_blocks * block_size` ids): `extend_block_hashes([], token_ids, ...)`'s list."""
        return self.lookup(token_ids, num_blocks)[0]

    def lookup(self, token_ids: tuple, num_blocks: int) -> tuple[list, list]:
        """(`keys(token_ids, num_blocks)`, the (parent key, block tokens) tuples of the leading blocks taken
        from a stored chain, [] when none was): tuples kept with the chain, the same objects every time, which
        the pool may adopt for its cached blocks (`BlockPool.longest_cached_run`'s known_keys)."""
        bs, hash_fn = self.block_size, self.hash_fn
        keys: list = []
        known: list = []
        if num_blocks <= 0:
            return keys, known
        if hash_fn is not hash_block_tokens:
            extend_block_hashes(keys, token_ids, bs, num_blocks, hash_fn)
            return keys, known
        head = hash((None, token_ids[:bs]))
        chains = self._chains
        entry = chains.pop(head, None)
        if entry is not None:
            chain_tokens, chain_keys, block_keys = entry
            common = min(len(chain_keys), num_blocks)
            span = common * bs
            if token_ids[:span] != (chain_tokens if span == len(chain_tokens) else chain_tokens[:span]):
                common = _common_blocks(token_ids, chain_tokens, common, bs)
                self._tokens -= len(chain_tokens) - common * bs
                block_keys = block_keys[:common] if block_keys is not None else None
                entry = [chain_tokens[: common * bs], chain_keys[:common], block_keys]  # the shared prefix
            if common:
                if entry[2] is None:  # built once per chain, on its first reuse
                    ck, ct = entry[1], entry[0]
                    entry[2] = [(ck[i - 1] if i else None, ct[i * bs : (i + 1) * bs]) for i in range(len(ck))]
                keys, known = entry[1][:common], entry[2][:common]
                chains[head] = entry  # the most recently used last
            else:  # the first block's tokens differ (a key collision): this prompt's chain replaces it
                self._tokens -= len(entry[0])
                entry = None
        extend_block_hashes(keys, token_ids, bs, num_blocks, hash_fn)
        if entry is None:
            self._store(head, token_ids[: num_blocks * bs], list(keys))
        return keys, known

    def _store(self, head, tokens: tuple, keys: list) -> None:
        chains = self._chains
        self._tokens += len(tokens)
        chains[head] = [tokens, keys, None]  # the chain's tokens, keys and (later) block keys
        while self._tokens > self.max_tokens and chains:
            oldest = next(iter(chains))
            self._tokens -= len(chains.pop(oldest)[0])


def _common_blocks(token_ids: tuple, chain_tokens: tuple, num_blocks: int, block_size: int) -> int:
    """The most leading full blocks (< num_blocks) on which `token_ids` and `chain_tokens` agree (bisection:
    equal leading blocks stay equal when fewer are compared)."""
    low, high = 0, num_blocks - 1  # low blocks agree; more than high do not
    while low < high:
        mid = (low + high + 1) // 2
        if token_ids[: mid * block_size] == chain_tokens[: mid * block_size]:
            low = mid
        else:
            high = mid - 1
    return low


def event_block_hash(key: int | bytes) -> int:
    """The int a KV event carries for a pool key: a digest's low 64 bits (big-endian), an int key as it is."""
    if isinstance(key, bytes):
        return int.from_bytes(key, "big") & _MASK64
    return key


def none_hash_seed(hash_seed: str | None = None) -> str:
    """The seed of vLLM's NONE_HASH: `hash_seed` when given, else PYTHONHASHSEED when set (vLLM reads it in
    the engine process), else "vllm-none-hash"."""
    if hash_seed is not None:
        return str(hash_seed)
    env = os.environ.get("PYTHONHASHSEED")
    return env if env is not None else DEFAULT_NONE_HASH_SEED


def cbor_canonical(value) -> bytes:
    """Canonical CBOR (RFC 8949 4.2.1: shortest heads, definite lengths) of None, bools, ints below 2**64 in
    magnitude, bytes, str and tuples/lists of those: the subset a block-hash triple holds, encoded as
    `cbor2.dumps(value, canonical=True)` encodes it. Raises BlockHashError for anything else."""
    out = bytearray()
    _cbor(value, out)
    return bytes(out)


def _cbor_head(major: int, n: int, out: bytearray) -> None:
    if n < 24:
        out.append(major << 5 | n)
    elif n < 1 << 8:
        out += struct.pack(">BB", major << 5 | 24, n)
    elif n < 1 << 16:
        out += struct.pack(">BH", major << 5 | 25, n)
    elif n < 1 << 32:
        out += struct.pack(">BI", major << 5 | 26, n)
    else:
        out += struct.pack(">BQ", major << 5 | 27, n)


def _cbor(value, out: bytearray) -> None:
    if value is None:
        out.append(0xF6)
    elif value is True or value is False:
        out.append(0xF5 if value else 0xF4)
    elif isinstance(value, int):
        if not -(1 << 64) <= value < 1 << 64:
            raise BlockHashError(
                "sha256_cbor hashes ints of at most 64 bits here (a bignum needs a CBOR tag); use sha256",
                "cbor bignum",
            )
        _cbor_head(0, value, out) if value >= 0 else _cbor_head(1, -1 - value, out)
    elif isinstance(value, bytes):
        _cbor_head(2, len(value), out)
        out += value
    elif isinstance(value, str):
        data = value.encode("utf-8")
        _cbor_head(3, len(data), out)
        out += data
    elif isinstance(value, tuple | list):
        _cbor_head(4, len(value), out)
        for item in value:
            _cbor(item, out)
    else:
        raise BlockHashError(
            f"sha256_cbor here encodes None, bool, int, bytes, str and tuples of them, not {type(value).__name__}",
            "cbor type",
        )


def _sha256_pickle(value) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(value) -> bytes:
    return hashlib.sha256(cbor_canonical(value)).digest()


def check_hash_algo(hash_algo: str) -> str:
    """`hash_algo` when it is one of VLLM_HASH_ALGOS; BlockHashError naming it otherwise."""
    if hash_algo in VLLM_HASH_ALGOS:
        return hash_algo
    if hash_algo in ("xxhash", "xxhash_cbor"):
        raise BlockHashError(
            f"hash_algo {hash_algo!r} is not reproduced: vLLM seeds it with random bytes per process unless "
            f"PYTHONHASHSEED is set, and it needs a package the lab does not ship; use one of "
            f"{', '.join(VLLM_HASH_ALGOS)}",
            hash_algo,
        )
    shown = hash_algo if isinstance(hash_algo, str) and len(hash_algo) <= 40 else type(hash_algo).__name__
    raise BlockHashError(
        f"unknown hash_algo {shown!r}; vLLM's --prefix-caching-hash-algo values reproduced here: "
        f"{', '.join(VLLM_HASH_ALGOS)}",
        "hash_algo",
    )


def _check_extra_keys(extra_keys: Mapping[str, str | None] | None) -> tuple[tuple | None, tuple | None]:
    """(extra keys of the first block, extra keys of every later block), each None when empty."""
    if extra_keys is None:
        return None, None
    if not isinstance(extra_keys, Mapping):
        raise BlockHashError(
            f"extra_keys must be a mapping with keys among {', '.join(EXTRA_KEY_NAMES)}, "
            f"got {type(extra_keys).__name__}",
            "extra_keys",
        )
    for name in extra_keys:
        if name in _REFUSED_EXTRA_KEYS:
            raise BlockHashError(
                f"{_REFUSED_EXTRA_KEYS[name]} ({name!r}) are not reproduced; supported extra keys: "
                f"{', '.join(EXTRA_KEY_NAMES)}",
                _REFUSED_EXTRA_KEYS[name],
            )
        if name not in EXTRA_KEY_NAMES:
            shown = name if isinstance(name, str) and len(name) <= 40 else type(name).__name__
            raise BlockHashError(
                f"unknown extra key {shown!r}; supported extra keys: {', '.join(EXTRA_KEY_NAMES)}",
                "extra_keys",
            )
        value = extra_keys[name]
        if value is not None and not isinstance(value, str):
            raise BlockHashError(
                f"extra key {name!r} must be a str or None, got {type(value).__name__}", name
            )
    salt = extra_keys.get("cache_salt") or None
    lora_name, lora_path = extra_keys.get("lora_name") or None, extra_keys.get("lora_path") or None
    if (lora_name is None) != (lora_path is None):
        raise BlockHashError(
            "a LoRA adapter's blocks are keyed by its name and its path (vLLM 0.32 hashes both): give "
            "lora_name and lora_path together, or neither",
            "lora_path" if lora_path is None else "lora_name",
        )
    lora = (("lora", lora_name, lora_path),) if lora_name is not None else ()
    first = lora + ((("cache_salt", salt),) if salt is not None else ())
    return first or None, lora or None


class VllmBlockHasher:
    """vLLM's chained block key as a KV-core hash function: `hasher(parent, tokens)` is the 32-byte digest of a
    full block holding `tokens` after the block whose digest is `parent` (None: the prompt's first block).

    hash_algo: "sha256" (vLLM's default) or "sha256_cbor". extra_keys: {"cache_salt": str, "lora_name": str,
    "lora_path": str} (every key optional; LoRA name and path together). hash_seed: NONE_HASH's seed (default:
    PYTHONHASHSEED when set, else "vllm-none-hash"). Raises BlockHashError for anything vLLM would hash that
    this does not reproduce. Picklable; equal hashers compute equal keys."""

    __slots__ = (
        "_digest",
        "_first_extra",
        "_later_extra",
        "extra_keys",
        "hash_algo",
        "hash_seed",
        "none_hash",
    )

    def __init__(
        self,
        hash_algo: str = "sha256",
        *,
        extra_keys: Mapping[str, str | None] | None = None,
        hash_seed: str | None = None,
    ):
        self.hash_algo = check_hash_algo(hash_algo)
        self._first_extra, self._later_extra = _check_extra_keys(extra_keys)
        self.extra_keys = dict(extra_keys) if extra_keys else {}
        self.hash_seed = none_hash_seed(hash_seed)
        self._digest = _sha256_pickle if self.hash_algo == "sha256" else _sha256_cbor
        self.none_hash = self._digest(self.hash_seed)

    def __call__(self, parent: bytes | None, tokens: tuple) -> bytes:
        if parent is None:
            return self._digest((self.none_hash, tokens, self._first_extra))
        return self._digest((parent, tokens, self._later_extra))

    def __getstate__(self):
        return (self.hash_algo, self.extra_keys, self.hash_seed)

    def __setstate__(self, state):
        hash_algo, extra_keys, hash_seed = state
        self.__init__(hash_algo, extra_keys=extra_keys or None, hash_seed=hash_seed)

    def __eq__(self, other) -> bool:
        return isinstance(other, VllmBlockHasher) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash((self.hash_algo, tuple(sorted(self.extra_keys.items())), self.hash_seed))

    def __repr__(self) -> str:
        return f"VllmBlockHasher({self.hash_algo!r}, extra_keys={self.extra_keys!r}, hash_seed={self.hash_seed!r})"


def vllm_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    hash_algo: str = "sha256",
    *,
    extra_keys: Mapping[str, str | None] | None = None,
    hash_seed: str | None = None,
) -> list[int]:
    """The 64-bit ints a vLLM 0.32 server's BlockStored events carry for the full blocks of a prompt of
    `token_ids` at `block_size` (len(token_ids) // block_size of them; a partial last block has no hash).

    hash_algo, extra_keys, hash_seed: as `VllmBlockHasher` (the server's `--prefix-caching-hash-algo`, the
    request's cache_salt / LoRA adapter, the server's PYTHONHASHSEED). Raises BlockHashError for what is not
    reproduced, InvalidArgumentError for a block size below 1 or a token that is not an int."""
    block_size = check_int(block_size, "block_size", minimum=1)
    hasher = VllmBlockHasher(hash_algo, extra_keys=extra_keys, hash_seed=hash_seed)
    tokens = list(token_ids)
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int):
            raise BlockHashError(f"token_ids[{i}] must be an int, got {type(t).__name__}", "token_ids")
    digests: list[bytes] = []
    extend_block_hashes(digests, tokens, block_size, len(tokens) // block_size, hasher)
    return [event_block_hash(d) for d in digests]
