"""One request of `KVCacheManager`: the tokens it has room for, its computed count, per-group block tables and
chained block keys (vLLM's `request.block_hashes`), all its own; and the token-id check of the KV core's public
entry points."""

from collections.abc import Hashable, Sequence

import numpy as np

from core.errors import InvalidArgumentError
from core.kv.single_type_manager import RequestBlocks


class KVRequest:
    """One request, owning its state (one mode: the manager appends every token to `token_ids` itself):
    `token_ids`, the tokens it has room for (`num_tokens == len(token_ids)`, kept as a field for the hot
    paths), the computed count, one `RequestBlocks` per group, and `block_hashes`, the chained keys of its
    leading full blocks per block size, computed once as blocks fill."""

    __slots__ = ("block_hashes", "blocks", "num_computed", "num_tokens", "token_ids")

    def __init__(
        self, token_ids: list[int], num_computed: int, blocks: tuple, block_hashes: dict[int, list[int]]
    ):
        self.token_ids = token_ids
        self.num_tokens = len(token_ids)
        self.num_computed = num_computed
        self.blocks: tuple[RequestBlocks, ...] = blocks  # one per group
        self.block_hashes = block_hashes  # block size -> chained keys of the leading full blocks


def check_kv_token_ids(request_id: Hashable, token_ids: Sequence[int]) -> list[int]:
    """`token_ids` as a non-empty list of integers, else InvalidArgumentError naming the request: the KV core's
    own guard for every caller that hands it tokens (the engine, the block manager, the simulator). It knows no
    vocabulary; a request's ids are checked against one once, at the engine's or the server's edge
    (`core.engine.token_ids.check_token_ids`)."""
    tokens = list(token_ids)
    # the common case, in C: every id's type is int (no bool); counting types beats a set of them 2 to 1
    if tokens and list(map(type, tokens)).count(int) == len(tokens):
        return tokens
    if not tokens:
        raise InvalidArgumentError(f"request {request_id!r}: a prompt needs at least 1 token, got 0")
    if not all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in tokens):
        raise InvalidArgumentError(f"request {request_id!r}: token ids must be integers")
    return tokens
