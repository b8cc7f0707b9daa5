"""Routers: which replica of a fleet serves each arriving request (`core.serving.fleet` runs the fleet).

A router sees every replica through a `ReplicaView` (its queue, its running batch, its KV usage, the uncached
prompt tokens the router itself sent it that are still in flight, and which leading blocks of a prompt its prefix
cache holds now) and picks one index. The policies, by name (`ROUTING_POLICIES`):

    round-robin   replica k % N for the k-th request: what a plain load balancer (a Kubernetes Service) does.
    random        uniform over the replicas, seeded: the other thing a plain load balancer does.
    least-loaded  the fewest waiting requests, then the lowest KV usage, then the fewest running: queue and KV
                  signals only, blind to what each replica caches (llm-d's "load-only" scorers).
    prefix-aware  llm-d's precise prefix-cache routing: each replica's hit is the longest prefix of the prompt's
                  full blocks its prefix cache holds, read from the replica's own block hashes (what its
                  BlockStored / BlockRemoved events tell a router); the score is uncached tokens in flight +
                  prompt tokens x (1 - hit) and the lowest wins; a replica whose uncached tokens in flight exceed
                  `SATURATION_BATCHES` x max_num_batched_tokens is saturated and skipped (the valve; all
                  saturated: all are candidates); prefix affinity: a candidate holding at least `AFFINITY` of the
                  prompt whose score is within one prompt (prompt_len tokens) of the best wins over any replica
                  holding less. The band keeps a prefix home through the load's ups and downs, yet lets a busy
                  home overflow: a hard affinity made the first replica to cache a single popular prefix take
                  every request for it until the valve (tens of requests past what its KV cache holds) while the
                  others never cached it.
    session       sticky per conversation: a conversation's first request goes round-robin over conversations,
                  every later turn to the same replica.
    approximate-prefix
                  llm-d's approximate prefix-cache routing (its inference scheduler's `prefix-cache-scorer` with
                  the `kv-cache-scorer` and `queue-scorer`, weights 1 : 1 : 1, highest total wins): the router
                  never reads a replica's cache; it remembers, per replica, the prompt blocks it sent there (an
                  LRU of `PrefixHistory.capacity` block keys, refreshed on every send) and guesses that a replica
                  holds what it was sent. The prompt is cut into blocks of `PrefixHistory.block_tokens` tokens, at
                  most `PrefixHistory.max_blocks` of them, behind one key every replica that served anything
                  holds (llm-d's model-name block; a block is known by the prompt's chained key of the KV block
                  holding its last token, and its index: `Router._history_keys`); block j counts for every
                  replica remembering it, scanning blocks in order until one no replica remembers. Score per
                  replica: matched / hashed blocks + (max waiting - its waiting) / (max - min waiting) over the
                  replicas (1 when all are equal) + (1 - its KV usage). A replica that evicted what the router remembers still wins the prefix
                  term and then misses: the guess's weakness, what precise (`prefix-aware`) routing fixes.

Invariants:
- `route` returns an index in [0, N) and changes nothing but the router's own bookkeeping (its counter, its
  random draw, its session table, its per-replica block history); it never writes a replica.
- Deterministic: the same requests and replica states give the same choices (`random` draws from its seed).
- Ties (least-loaded, prefix-aware, approximate-prefix) go round-robin: to the first tied replica at or after
  k % N for the k-th request, so an idle fleet spreads new prefixes instead of piling them on replica 0 (but
  approximate-prefix's model-name block breaks an idle fleet's tie for the replicas that served before, as
  llm-d's does); one replica (N = 1) always gets index 0 under every policy.
- The in-flight tally is the caller's: `ReplicaView.uncached_in_flight` is what `Router.routed` added at routing
  minus what `Router.done` removed when the request finished (`core.serving.fleet` keeps it).
"""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from core.errors import RoutingError

ROUTING_POLICIES = (
    "round-robin",
    "random",
    "least-loaded",
    "prefix-aware",
    "session",
    "approximate-prefix",
)
DEFAULT_ROUTING = "round-robin"
PROMPT_KEYED = ("prefix-aware", "approximate-prefix")  # the policies that read a prompt's block keys
SATURATION_BATCHES = 35  # llm-d's valve: uncached tokens in flight above 35 x max_num_batched_tokens
AFFINITY = 0.8  # llm-d's prefix affinity: a hit of at least 80 % of the prompt keeps the request there


_MODEL_KEY = ("model",)  # llm-d's first hash (the model's name): held by every replica that served anything


@dataclass(frozen=True)
class PrefixHistory:
    """What `approximate-prefix` remembers: llm-d's prefix-cache-scorer settings. The defaults are the plugin's
    defaults and the published "KV-cache wins" run's (hashBlockSize 64 characters, at the plugin's 4 characters
    a token 16 tokens; maxPrefixBlocksToMatch 256, so the first 4,096 tokens; lruCapacityPerServer 31,250 block
    keys a replica, ~500,000 tokens of 16). Raises RoutingError for a non-positive value."""

    block_tokens: int = 16
    max_blocks: int = 256
    capacity: int = 31_250

    def __post_init__(self):
        for name in ("block_tokens", "max_blocks", "capacity"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise RoutingError(
                    f"PrefixHistory.{name} must be a positive integer, got {value!r}", "approximate-prefix"
                )


def check_routing(policy) -> str:
    """`policy` if it names a routing policy, else RoutingError naming the allowed ones."""
    if policy not in ROUTING_POLICIES:
        raise RoutingError(
            f"unknown routing policy {policy!r}; choose one of {', '.join(ROUTING_POLICIES)}", policy
        )
    return policy


class ReplicaView(Protocol):
    """What a router reads of one replica (all counts now, at the arrival being routed)."""

    num_waiting: int  # requests queued, not yet admitted (swapped ones included)
    num_running: int  # requests in the running batch
    kv_usage: float  # fraction of the KV pool requests hold, in [0, 1]
    uncached_in_flight: (
        int  # prompt tokens routed here, not served by its cache, whose request has not finished
    )

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        """How many leading entries of `block_hashes` (a prompt's chained full-block keys) its cache holds."""


class Router:
    """One routing policy over `num_replicas` replicas (module docstring). max_num_batched_tokens sizes the
    prefix-aware valve; seed drives `random`; history: what `approximate-prefix` remembers (None: llm-d's
    defaults, `PrefixHistory()`)."""

    def __init__(
        self,
        policy: str,
        num_replicas: int,
        max_num_batched_tokens: int,
        seed: int = 0,
        history: PrefixHistory | None = None,
    ):
        self.policy = check_routing(policy)
        if type(num_replicas) is not int or num_replicas < 1:
            raise RoutingError(f"a fleet needs at least one replica, got {num_replicas!r}", policy)
        self.num_replicas = num_replicas
        self.saturation = SATURATION_BATCHES * max_num_batched_tokens
        self._count = 0
        self._rng = np.random.default_rng([seed, 0xF1EE7])
        self._sessions: dict = {}
        if history is not None and not isinstance(history, PrefixHistory):
            raise RoutingError(f"history must be a PrefixHistory, got {history!r}", policy)
        self.history = history or PrefixHistory()
        self._remembered = [
            OrderedDict() for _ in range(num_replicas)
        ]  # per replica: block key -> None, LRU first
        self._holders: dict = {}  # block key -> the replicas remembering it

    def route(
        self,
        replicas: Sequence[ReplicaView],
        prompt_len: int,
        block_hashes: Sequence[int],
        block_size: int,
        conversation=None,
    ) -> tuple[int, int]:
        """(chosen replica, prompt tokens its prefix cache holds for this prompt) for a request of `prompt_len`
        tokens whose full blocks (of `block_size` tokens) have the chained keys `block_hashes`; `conversation`:
        the key `session` sticks to (None: a conversation of its own)."""
        n = self.num_replicas
        policy = self.policy
        if policy == "round-robin":
            chosen = self._count % n
        elif policy == "random":
            chosen = int(self._rng.integers(n))
        elif policy == "least-loaded":
            chosen = min(
                range(n),
                key=lambda r: (
                    replicas[r].num_waiting,
                    replicas[r].kv_usage,
                    replicas[r].num_running,
                    self._turn(r),
                ),
            )
        elif policy == "session":
            if conversation is None or conversation not in self._sessions:
                chosen = len(self._sessions) % n
                if conversation is not None:
                    self._sessions[conversation] = chosen
            else:
                chosen = self._sessions[conversation]
        elif policy == "approximate-prefix":
            chosen = self._approximate(replicas, block_hashes, block_size)
        else:
            return self._prefix_aware(replicas, prompt_len, block_hashes, block_size)
        self._count += 1
        return chosen, replicas[chosen].cached_prefix_blocks(block_hashes) * block_size

    def _prefix_aware(self, replicas, prompt_len, block_hashes, block_size) -> tuple[int, int]:
        cached = [min(r.cached_prefix_blocks(block_hashes) * block_size, prompt_len) for r in replicas]
        candidates = [
            r for r in range(self.num_replicas) if replicas[r].uncached_in_flight <= self.saturation
        ]
        if not candidates:
            candidates = list(range(self.num_replicas))
        score = {r: replicas[r].uncached_in_flight + prompt_len - cached[r] for r in candidates}
        band = min(score.values()) + prompt_len
        affine = [r for r in candidates if cached[r] >= AFFINITY * prompt_len and score[r] <= band]
        chosen = min(affine or candidates, key=lambda r: (score[r], self._turn(r)))
        self._count += 1
        return chosen, cached[chosen]

    def _approximate(self, replicas, block_hashes, block_size) -> int:
        keys = self._history_keys(block_hashes, block_size)
        matched = [0] * self.num_replicas
        for key in keys:
            holders = self._holders.get(key)
            if not holders:
                break
            for r in holders:
                matched[r] += 1
        waiting = [rep.num_waiting for rep in replicas]
        low, high = min(waiting), max(waiting)

        def score(r: int) -> float:
            prefix = matched[r] / len(keys) if keys else 0.0
            queue = 1.0 if high == low else (high - waiting[r]) / (high - low)
            return prefix + queue + (1.0 - replicas[r].kv_usage)

        chosen = min(range(self.num_replicas), key=lambda r: (-score(r), self._turn(r)))
        self._remember(chosen, keys)
        return chosen

    def _history_keys(self, block_hashes, block_size) -> list:
        """The router's keys for a prompt: llm-d's model block, then (key, j) for each of its blocks j of
        `PrefixHistory.block_tokens` tokens (at most `max_blocks`), where key is the prompt's chained full-block
        key of the KV block (of `block_size` tokens) holding block j's last token: two prompts share (key, j) iff
        they share every token up to the end of that KV block. Router blocks ending past the last full KV block
        are left out."""
        if not block_hashes:
            return []
        tokens = self.history.block_tokens
        keys: list = [_MODEL_KEY]
        for j in range(self.history.max_blocks):
            k = ((j + 1) * tokens - 1) // block_size
            if k >= len(block_hashes):
                break
            keys.append((block_hashes[k], j))
        return keys

    def _remember(self, replica: int, keys: list) -> None:
        """Add `keys` to `replica`'s LRU in order (a known key moves to the most recent end), evicting the least
        recent past `PrefixHistory.capacity` (llm-d's indexer after the request is scheduled)."""
        lru = self._remembered[replica]
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
                continue
            lru[key] = None
            self._holders.setdefault(key, set()).add(replica)
            if len(lru) > self.history.capacity:
                old, _ = lru.popitem(last=False)
                holders = self._holders[old]
                holders.discard(replica)
                if not holders:
                    del self._holders[old]

    def remembers(self, replica: int) -> int:
        """How many block keys `approximate-prefix` remembers for `replica` now (its LRU's length)."""
        return len(self._remembered[replica])

    def _turn(self, replica: int) -> int:
        """Tie-break rank of `replica` for the current request: 0 for replica k % N, then onwards."""
        return (replica - self._count) % self.num_replicas
