"""Workloads whose prompts share tokens: G distinct shared prefixes (a system prompt, a few-shot header, a
document asked about many times) and multi-turn chats, as requests that carry their token ids
(`Request.conversation`, read by `core.serving.sim_groups.stream_token_ids`), so the simulator's prefix cache
(the paged policy with prefix caching: `core.kv`'s chained block hashes, LRU eviction of free cached blocks)
decides what hits.

A *conversation* is one client's token stream: its prefix (`shared_prefix_len` tokens of prefix g, g drawn
uniformly from `num_prefixes` or with Zipf weights 1 / k^a, k = 1..G), then its own tokens, turn after turn:

    turn 1 prompt = prefix + user_1                        output_1
    turn t prompt = turn t-1 prompt + output_{t-1} + user_t output_t          (the conversation so far)

user_t and output_t are each conversation's own tokens (their lengths drawn per turn). Conversations start as
a Poisson process of rate / turns per second, so requests arrive at `rate` per second in steady state; turn t + 1
arrives `turn_gap_s` seconds after turn t arrived (a client's read-and-type time; the arrival does not wait for
the answer: a turn that arrives before its previous one finished hits only what the cache holds by then). With
one turn the arrivals and lengths are exactly those of `fixed` / `uniform` with the same seed, each request its
own conversation.
"""

import math
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from core.serving.workload import Request


def prefix_weights(num_prefixes: int, zipf: float | None) -> np.ndarray:
    """Probability of each prefix 0..G-1: uniform (zipf None) or proportional to 1 / (k + 1)^zipf."""
    if zipf is None:
        return np.full(num_prefixes, 1.0 / num_prefixes)
    weights = 1.0 / np.arange(1, num_prefixes + 1, dtype=np.float64) ** zipf
    return weights / weights.sum()


def _prefix_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, 0x5EED])  # apart from the arrivals' and lengths' draw


class SharedPrefixes(NamedTuple):
    """`count` distinct prefixes of `length` tokens each (none when length is 0), one drawn per conversation
    from `prefix_weights(count, zipf)`."""

    length: int
    count: int = 1
    zipf: float | None = None


class Turns(NamedTuple):
    """A conversation's turns: `count` of them, each arriving `gap_s` seconds after the previous one arrived,
    with a new user message and an output whose lengths are drawn uniformly from the inclusive token ranges."""

    count: int
    gap_s: float
    user_range: tuple[int, int]
    output_range: tuple[int, int]


def share_prefixes(requests: list[Request], prefixes: SharedPrefixes, seed: int) -> list[Request]:
    """One-turn requests, each its own conversation, their first `prefixes.length` prompt tokens those of a
    prefix drawn from `prefix_weights` (no prefix when the length is 0). Lengths and arrivals unchanged."""
    shared_prefix_len, num_prefixes, zipf = prefixes
    rng = _prefix_rng(seed)
    groups = rng.choice(num_prefixes, size=len(requests), p=prefix_weights(num_prefixes, zipf))
    out = []
    for req, group in zip(requests, groups, strict=True):
        shared = shared_prefix_len > 0
        out.append(
            replace(
                req,
                prefix_group=int(group) if shared else None,
                prefix_len=shared_prefix_len if shared else 0,
                conversation=req.request_id,
            )
        )
    return out


def conversations(count: int, rate: float, chat: Turns, prefixes: SharedPrefixes, seed: int) -> list[Request]:
    """The first `count` requests (by arrival) of multi-turn conversations (module docstring) whose turns are
    `chat` and whose prefixes are `prefixes`. rate = inf (a closed loop, which ignores arrival times but keeps
    their order): a conversation starts every chat.gap_s / chat.count seconds."""
    turns, turn_gap_s, user_range, output_range = chat
    shared_prefix_len, num_prefixes, zipf = prefixes
    rng = np.random.default_rng(seed)
    conv_rate = rate / turns
    span = (turns - 1) * turn_gap_s
    # enough conversations that the first `count` turn arrivals are all among theirs
    num_conv = math.ceil(count / turns) + math.ceil(min(conv_rate, turns / turn_gap_s) * span) + turns
    if math.isinf(rate):  # a closed loop sends them in this order: a conversation starts every gap / turns
        starts = np.arange(num_conv) * (turn_gap_s / turns)
    else:
        starts = np.cumsum(rng.exponential(1.0 / conv_rate, num_conv))
    users = rng.integers(user_range[0], user_range[1] + 1, size=(num_conv, turns))
    outputs = rng.integers(output_range[0], output_range[1] + 1, size=(num_conv, turns))
    groups = _prefix_rng(seed).choice(num_prefixes, size=num_conv, p=prefix_weights(num_prefixes, zipf))
    rows = []  # (arrival, conversation, turn, prompt_len, output_len)
    for c in range(num_conv):
        prompt = shared_prefix_len
        for t in range(turns):
            prompt += int(users[c, t]) + (int(outputs[c, t - 1]) if t else 0)
            rows.append((float(starts[c] + t * turn_gap_s), c, t, prompt, int(outputs[c, t])))
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    shared = shared_prefix_len > 0
    requests = []
    for i, (arrival, c, _, prompt, output) in enumerate(rows[:count]):
        group = int(groups[c]) if shared else None
        requests.append(Request(i, arrival, prompt, output, 1, group, shared_prefix_len, conversation=c))
    return requests
