"""The simulator's request groups: `SimulatedGroup` (a request and its parallel samples, as the scheduler's
`SequenceGroup`), the stand-in token ids its prompt gets (`prompt_token_ids`, so prefix caching hits exactly a
shared system prompt) and `make_groups` (one group per request, in arrival order)."""

import math

from core.serving.workload import Request

PREFIX_STREAM_BASE = 3 << 40  # prefix g's token j: PREFIX_STREAM_BASE + g x 2^23 + j
CONVERSATION_STREAM_BASE = 1 << 50  # conversation c's own token j: CONVERSATION_STREAM_BASE + c x 2^27 + j


def stream_token_ids(req: Request, prefix_index: int | None, start: int, stop: int) -> list[int]:
    """Tokens [start, stop) of the token stream of `req.conversation` (not None): the `req.prefix_len` tokens of
    prefix `prefix_index` (dense index of its prefix group; none when None), then the conversation's own tokens
    numbered from 0. Every request of one conversation reads the same stream, so a later turn's prompt repeats
    the earlier turns' prompts and outputs token for token, and requests of one prefix group share its prefix."""
    plen = req.prefix_len if prefix_index is not None else 0
    base = PREFIX_STREAM_BASE + (prefix_index or 0) * (1 << 23)
    own = CONVERSATION_STREAM_BASE + req.conversation * (1 << 27) - plen
    head = list(range(base + start, base + min(stop, plen))) if start < plen else []
    return head + list(range(own + max(start, plen), own + stop)) if stop > plen else head


def prompt_token_ids(req: Request, prefix_index: int | None) -> list[int]:
    """Token ids standing in for a prompt: the shared prefix's ids depend on its group only, the rest are unique to
    the request, so prefix caching hits exactly the shared system prompt."""
    plen = req.prefix_len if prefix_index is not None else 0
    base = 1_000_000_000 + (prefix_index or 0) * 4096
    own = 2_000_000_000 + req.request_id * 4096
    return [base + j for j in range(plen)] + [own + j for j in range(plen, req.prompt_len)]


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
        "prompt_len",
        "prompt_tokens",
        "request",
        "request_id",
        "seq_ids",
    )

    def __init__(
        self, request: Request, index: int, prompt_tokens: list[int], prefix_index: int | None = None
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
        if self.request.conversation is not None and (seq_index == 0 or stop <= prompt):
            return stream_token_ids(self.request, self.prefix_index, start, stop)
        if self.request.conversation is not None:
            head = stream_token_ids(self.request, self.prefix_index, start, prompt) if start < prompt else []
            return head + [self.output_token[seq_index]] * (stop - max(start, prompt))
        if start >= prompt:
            return (self.output_token[seq_index],) * (stop - start)
        head = self.prompt_tokens[start : min(stop, prompt)]
        return head + [self.output_token[seq_index]] * (stop - prompt) if stop > prompt else head


def make_groups(requests: list[Request], with_token_ids: bool) -> list[SimulatedGroup]:
    """One group per request, in arrival order; requests of one prefix group share their prefix's token ids."""
    prefix_ids: dict = {}
    groups = []
    for index, req in enumerate(requests):
        pidx = None
        if req.prefix_group is not None and req.prefix_len > 0:
            pidx = prefix_ids.setdefault(req.prefix_group, len(prefix_ids))
        if req.conversation is not None:  # token ids computed on demand from the conversation's stream
            groups.append(SimulatedGroup(req, index, [], pidx))
            continue
        groups.append(SimulatedGroup(req, index, prompt_token_ids(req, pidx) if with_token_ids else []))
    return groups
