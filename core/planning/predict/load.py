"""The traffic a deployment serves (`Load`): Poisson arrivals at a rate, or a closed loop of clients, with prompt
and output lengths, prompts that share prefixes and multi-turn chats; and the requests it draws."""

import math
from dataclasses import dataclass, replace

from core.errors import InvalidArgumentError
from core.fields import InputField, check_fields
from core.serving.prefix_workload import SharedPrefixes, Turns, conversations, share_prefixes
from core.serving.workload import Request, fixed, uniform

DEFAULT_TURN_GAP_S = 10.0  # seconds between a chat's turns, arrival to arrival (--turn-gap's default)

# The load's inputs, declared once (`core.fields`): `Load` checks each value by them, the command line's flags and
# the SLO planner page's URL fields and widgets are made from them. rate and concurrency are the two ways to give
# a load (exactly one of them); prompt_len and output_len have no default on the command line (required there).
RATE_FIELDS = (
    InputField(
        "rate",
        "--rate",
        "rate",
        "float",
        None,
        "Request rate (requests/s, Poisson)",
        "requests/s, Poisson",
        "requests/s",
        minimum=0.0,
        maximum=1e6,
        exclusive_minimum=True,
        optional=True,
        step=1.0,
    ),
    InputField(
        "concurrency",
        "--concurrency",
        "clients",
        "int",
        None,
        "Concurrent clients (closed loop)",
        "closed-loop clients",
        "clients",
        minimum=1,
        maximum=100_000,
        optional=True,
        step=8,
    ),
)
SHAPE_FIELDS = (
    InputField(
        "prompt_len",
        "--prompt-len",
        "prompt_len",
        "int",
        None,
        "Prompt length (tokens)",
        "prompt tokens per request (the mean, with --length-spread)",
        unit="tokens",
        minimum=1,
        maximum=1 << 22,
        step=100,
        required=True,
    ),
    InputField(
        "output_len",
        "--output-len",
        "output_len",
        "int",
        None,
        "Output length (tokens)",
        "output tokens per request (the mean, with --length-spread)",
        unit="tokens",
        minimum=1,
        maximum=1 << 22,
        step=50,
        required=True,
    ),
    InputField(
        "length_spread",
        "--length-spread",
        "spread",
        "float",
        0.0,
        "Length spread (each length uniform in ± this share)",
        "each request's lengths uniform within +/- this share of --prompt-len and --output-len (0: fixed)",
        minimum=0.0,
        maximum=0.99,
        step=0.05,
    ),
    InputField(
        "seed",
        "--seed",
        "seed",
        "int",
        0,
        "Seed (arrivals and lengths)",
        "seed of the arrivals and lengths",
        minimum=0,
        step=1,
    ),
)
LEVER_FIELDS = (
    InputField(
        "shared_prefix_len",
        "--shared-prefix-len",
        "prefix_len",
        "int",
        0,
        "Shared prefix length (tokens, --shared-prefix-len; 0: none)",
        "tokens every prompt shares",
        "tokens",
        minimum=0,
        maximum=1 << 22,
        step=100,
    ),
    InputField(
        "num_prefixes",
        "--num-prefixes",
        "prefixes",
        "int",
        1,
        "Distinct prefixes (--num-prefixes)",
        "distinct shared prefixes",
        minimum=1,
        maximum=1 << 20,
        step=1,
    ),
    InputField(
        "prefix_zipf",
        "--prefix-zipf",
        "zipf",
        "float",
        None,
        "Prefix Zipf exponent (--prefix-zipf; empty: uniform)",
        "Zipf exponent of prefix popularity (default: uniform)",
        minimum=0.0,
        maximum=100.0,
        exclusive_minimum=True,
        optional=True,
        step=0.1,
    ),
    InputField(
        "turns",
        "--turns",
        "turns",
        "int",
        1,
        "Turns per conversation (--turns)",
        "requests per conversation",
        minimum=1,
        maximum=1000,
        step=1,
    ),
    InputField(
        "turn_gap_s",
        "--turn-gap",
        "turn_gap",
        "float",
        DEFAULT_TURN_GAP_S,
        "Seconds between a chat's turns (--turn-gap)",
        "seconds between a chat's turns",
        "seconds",
        minimum=0.0,
        exclusive_minimum=True,
        step=1.0,
    ),
)
LOAD_FIELDS = RATE_FIELDS + SHAPE_FIELDS + LEVER_FIELDS


@dataclass(frozen=True)
class Load:
    """The traffic of a whole deployment. rate: Poisson arrivals, requests/s (`vllm bench serve
    --request-rate`); concurrency: instead, a closed loop of that many clients, each sending its next request
    the moment its last one finished (`--max-concurrency` at an unbounded rate); exactly one of the two.
    prompt_len / output_len: tokens. length_spread 0: every request has exactly these lengths; s in (0, 1):
    each length uniform in [len x (1 - s), len x (1 + s)] (rounded). seed: the draw (arrivals and lengths).

    Shared prefixes and chats (`core.serving.prefix_workload`; any of them runs the prefix cache):
    shared_prefix_len: every prompt starts with one of `num_prefixes` distinct prefixes of this many tokens
    (0: none), chosen uniformly or, with prefix_zipf a > 0, with weights 1 / k^a; turns: each conversation sends
    this many requests, turn t's prompt the conversation so far (prompt_len is the first turn's; each later turn
    adds the previous output and a new user message as long as the first turn's own part, prompt_len -
    shared_prefix_len, drawn alike), turn_gap_s apart (arrival to arrival). rate stays requests/s.
    Raises InvalidArgumentError for a missing, negative, zero or non-finite rate or concurrency, a negative
    prefix length or one longer than the shortest prompt, no prefix, a zipf exponent <= 0, fewer than one
    turn or a gap <= 0, each message naming the CLI flag."""

    rate: float | None
    prompt_len: int
    output_len: int
    length_spread: float = 0.0
    seed: int = 0
    concurrency: int | None = None
    shared_prefix_len: int = 0
    num_prefixes: int = 1
    prefix_zipf: float | None = None
    turns: int = 1
    turn_gap_s: float = DEFAULT_TURN_GAP_S

    def __post_init__(self):
        if (self.rate is None) == (self.concurrency is None):
            raise InvalidArgumentError(
                "give exactly one of rate (requests/s, Poisson) and concurrency (closed-loop clients)"
            )
        check_fields(self, RATE_FIELDS + SHAPE_FIELDS)
        self._check_levers()

    def _check_levers(self) -> None:
        check_fields(self, LEVER_FIELDS)
        shortest = self._range(self.prompt_len)[0]
        if self.shared_prefix_len > shortest:
            raise InvalidArgumentError(
                f"--shared-prefix-len {self.shared_prefix_len} is longer than the shortest prompt ({shortest} "
                f"tokens): a prefix is part of the prompt, at most --prompt-len x (1 - --length-spread) tokens"
            )

    @property
    def uses_prefix_cache(self) -> bool:
        """Prompts share tokens (a shared prefix or earlier turns): the prefix cache decides what hits."""
        return self.shared_prefix_len > 0 or self.turns > 1

    def _range(self, length: int) -> tuple[int, int]:
        spread = self.length_spread
        return max(1, round(length * (1 - spread))), max(1, round(length * (1 + spread)))

    @property
    def max_len(self) -> int:
        """The longest request (prompt + output tokens): the deployment's max_model_len (a chat's last turn)."""
        prompt, output = self._range(self.prompt_len)[1], self._range(self.output_len)[1]
        return prompt + output + (self.turns - 1) * (prompt - self.shared_prefix_len + output)

    @property
    def mean_output_len(self) -> float:
        low, high = self._range(self.output_len)
        return (low + high) / 2

    def per_replica(self, replicas: int) -> "Load":
        """The share of one of `replicas` replicas: the rate split evenly, or the clients (rounded up)."""
        if self.rate is not None:
            return replace(self, rate=self.rate / replicas)
        return replace(self, concurrency=math.ceil(self.concurrency / replicas))

    def requests(self, count: int) -> list[Request]:
        """`count` requests (Poisson at `rate`, seeded; a closed loop ignores their arrival times, not their
        order); with turns, those of the conversations (`core.serving.prefix_workload.conversations`)."""
        rate = self.rate if self.rate is not None else math.inf
        prompts, outputs = self._range(self.prompt_len), self._range(self.output_len)
        shared = self.shared_prefix_len
        prefixes = SharedPrefixes(shared, self.num_prefixes, self.prefix_zipf)
        if self.turns > 1:
            users = (prompts[0] - shared, prompts[1] - shared)
            return conversations(
                count, rate, Turns(self.turns, self.turn_gap_s, users, outputs), prefixes, self.seed
            )
        if self.length_spread == 0:
            requests = fixed(count, self.prompt_len, self.output_len, rate, self.seed, max_len=self.max_len)
        else:
            requests = uniform(count, prompts, outputs, rate, self.seed, max_len=self.max_len)
        if shared:
            return share_prefixes(requests, prefixes, self.seed)
        return requests
