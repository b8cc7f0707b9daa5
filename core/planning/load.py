"""The traffic a deployment serves (`Load`): Poisson arrivals at a rate, or a closed loop of clients, with prompt
and output lengths; and the requests it draws."""

import math
from dataclasses import dataclass

from core.common import check_float, check_int
from core.errors import InvalidArgumentError
from core.serving.workload import Request, fixed, uniform


@dataclass(frozen=True)
class Load:
    """The traffic of a whole deployment. rate: Poisson arrivals, requests/s (`vllm bench serve
    --request-rate`); concurrency: instead, a closed loop of that many clients, each sending its next request
    the moment its last one finished (`--max-concurrency` at an unbounded rate); exactly one of the two.
    prompt_len / output_len: tokens. length_spread 0: every request has exactly these lengths; s in (0, 1):
    each length uniform in [len x (1 - s), len x (1 + s)] (rounded). seed: the draw (arrivals and lengths).
    Raises InvalidArgumentError for a missing, negative, zero or non-finite rate or concurrency."""

    rate: float | None
    prompt_len: int
    output_len: int
    length_spread: float = 0.0
    seed: int = 0
    concurrency: int | None = None

    def __post_init__(self):
        if (self.rate is None) == (self.concurrency is None):
            raise InvalidArgumentError(
                "give exactly one of rate (requests/s, Poisson) and concurrency (closed-loop clients)"
            )
        if self.rate is not None:
            rate = check_float(self.rate, "rate (requests/s)", minimum=0.0, exclusive_minimum=True)
            if not math.isfinite(rate) or rate > 1e6:
                raise InvalidArgumentError(f"rate (requests/s) must be finite and at most 1e6, got {rate!r}")
            object.__setattr__(self, "rate", rate)
        else:
            check_int(self.concurrency, "concurrency (clients)", minimum=1, maximum=100_000)
        check_int(self.prompt_len, "prompt_len (tokens)", minimum=1, maximum=1 << 22)
        check_int(self.output_len, "output_len (tokens)", minimum=1, maximum=1 << 22)
        check_float(self.length_spread, "length_spread", minimum=0.0, maximum=0.99)
        check_int(self.seed, "seed", minimum=0)

    def _range(self, length: int) -> tuple[int, int]:
        spread = self.length_spread
        return max(1, round(length * (1 - spread))), max(1, round(length * (1 + spread)))

    @property
    def max_len(self) -> int:
        """The longest request (prompt + output tokens): the deployment's max_model_len."""
        return self._range(self.prompt_len)[1] + self._range(self.output_len)[1]

    @property
    def mean_output_len(self) -> float:
        low, high = self._range(self.output_len)
        return (low + high) / 2

    def per_replica(self, replicas: int) -> "Load":
        """The share of one of `replicas` replicas: the rate split evenly, or the clients (rounded up)."""
        if self.rate is not None:
            return Load(self.rate / replicas, self.prompt_len, self.output_len, self.length_spread, self.seed)
        clients = math.ceil(self.concurrency / replicas)
        return Load(None, self.prompt_len, self.output_len, self.length_spread, self.seed, clients)

    def requests(self, count: int) -> list[Request]:
        """`count` requests (Poisson at `rate`, seeded; a closed loop ignores their arrival times)."""
        rate = self.rate if self.rate is not None else math.inf
        if self.length_spread == 0:
            return fixed(count, self.prompt_len, self.output_len, rate, self.seed, max_len=self.max_len)
        prompts, outputs = self._range(self.prompt_len), self._range(self.output_len)
        return uniform(count, prompts, outputs, rate, self.seed, max_len=self.max_len)
