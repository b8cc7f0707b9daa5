"""The simulator's request groups: `SimulatedGroup` (a request and its parallel samples, as the scheduler's
`SequenceGroup`), the stand-in token ids its prompt gets (`prompt_token_ids`, so prefix caching hits exactly a
shared system prompt) and `make_groups` (one group per request, in arrival order; `GroupMaker` continues it
over later requests)."""

import math

from core.serving.workload import Request

PREFIX_STREAM_BASE = 3 << 40  # prefix g's token j: PREFIX_STREAM_BASE + g x 2^23 + j
CONVERSATION_STREAM_BASE = 1 << 50  # conversation c's own token j: CONVERSATION_STREAM_BASE + c x 2^27 + j


def stream_token_ids(
    req: Request, prefix_index: int | None, start: int, stop: int, prefix_tokens: list[int] | None = None
) -> list[int]:
    """Tokens [start, stop) of the token stream of `req.conversation` (not None): the `req.prefix_len` tokens of
    prefix `prefix_index` (dense index of its prefix group; none when None), then the conversation's own tokens
    numbered from 0. Every request of one conversation reads the same stream, so a later turn's prompt repeats
    the earlier turns' prompts and outputs token for token, and requests of one prefix group share its prefix.
    prefix_tokens: the prefix's `req.prefix_len` ids (`prefix_stream`), shared by the requests of its group so
    that their prompts hold the same id objects (the KV core then compares a shared prefix by identity)."""
    plen = req.prefix_len if prefix_index is not None else 0
    own = CONVERSATION_STREAM_BASE + req.conversation * (1 << 27) - plen
    if start >= plen:
        return list(range(own + start, own + stop))
    if prefix_tokens is not None:
        ids = prefix_tokens[start : min(stop, plen)]
    else:
        base = PREFIX_STREAM_BASE + (prefix_index or 0) * (1 << 23)
        ids = list(range(base + start, base + min(stop, plen)))
    if stop > plen:
        ids.extend(range(own + plen, own + stop))
    return ids


def prefix_stream(prefix_index: int, prefix_len: int) -> list[int]:
    """The `prefix_len` ids of prefix `prefix_index` in a conversation's stream (`stream_token_ids`)."""
    base = PREFIX_STREAM_BASE + prefix_index * (1 << 23)
    return list(range(base, base + prefix_len))


def prompt_token_ids(
    req: Request, prefix_index: int | None, prefix_tokens: list[int] | None = None
) -> list[int]:
    """Token ids standing in for a prompt: the shared prefix's ids depend on its group only, the rest are unique to
    the request, so prefix caching hits exactly the shared system prompt. prefix_tokens: the prefix's ids
    (`prompt_prefix`), shared by the requests of its group."""
    plen = req.prefix_len if prefix_index is not None else 0
    own = 2_000_000_000 + req.request_id * 4096
    ids = prefix_tokens[:plen] if prefix_tokens is not None else prompt_prefix(prefix_index or 0, plen)
    ids.extend(range(own + plen, own + req.prompt_len))
    return ids


def prompt_prefix(prefix_index: int, prefix_len: int) -> list[int]:
    """The `prefix_len` leading ids `prompt_token_ids` gives the prompts of prefix `prefix_index`."""
    base = 1_000_000_000 + prefix_index * 4096
    return list(range(base, base + prefix_len))


class SimulatedGroup:
    """A simulated request in flight (`core.sched.scheduler.SequenceGroup`): its n sequences share a prompt
    and advance together; it is finished once each emitted `output_len` tokens.

    Token ids (`token_ids`, for the paged policy's prefix cache): the prompt's from `prompt_token_ids`, then
    one constant id per sequence for every output token; for a request of a conversation, the first sequence's
    prompt and outputs both come from the conversation's stream (`stream_token_ids`). admit_time (first admission) / first_token_time /
    finish_time: simulated seconds (NaN until then), set by the simulator.
    """

    __slots__ = (
        "admit_time",
        "finish_time",
        "first_token_time",
        "host_hit_tokens",
        "index",
        "length",
        "num_output_tokens",
        "num_preemptions",
        "num_prefill_tokens",
        "num_prefill_total",
        "num_seqs",
        "output_len",
        "output_token",
        "prefix_hit_tokens",
        "prefix_index",
        "prefix_tokens",
        "prompt_len",
        "prompt_tokens",
        "request",
        "request_id",
        "seq_ids",
    )

    def __init__(
        self,
        request: Request,
        index: int,
        prompt_tokens: list[int],
        prefix_index: int | None = None,
        prefix_tokens: list[int] | None = None,
    ):
        self.request = request
        self.request_id = request.request_id
        self.index = index
        self.num_seqs = request.n
        self.prompt_len = request.prompt_len
        self.output_len = request.output_len
        self.seq_ids = [index * 1024 + k for k in range(request.n)]
        self.output_token = [-(index * 1024 + k) - 1 for k in range(request.n)]
        self.prompt_tokens = prompt_tokens
        self.prefix_index = prefix_index
        # the conversation stream's shared prefix ids (`prefix_stream`, one list per prefix group), or None
        self.prefix_tokens = prefix_tokens
        self.prefix_hit_tokens = 0  # prompt tokens the prefix cache served at its first admission
        self.host_hit_tokens = 0  # of those, tokens loaded from the host tier (SimulatorConfig.offload)
        self.length = 0
        self.num_prefill_tokens = 0
        self.num_prefill_total = 0
        self.num_output_tokens = 0
        self.num_preemptions = 0
        self.first_token_time = math.nan
        self.admit_time = math.nan
        self.finish_time = math.nan

    def is_finished(self) -> bool:
        return self.num_output_tokens >= self.output_len

    def token_ids(self, seq_index: int, start: int, stop: int):
        prompt = self.prompt_len
        request = self.request
        if request.conversation is not None and (seq_index == 0 or stop <= prompt):
            plen = request.prefix_len if self.prefix_index is not None else 0
            if start >= plen:  # past the prefix (decode tokens): `stream_token_ids`' first branch, inlined
                own = CONVERSATION_STREAM_BASE + request.conversation * (1 << 27) - plen
                return list(range(own + start, own + stop))
            return stream_token_ids(request, self.prefix_index, start, stop, self.prefix_tokens)
        if self.request.conversation is not None:
            head = (
                stream_token_ids(self.request, self.prefix_index, start, prompt, self.prefix_tokens)
                if start < prompt
                else []
            )
            return head + [self.output_token[seq_index]] * (stop - max(start, prompt))
        if start >= prompt:
            return (self.output_token[seq_index],) * (stop - start)
        head = self.prompt_tokens[start : min(stop, prompt)]
        return head + [self.output_token[seq_index]] * (stop - prompt) if stop > prompt else head


class GroupMaker:
    """Makes the groups of requests in arrival order, continuing over calls (`make`): requests of one prefix group
    share their prefix's token ids (one list of id objects per prefix and length, which their prompts slice) and
    a prefix group's dense index is the order in which the groups first appear, across calls too."""

    def __init__(self, with_token_ids: bool):
        self.with_token_ids = with_token_ids
        self.prefix_ids: dict = {}
        self.streams: dict = {}  # (prefix index, prefix length) -> the stream's prefix ids
        self.prefixes: dict = {}  # (prefix index, prefix length) -> the stand-in prompts' prefix ids

    def make(self, requests: list[Request], start: int = 0) -> list[SimulatedGroup]:
        """One group per request, indexed from `start` (the groups made before: `make` continues them)."""
        prefix_ids, streams, prefixes = self.prefix_ids, self.streams, self.prefixes
        with_token_ids = self.with_token_ids
        groups = []
        for index, req in enumerate(requests, start):
            pidx = None
            if req.prefix_group is not None and req.prefix_len > 0:
                pidx = prefix_ids.setdefault(req.prefix_group, len(prefix_ids))
            shared = (pidx, req.prefix_len)
            if req.conversation is not None:  # token ids computed on demand from the conversation's stream
                stream = None
                if pidx is not None and with_token_ids:
                    stream = streams.get(shared) or streams.setdefault(shared, prefix_stream(*shared))
                groups.append(SimulatedGroup(req, index, [], pidx, stream))
                continue
            tokens: list[int] = []
            if with_token_ids:
                head = None
                if pidx is not None:
                    head = prefixes.get(shared) or prefixes.setdefault(shared, prompt_prefix(*shared))
                tokens = prompt_token_ids(req, pidx, head)
            groups.append(SimulatedGroup(req, index, tokens))
        return groups


def make_groups(requests: list[Request], with_token_ids: bool) -> list[SimulatedGroup]:
    """One group per request, in arrival order (`GroupMaker`)."""
    return GroupMaker(with_token_ids).make(requests)
