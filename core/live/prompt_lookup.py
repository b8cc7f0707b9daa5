"""Where is my prompt cached: a prompt's vLLM block hashes looked up in the cached-block trees a Live page built
from servers' KV cache events, and the server's own tokenizer over HTTP (vLLM's `/tokenize`, `/detokenize`).

For each server (event stream) and pool (KV cache group, medium), `lookup_prompt` counts how many of the prompt's
leading full blocks are cached there: the longest run of its block hashes, from the first, that the server
announced (BlockStored) and has not removed. That count is what a precise prefix-aware router scores a replica
by (a request's cached prefix is reused only up to its first missing block). The hashes are vLLM's
(`core.kv.block_hash.vllm_block_hashes`) at each pool's block size, read off the blocks its events carried, so
the server's `--prefix-caching-hash-algo` and NONE_HASH seed must be the ones given (vLLM's defaults: sha256,
"vllm-none-hash" unless the server runs with PYTHONHASHSEED set).

`PrefixLabels` keeps the first words of cached blocks (the server's `/detokenize` of the tokens its events
carry), fetched once per block hash (a hash fixes its tokens) and at most a few per call, for the tree's labels.
"""

import dataclasses
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from core.errors import InvalidArgumentError, LabError, LiveEndpointError
from core.kv.block_hash import DEFAULT_NONE_HASH_SEED, VllmBlockHasher, vllm_block_hashes
from core.live.addresses import MetricsUrl
from core.live.fetch import post_json
from core.live.tree import CachedBlockTree, Pool

MAX_LOOKUP_TOKENS = 1_000_000


@dataclass(frozen=True)
class CachedPrefix:
    """One server's pool: `cached_blocks` of the prompt's `num_blocks` full blocks of `block_size` tokens are
    cached, counted from the first and stopping at the first missing one."""

    server: str
    group: int
    medium: str
    block_size: int
    cached_blocks: int
    num_blocks: int

    @property
    def cached_tokens(self) -> int:
        return self.cached_blocks * self.block_size


def pool_block_size(tree: CachedBlockTree, pool: Pool) -> int | None:
    """The block size of a pool's cached blocks (the tokens one block carries), None when it holds none."""
    for block in tree.blocks(pool).values():
        return len(block.token_ids)
    return None


def leading_cached_blocks(tree: CachedBlockTree, pool: Pool, hashes: Sequence) -> int:
    """How many of `hashes` (a prompt's chained block hashes, in order) are cached in `pool`, from the first."""
    count = 0
    for block_hash in hashes:
        if tree.block(pool, block_hash) is None:
            break
        count += 1
    return count


def lookup_prompt(
    token_ids: Sequence[int],
    trees: Mapping[str, CachedBlockTree],
    hash_algo: str = "sha256",
    *,
    hash_seed: str = DEFAULT_NONE_HASH_SEED,
    extra_keys: Mapping[str, str | None] | None = None,
) -> list[CachedPrefix]:
    """Per server (`trees`: a name -> its cached-block tree) and pool holding blocks, the prompt's leading cached
    blocks (`CachedPrefix`), servers in the given order, pools sorted. hash_algo / hash_seed / extra_keys: the
    server's algorithm and NONE_HASH seed and the request's cache_salt / LoRA keys (`vllm_block_hashes`).
    Raises InvalidArgumentError (BlockHashError) for a prompt or arguments that cannot be hashed."""
    tokens = list(token_ids)
    if not tokens or len(tokens) > MAX_LOOKUP_TOKENS:
        raise InvalidArgumentError(
            f"a prompt to look up has 1 to {MAX_LOOKUP_TOKENS:,} tokens, got {len(tokens):,}"
        )
    VllmBlockHasher(hash_algo, extra_keys=extra_keys, hash_seed=hash_seed)  # refused before any lookup
    by_size: dict[int, list[int]] = {}
    out = []
    for server, tree in trees.items():
        for pool in tree.pools():
            size = pool_block_size(tree, pool)
            if size is None:
                continue
            if size not in by_size:
                by_size[size] = vllm_block_hashes(
                    tokens, size, hash_algo, extra_keys=extra_keys, hash_seed=hash_seed
                )
            hashes = by_size[size]
            cached = leading_cached_blocks(tree, pool, hashes)
            out.append(CachedPrefix(server, pool[0], pool[1], size, cached, len(hashes)))
    return out


def parse_token_ids(text: str) -> list[int]:
    """Token ids typed as integers separated by commas or spaces (brackets allowed). Raises
    InvalidArgumentError naming the first thing that is not a non-negative integer."""
    words = [w for w in text.replace(",", " ").replace("[", " ").replace("]", " ").split() if w]
    ids = []
    for i, word in enumerate(words):
        if not word.isdigit() or len(word) > 19:
            shown = word if len(word) <= 20 else word[:17] + "..."
            raise InvalidArgumentError(f"token id {i + 1} ({shown!r}) is not a non-negative integer")
        ids.append(int(word))
    if not ids:
        raise InvalidArgumentError("no token ids given: integers separated by commas or spaces")
    return ids


def server_endpoint(metrics: MetricsUrl, path: str) -> MetricsUrl:
    """The server's `path` (e.g. "/tokenize") on the host and port of its metrics URL, checked as that was."""
    parts = urllib.parse.urlsplit(metrics.url)
    return dataclasses.replace(
        metrics, url=urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    )


def tokenize(metrics: MetricsUrl, text: str, timeout_s: float = 5.0) -> list[int]:
    """The token ids the server's own tokenizer gives `text` as a completion prompt (vLLM's POST /tokenize).
    Raises LiveEndpointError when the server cannot be asked or answers something else."""
    where = server_endpoint(metrics, "/tokenize")
    answer = post_json(where, {"prompt": text}, timeout_s)
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise LiveEndpointError(f"{where.url}: the answer has no token list", "not-http")
    return tokens


def detokenize(metrics: MetricsUrl, token_ids: Sequence[int], timeout_s: float = 3.0) -> str:
    """The server's text for `token_ids` (vLLM's POST /detokenize). Raises LiveEndpointError."""
    where = server_endpoint(metrics, "/detokenize")
    answer = post_json(where, {"tokens": [int(t) for t in token_ids]}, timeout_s)
    text = answer.get("prompt") if isinstance(answer, dict) else None
    if not isinstance(text, str):
        raise LiveEndpointError(f"{where.url}: the answer has no prompt text", "not-http")
    return text


def first_words(text: str, words: int = 5, max_chars: int = 32) -> str:
    """The first `words` words of `text` on one line, at most `max_chars` characters, "…" when cut."""
    parts = text.split()
    shown = " ".join(parts[:words])
    if len(shown) > max_chars:
        shown = shown[: max_chars - 1].rstrip()
    return shown + ("…" if shown != " ".join(parts) else "")


class PrefixLabels:
    """Block hash -> the server's text of the block's tokens, fetched by `detokenize` at most `per_call` new
    blocks per `fetch`; a failure is remembered in `error` and stops that call (the labels fall back to hashes)."""

    def __init__(self, per_call: int = 48):
        self.texts: dict = {}
        self.per_call = per_call
        self.error = ""

    def fetch(self, blocks: Sequence, detokenize_fn: Callable[[Sequence[int]], str]) -> int:
        """Fetch the text of `blocks` (CachedBlock) not known yet, in order, up to `per_call`; returns how many."""
        fetched = 0
        for block in blocks:
            if block.block_hash in self.texts:
                continue
            if fetched >= self.per_call:
                break
            try:
                self.texts[block.block_hash] = detokenize_fn(block.token_ids)
            except LabError as err:
                self.error = str(err)
                break
            fetched += 1
        return fetched
