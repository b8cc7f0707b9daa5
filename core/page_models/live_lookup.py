"""The Live page's "Where is my prompt cached": a prompt (text, tokenized by the watched server's own `/tokenize`,
or token ids) looked up in every watched event stream's cached-block tree (`core.live.prompt_lookup`). No
streamlit here.

The answer is one row per server (data-parallel rank of the events endpoint) and pool (KV cache group, medium):
how many of the prompt's leading full blocks are cached, i.e. what a precise prefix-aware router scores that
server by, and one sentence naming the best. The fleet helper's per-replica view shares `lookup_prompt`.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from core.errors import InvalidArgumentError, LabError
from core.live.addresses import MetricsUrl
from core.live.prompt_lookup import CachedPrefix, lookup_prompt, parse_token_ids, tokenize
from core.live.tree import CachedBlockTree

LOOKUP_AS = ("text", "token ids")


@dataclass
class LookupAnswer:
    """What the page shows: `rows` (one per server and pool), `sentence` (the answer in words), `error` (a bad
    input or a server that could not tokenize; nothing else is shown then), `token_ids` of the prompt."""

    rows: list[dict] = field(default_factory=list)
    sentence: str = ""
    error: str = ""
    token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class LookupRequest:
    """The page's inputs: the prompt as typed, how to read it ("text" or "token ids"), the server's hash
    algorithm and NONE_HASH seed, and the request's cache_salt ("" for none)."""

    prompt: str
    read_as: str = "text"
    hash_algo: str = "sha256"
    hash_seed: str = "vllm-none-hash"
    cache_salt: str = ""


def prompt_token_ids(request: LookupRequest, server: MetricsUrl | None) -> list[int]:
    """The prompt's token ids: parsed, or the server's `/tokenize` of the text. Raises LabError."""
    if request.read_as == "token ids":
        return parse_token_ids(request.prompt)
    if server is None:
        raise InvalidArgumentError(
            "text is tokenized by the watched server's /tokenize: give its metrics URL, or give token ids"
        )
    return tokenize(server, request.prompt)


def answer_lookup(
    request: LookupRequest, trees: Mapping[str, CachedBlockTree], server: MetricsUrl | None
) -> LookupAnswer:
    """Tokenize (or parse) the prompt and look it up in `trees` (a server name -> its tree)."""
    answer = LookupAnswer()
    try:
        answer.token_ids = prompt_token_ids(request, server)
        found = lookup_prompt(
            answer.token_ids,
            trees,
            request.hash_algo,
            hash_seed=request.hash_seed or "vllm-none-hash",
            extra_keys={"cache_salt": request.cache_salt} if request.cache_salt else None,
        )
    except LabError as err:
        answer.error = str(err)
        return answer
    answer.rows = [_row(p, len(answer.token_ids)) for p in found]
    answer.sentence = _sentence(found, len(answer.token_ids), bool(trees))
    return answer


def _row(p: CachedPrefix, num_tokens: int) -> dict:
    return {
        "server": p.server,
        "group · medium": f"{p.group} · {p.medium}",
        "block size (tokens)": p.block_size,
        "leading blocks cached": p.cached_blocks,
        "prompt's full blocks": p.num_blocks,
        "cached tokens": p.cached_tokens,
        "cached (% of prompt tokens)": round(100 * p.cached_tokens / num_tokens, 1),
    }


def _sentence(found: Sequence[CachedPrefix], num_tokens: int, watching: bool) -> str:
    if not watching:
        return "No KV events are watched: give the server's KV events endpoint to see where the prompt is cached."
    if not found:
        return "No watched server has announced any cached block yet."
    best = max(found, key=lambda p: p.cached_blocks)
    if best.cached_blocks == 0:
        blocks = max(p.num_blocks for p in found)
        return (
            f"No server caches the prompt's first block ({num_tokens:,} tokens, {blocks:,} full "
            f"block{'' if blocks == 1 else 's'})."
        )
    return (
        f"{best.server} ({best.medium}, group {best.group}) caches the first {best.cached_blocks:,} of the "
        f"prompt's {best.num_blocks:,} full blocks: {best.cached_tokens:,} of its {num_tokens:,} tokens need no "
        "prefill there."
    )
