"""Requests entering the engine: prompts turned into `SequenceGroup`s, and the thread-safe inbox they wait in.

Threading rule (see `Engine`): any thread may add or abort requests; they go into the `RequestInbox` under its
lock and only the thread running `Engine.step` moves them into the scheduler, at the start of a step. So the
scheduler, the KV cache manager and the KV cache are only ever touched by the stepping thread.
"""

import itertools
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from core.engine.sampling import SamplingParams
from core.engine.sequence import Sequence, SequenceGroup
from core.engine.token_ids import CheckedTokenIds, check_token_ids
from core.errors import InvalidArgumentError


def prompt_ids(prompt, tokenizer, vocab_size: int) -> tuple[CheckedTokenIds, str | None]:
    """(token ids, text or None) of a prompt given as text (needs a tokenizer) or as token ids, checked once
    (`check_token_ids`; the tokenizer's ids too): a `CheckedTokenIds` of this vocabulary, already checked at
    another edge (the server's), is taken as it is. Raises InvalidArgumentError (TokenIdsError for bad ids)."""
    if isinstance(prompt, CheckedTokenIds) and prompt.vocab_size == vocab_size:
        return prompt, None
    if isinstance(prompt, str):
        if tokenizer is None:
            raise InvalidArgumentError("this model has no tokenizer: give prompts as lists of token ids")
        ids = list(tokenizer(prompt)["input_ids"])
        if not ids:
            raise InvalidArgumentError("a prompt needs at least one token; this text has none")
        return check_token_ids(ids, vocab_size), prompt
    return check_token_ids(prompt, vocab_size), None


def prompts_and_params(prompts, params) -> tuple[list, list[SamplingParams]]:
    """`generate`'s arguments as two lists of equal length: the prompts (one prompt alone, text or token ids, is
    a list of one) and one SamplingParams per prompt (`params` for all, default 16 tokens at temperature 1.0, or
    a list with one per prompt). Raises InvalidArgumentError for no prompt or a count of params that differs."""
    if isinstance(prompts, str) or (isinstance(prompts, Seq) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if len(prompts) == 0:
        raise InvalidArgumentError("generate needs at least one prompt")
    params = params or SamplingParams(max_tokens=16)
    per_prompt = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise InvalidArgumentError(f"{len(per_prompt)} SamplingParams given for {len(prompts)} prompts")
    return prompts, per_prompt


def make_group(
    request_id,
    prompt,
    params: SamplingParams,
    *,
    tokenizer,
    vocab_size: int,
    max_num_seqs: int,
    new_seq_id: Callable[[], int],
    seed_offset: int = 0,
    return_logits: bool = False,
    stream: bool = False,
) -> SequenceGroup:
    """A waiting group for one request: one sequence (n samples are forked at admission; beams grow from one).

    A seeded request gets its own generator seeded with `params.seed + seed_offset`, so its samples do not depend
    on what else runs. Raises InvalidArgumentError for bad params or prompts."""
    if not isinstance(params, SamplingParams):
        raise InvalidArgumentError(f"params must be SamplingParams, got {type(params).__name__}")
    if params.num_sequences > max_num_seqs:
        raise InvalidArgumentError(
            f"{params.num_sequences} sequences per request exceed max_num_seqs ({max_num_seqs})"
        )
    ids, text = prompt_ids(prompt, tokenizer, vocab_size)
    generator = None if params.seed is None else torch.Generator().manual_seed(params.seed + seed_offset)
    samples = 1 if params.use_beam_search else params.n
    seqs = [
        Sequence(new_seq_id(), list(ids), len(ids), logits=[] if return_logits else None)
        for _ in range(samples)
    ]
    return SequenceGroup(request_id, params, list(ids), seqs, generator, prompt=text, stream=stream)


class RequestInbox:
    """Requests added or aborted by any thread, waiting for the stepping thread; and the ids of every unfinished
    request (in the inbox or in the scheduler).

    Invariant: `unfinished` holds exactly the requests added and neither finished nor aborted; an id is unique
    among them. All methods take the lock; none calls out while holding it.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[tuple[str, object]] = []  # ("add", group) or ("abort", request_id), in call order
        self._unfinished: dict = {}  # request_id -> group
        self._auto_ids = itertools.count()

    def new_request_id(self) -> int:
        """The smallest counter value not naming an unfinished request."""
        with self._lock:
            while True:
                candidate = next(self._auto_ids)
                if candidate not in self._unfinished:
                    return candidate

    def add(self, group: SequenceGroup) -> None:
        with self._lock:
            if group.request_id in self._unfinished:
                raise InvalidArgumentError(
                    f"request id {group.request_id!r} is already in use by an unfinished request"
                )
            self._unfinished[group.request_id] = group
            self._events.append(("add", group))

    def abort(self, request_id) -> bool:
        """Queue the abort of an unfinished request; False (nothing queued) when no such request is unfinished."""
        with self._lock:
            if request_id not in self._unfinished:
                return False
            del self._unfinished[request_id]
            self._events.append(("abort", request_id))
            return True

    def drain(self) -> list[tuple[str, object]]:
        """Take every queued event, in call order (the stepping thread applies them)."""
        with self._lock:
            events, self._events = self._events, []
            return events

    def finished(self, request_ids) -> None:
        with self._lock:
            for request_id in request_ids:
                self._unfinished.pop(request_id, None)

    def unfinished_ids(self) -> list:
        with self._lock:
            return list(self._unfinished)

    def has_unfinished(self) -> bool:
        """True while a request is unfinished or an event (an abort) waits to be applied by a step."""
        with self._lock:
            return bool(self._unfinished or self._events)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
            self._unfinished.clear()
