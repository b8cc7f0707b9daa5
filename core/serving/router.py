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

Invariants:
- `route` returns an index in [0, N) and changes nothing but the router's own bookkeeping (its counter, its
  random draw, its session table); it never writes a replica.
- Deterministic: the same requests and replica states give the same choices (`random` draws from its seed).
- Ties (least-loaded, prefix-aware) go round-robin: to the first tied replica at or after k % N for the k-th
  request, so an idle fleet spreads new prefixes instead of piling them on replica 0; one replica (N = 1) always
  gets index 0 under every policy.
- The in-flight tally is the caller's: `ReplicaView.uncached_in_flight` is what `Router.routed` added at routing
  minus what `Router.done` removed when the request finished (`core.serving.fleet` keeps it).
"""

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from core.errors import RoutingError

ROUTING_POLICIES = ("round-robin", "random", "least-loaded", "prefix-aware", "session")
DEFAULT_ROUTING = "round-robin"
SATURATION_BATCHES = 35  # llm-d's valve: uncached tokens in flight above 35 x max_num_batched_tokens
AFFINITY = 0.8  # llm-d's prefix affinity: a hit of at least 80 % of the prompt keeps the request there


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
    prefix-aware valve; seed drives `random`."""

    def __init__(self, policy: str, num_replicas: int, max_num_batched_tokens: int, seed: int = 0):
        self.policy = check_routing(policy)
        if type(num_replicas) is not int or num_replicas < 1:
            raise RoutingError(f"a fleet needs at least one replica, got {num_replicas!r}", policy)
        self.num_replicas = num_replicas
        self.saturation = SATURATION_BATCHES * max_num_batched_tokens
        self._count = 0
        self._rng = np.random.default_rng([seed, 0xF1EE7])
        self._sessions: dict = {}

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

    def _turn(self, replica: int) -> int:
        """Tie-break rank of `replica` for the current request: 0 for replica k % N, then onwards."""
        return (replica - self._count) % self.num_replicas
