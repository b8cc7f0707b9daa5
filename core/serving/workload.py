"""Serving workloads: requests with arrival times and prompt / output lengths, generated or loaded from a trace.

Length distributions (all lengths in tokens). The PagedAttention paper (Figure 11) reports the means of its two
datasets; we fit a log-normal to each mean with a chosen spread, truncated to the model's maximum length:

    dataset    prompt mean  prompt sigma   output mean  output sigma
    sharegpt   161.31       1.0            337.99       0.9
    alpaca      19.31       0.5             58.45       0.6

`sigma` is the standard deviation of log(length): ShareGPT's long, conversational turns vary far more than
Alpaca's short instructions (standard deviations of about 210 / 370 tokens against 10 / 38). `mu` is solved so that
the mean of the *truncated* distribution equals the paper's mean: prompts are clipped to [1, max_len // 2] and
outputs to [1, max_len - prompt], so every request fits in `max_len` (2048 by default, as in the paper).

Arrivals are Poisson with `rate` requests per second (exponential gaps); `rate = inf` puts every request at t = 0.
"""

import csv
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from core.common import check_float, check_int
from core.errors import InvalidArgumentError
from core.limits import Limits
from core.uploads import read_upload, upload_text

DEFAULT_MAX_LEN = 2048


@dataclass(frozen=True)
class Request:
    """One client request.

    request_id: stable index (0, 1, ...) in arrival order. arrival_time: seconds since the start.
    prompt_len: prompt tokens, including the shared prefix if any (>= 1).
    output_len: tokens to generate for each of the `n` parallel samples (>= 1).
    prefix_group: requests with the same group start with the same `prefix_len` prompt tokens (a shared system
        prompt); None when the prompt shares nothing. 0 <= prefix_len <= prompt_len.
    conversation: None, or the conversation whose token stream this request's prompt and output are the first
        prompt_len + output_len tokens of (`core.serving.sim_groups.stream_token_ids`): the prefix group's
        `prefix_len` tokens, then the conversation's own tokens, outputs included, so a later turn's prompt
        starts with the tokens of every earlier turn's prompt and output (multi-turn chats).
    """

    request_id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    n: int = 1
    prefix_group: Any = None
    prefix_len: int = 0
    conversation: int | None = None

    @property
    def max_total_len(self) -> int:
        """prompt_len + output_len: the longest any of its sequences gets, in tokens."""
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class LengthDistribution:
    """A log-normal length distribution with the given truncated mean (tokens) and log-space sigma."""

    mean: float
    sigma: float


DATASETS = {
    "sharegpt": (LengthDistribution(161.31, 1.0), LengthDistribution(337.99, 0.9)),
    "alpaca": (LengthDistribution(19.31, 0.5), LengthDistribution(58.45, 0.6)),
}


def out_of_phase_outputs(clients: int, output_len: int, seed: int = 0) -> list[int]:
    """Output lengths for the first round of a closed loop of `clients` clients at a fixed output length, so that
    the clients run out of phase from their second request on, as a real server's clients drift apart (with
    fixed lengths and a synchronized start a simulated loop stays in lockstep for ever, every round a
    synchronized start). Client i's first output is drawn uniformly from 2 to output_len tokens (a TPOT needs
    two; `seed`: the draw), so each client's later requests arrive at an independent, uniformly random phase of
    the cycle: clients that drifted apart collide with each other's prefills as often as chance has it.
    `evenly_spaced_outputs` is the one arrangement in which they never do, the best case. The runs that use it
    measure only requests after that round (docs/slo.md 2b: the vLLM profile's benchmark replay; `predict
    --concurrency`)."""
    if output_len < 2:
        return [output_len] * clients
    rng = np.random.default_rng(seed)
    return [int(n) for n in rng.integers(2, output_len + 1, clients)]


def evenly_spaced_outputs(clients: int, output_len: int) -> list[int]:
    """The first round's outputs evenly spaced over the cycle (client i's is (i + 1) / clients x output_len
    tokens, at least 2, at most output_len): clients exactly 1 / clients of a cycle apart, whose prefills never
    queue behind each other's. What `out_of_phase_outputs` did before the random phases (docs/slo.md 2c)."""
    return [min(output_len, max(2, round((i + 1) * output_len / clients))) for i in range(clients)]


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _truncated_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ LogNormal(mu, sigma) (lower clip at 1 is negligible for these means)."""
    log_cap = math.log(cap)
    body = math.exp(mu + sigma * sigma / 2) * _phi((log_cap - mu - sigma * sigma) / sigma)
    return body + cap * (1.0 - _phi((log_cap - mu) / sigma))


def _solve_mu(mean: float, sigma: float, cap: float) -> float:
    """mu such that the log-normal clipped at `cap` has the given mean (bisection; mean < cap)."""
    lo, hi = math.log(mean) - 3 * sigma * sigma, math.log(mean) + 3.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _truncated_mean(mid, sigma, cap) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _check_common(num_requests: int, rate: float, seed: int, n: int, max_len: int) -> None:
    check_int(num_requests, "num_requests", minimum=1)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or math.isnan(rate) or rate <= 0:
        raise InvalidArgumentError(f"rate must be > 0 requests/s (inf: all at t = 0), got {rate!r}")
    check_int(seed, "seed")
    check_int(n, "n (parallel samples)", minimum=1)
    check_int(max_len, "max_len (tokens)", minimum=2)


def poisson_arrivals(num_requests: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in seconds: cumulative exponential gaps of mean 1 / rate; all zeros for rate = inf."""
    if math.isinf(rate):
        return np.zeros(num_requests)
    return np.cumsum(rng.exponential(1.0 / rate, size=num_requests))


class _Shape(NamedTuple):
    """What every request of one draw shares (the generators' common keywords): n parallel samples, a
    `prefix_len`-token shared prefix on a `prefix_fraction` of them, and the max_len token cap."""

    n: int
    prefix_len: int
    prefix_fraction: float
    max_len: int


def _build(
    arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray, rng: np.random.Generator, shape: _Shape
) -> list[Request]:
    n, prefix_len, prefix_fraction, max_len = shape
    check_int(prefix_len, "prefix_len (tokens)", minimum=0)
    check_float(prefix_fraction, "prefix_fraction", minimum=0.0, maximum=1.0)
    shared = rng.random(len(arrivals)) < prefix_fraction if prefix_len > 0 else np.zeros(len(arrivals), bool)
    requests = []
    # Python scalars first: indexing the arrays element by element took ~40 % of the build (100k ShareGPT requests:
    # 0.38 s -> 0.24 s of CPU)
    arrivals, prompts, outputs, shared = (
        np.asarray(a).tolist() for a in (arrivals, prompts, outputs, shared)
    )
    for i in range(len(arrivals)):
        prompt, output = int(prompts[i]), int(outputs[i])
        group, plen = None, 0
        if shared[i]:
            group, plen = 0, int(prefix_len)
            prompt = prompt + plen
            if prompt + output > max_len:
                raise InvalidArgumentError(
                    f"prefix_len {prefix_len} is too long: request {i} would need {prompt + output} > max_len "
                    f"{max_len} tokens; use a prefix of at most {max_len // 4} tokens"
                )
        requests.append(Request(i, float(arrivals[i]), prompt, output, int(n), group, plen))
    return requests


def sample_lengths(
    dataset: str, num_requests: int, rng: np.random.Generator, max_len: int = DEFAULT_MAX_LEN
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_lens, output_lens), int64 tokens, from the fitted distribution of `dataset` (see module doc)."""
    if dataset not in DATASETS:
        raise InvalidArgumentError(f"unknown dataset {dataset!r}; choose one of {sorted(DATASETS)}")
    prompt_dist, output_dist = DATASETS[dataset]
    prompt_cap = max_len // 2
    mu_p = _solve_mu(prompt_dist.mean, prompt_dist.sigma, prompt_cap)
    mu_o = _solve_mu(output_dist.mean, output_dist.sigma, max_len - prompt_dist.mean)
    prompts = np.clip(np.rint(rng.lognormal(mu_p, prompt_dist.sigma, num_requests)), 1, prompt_cap)
    outputs = np.rint(rng.lognormal(mu_o, output_dist.sigma, num_requests))
    outputs = np.clip(outputs, 1, max_len - prompts)
    return prompts.astype(np.int64), outputs.astype(np.int64)


def _dataset(name: str, num_requests: int, rate: float, seed: int, shape: _Shape) -> list[Request]:
    _check_common(num_requests, rate, seed, shape.n, shape.max_len)
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(num_requests, rate, rng)
    prompts, outputs = sample_lengths(name, num_requests, rng, shape.max_len - shape.prefix_len)
    return _build(arrivals, prompts, outputs, rng, shape)


def sharegpt(
    num_requests: int,
    rate: float = 2.0,
    seed: int = 0,
    n: int = 1,
    prefix_len: int = 0,
    prefix_fraction: float = 0.0,
    max_len: int = DEFAULT_MAX_LEN,
) -> list[Request]:
    """ShareGPT-like requests (mean prompt 161.31, output 337.99 tokens), Poisson arrivals at `rate` req/s.

    n: parallel samples per prompt. A `prefix_fraction` of the requests start with a common system prompt of
    `prefix_len` tokens (added to their prompt; prefix_group 0). Deterministic for a seed.
    """
    return _dataset("sharegpt", num_requests, rate, seed, _Shape(n, prefix_len, prefix_fraction, max_len))


def alpaca(
    num_requests: int,
    rate: float = 30.0,
    seed: int = 0,
    n: int = 1,
    prefix_len: int = 0,
    prefix_fraction: float = 0.0,
    max_len: int = DEFAULT_MAX_LEN,
) -> list[Request]:
    """Alpaca-like requests (mean prompt 19.31, output 58.45 tokens); otherwise as `sharegpt`."""
    return _dataset("alpaca", num_requests, rate, seed, _Shape(n, prefix_len, prefix_fraction, max_len))


def fixed(
    num_requests: int,
    prompt_len: int,
    output_len: int,
    rate: float = math.inf,
    seed: int = 0,
    n: int = 1,
    prefix_len: int = 0,
    prefix_fraction: float = 0.0,
    max_len: int = DEFAULT_MAX_LEN,
) -> list[Request]:
    """Every request has the same prompt and output length (tokens)."""
    _check_common(num_requests, rate, seed, n, max_len)
    _check_lengths(prompt_len, output_len, prompt_len, output_len, max_len - prefix_len)
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(num_requests, rate, rng)
    prompts = np.full(num_requests, prompt_len, dtype=np.int64)
    outputs = np.full(num_requests, output_len, dtype=np.int64)
    return _build(arrivals, prompts, outputs, rng, _Shape(n, prefix_len, prefix_fraction, max_len))


def uniform(
    num_requests: int,
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    rate: float = math.inf,
    seed: int = 0,
    n: int = 1,
    prefix_len: int = 0,
    prefix_fraction: float = 0.0,
    max_len: int = DEFAULT_MAX_LEN,
) -> list[Request]:
    """Prompt and output lengths drawn uniformly from the inclusive ranges (tokens)."""
    _check_common(num_requests, rate, seed, n, max_len)
    (p_lo, p_hi), (o_lo, o_hi) = prompt_range, output_range
    _check_lengths(p_lo, o_lo, p_hi, o_hi, max_len - prefix_len)
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(num_requests, rate, rng)
    prompts = rng.integers(p_lo, p_hi + 1, size=num_requests)
    outputs = rng.integers(o_lo, o_hi + 1, size=num_requests)
    return _build(arrivals, prompts, outputs, rng, _Shape(n, prefix_len, prefix_fraction, max_len))


def _check_lengths(p_lo: int, o_lo: int, p_hi: int, o_hi: int, max_len: int) -> None:
    for name, value in (("prompt length (tokens)", p_lo), ("output length (tokens)", o_lo)):
        check_int(value, name, minimum=1)
    if p_hi < p_lo or o_hi < o_lo:
        raise InvalidArgumentError(f"empty range: prompt {p_lo}..{p_hi}, output {o_lo}..{o_hi}")
    if p_hi + o_hi > max_len:
        raise InvalidArgumentError(
            f"prompt {p_hi} + output {o_hi} = {p_hi + o_hi} tokens exceeds the maximum length {max_len}"
        )


# ---- traces ----------------------------------------------------------------------------------------------------

TRACE_COLUMNS = ("arrival_time", "prompt_len", "output_len")
OPTIONAL_COLUMNS = ("n", "prefix_group", "prefix_len")


def _parse_int(value: Any, row: int, column: str, minimum: int) -> int:
    if isinstance(value, bool):
        value = None
    try:
        number = float(value) if isinstance(value, str) else value
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        if not isinstance(number, int):
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"trace row {row}, column {column!r}: expected an integer >= {minimum}, got {value!r}"
        ) from None
    if number < minimum:
        raise InvalidArgumentError(
            f"trace row {row}, column {column!r}: expected an integer >= {minimum}, got {number}"
        )
    return number


def _parse_row(record: dict, row: int) -> Request:
    for column in TRACE_COLUMNS:
        if column not in record or record[column] in (None, ""):
            raise InvalidArgumentError(
                f"trace row {row}: missing column {column!r} (required: {TRACE_COLUMNS})"
            )
    raw = record["arrival_time"]
    try:
        arrival = float(raw)
        if isinstance(raw, bool) or not math.isfinite(arrival) or arrival < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"trace row {row}, column 'arrival_time': expected seconds >= 0, got {raw!r}"
        ) from None
    prompt = _parse_int(record["prompt_len"], row, "prompt_len", 1)
    output = _parse_int(record["output_len"], row, "output_len", 1)
    n = _parse_int(record.get("n") if record.get("n") not in (None, "") else 1, row, "n", 1)
    group = record.get("prefix_group")
    group = None if group in (None, "") else str(group)
    plen = record.get("prefix_len")
    plen = 0 if plen in (None, "") else _parse_int(plen, row, "prefix_len", 0)
    if plen > prompt:
        raise InvalidArgumentError(
            f"trace row {row}, column 'prefix_len': {plen} exceeds the prompt length {prompt}"
        )
    if plen > 0 and group is None:
        raise InvalidArgumentError(f"trace row {row}, column 'prefix_group': required when prefix_len > 0")
    return Request(row, arrival, prompt, output, n, group, plen)


TRACE_EXPECTED = "a CSV (with a header row) or JSONL trace"
MAX_TRACE_LINE_CHARS = 65_536  # a trace row is a few dozen characters; a longer line is never parsed


def _bounded_lines(text: str) -> Iterable[str]:
    """The lines of `text` (split at "\\n", each keeping it), lazily and without copying the text; raises
    InvalidArgumentError at the first line longer than MAX_TRACE_LINE_CHARS (not counting its "\\n") before it is
    sliced or parsed, so no row can expand into thousands of fields or keys."""
    start, line_no = 0, 1
    while start < len(text):
        end = text.find("\n", start, start + MAX_TRACE_LINE_CHARS + 1)
        if end < 0 and len(text) - start > MAX_TRACE_LINE_CHARS:
            newline = text.find("\n", start)
            length = (len(text) if newline < 0 else newline) - start  # without the "\n"
            raise InvalidArgumentError(
                f"trace line {line_no} has {length:,} characters; a row may have at most {MAX_TRACE_LINE_CHARS:,}"
            )
        stop = len(text) if end < 0 else end + 1
        yield text[start:stop]
        start, line_no = stop, line_no + 1


def _records(text: str) -> Iterable[tuple[int, dict]]:
    """(row, record) pairs, read lazily: CSV rows numbered as a spreadsheet shows them (header = 1), JSONL lines
    by line number. Raises InvalidArgumentError for a JSON array, malformed JSON or CSV, a missing header column or
    a CSV row with more fields than the header."""
    first = re.match(r"\s*", text).end()  # the first non-space character, without copying the text
    if text.startswith("[", first):
        raise InvalidArgumentError(
            "the trace is a JSON array: upload JSON lines (one object per line) or a CSV with a header row"
        )
    if text.startswith("{", first):
        for line_no, line in enumerate(_bounded_lines(text), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InvalidArgumentError(
                    f"trace line {line_no}: not valid JSON ({err.msg}); expected one JSON object per line"
                ) from None
            except (RecursionError, ValueError):  # a nesting bomb, or an integer of thousands of digits
                raise InvalidArgumentError(
                    f"trace line {line_no}: cannot be read (nested too deeply or a number too long)"
                ) from None
            if not isinstance(record, dict):
                raise InvalidArgumentError(f"trace line {line_no}: expected a JSON object per line")
            yield line_no, record
        return
    reader = csv.DictReader(_bounded_lines(text), strict=True)
    try:
        if reader.fieldnames is None:
            raise InvalidArgumentError("trace is empty: expected a CSV header or JSON lines")
        header = [name.strip() for name in reader.fieldnames]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise InvalidArgumentError(
                f"trace header lacks column(s) {missing}; found {header} (the first row must name the columns "
                f"{', '.join(TRACE_COLUMNS)})"
            )
        reader.fieldnames = header
        for index, record in enumerate(reader, start=2):  # spreadsheet row numbers (header = 1)
            if None in record:
                raise InvalidArgumentError(
                    f"trace row {index}: {len(header) + len(record[None])} fields, but the header names "
                    f"{len(header)} columns"
                )
            yield index, {k: (v.strip() if isinstance(v, str) else v) for k, v in record.items()}
    except csv.Error as err:
        raise InvalidArgumentError(f"trace row {reader.line_num}: not valid CSV ({err})") from None


def load_trace(
    file: Any, *, max_len: int | None = None, max_len_source: str = "", limits: Limits | None = None
) -> list[Request]:
    """Requests from a CSV (header row) or JSONL file with columns arrival_time (s), prompt_len, output_len
    (tokens), and optionally n, prefix_group, prefix_len.

    `file` is a path, text, bytes or a binary/text file object (e.g. a Streamlit upload). Rows are sorted by arrival
    time (stable) and numbered 0, 1, ... in that order. `limits` (default: from the environment) bounds the file's
    bytes (checked before reading, `core.uploads.read_upload`) and its rows: reading stops at the first row past
    `max_simulated_requests` (LimitExceededError naming PAGED_LAB_MAX_REQUESTS). `max_len` (tokens, optional)
    refuses a row whose prompt_len + output_len is longer; `max_len_source` says where that limit comes from.
    Empty, compressed, binary or non-UTF-8 files, and any bad row, raise InvalidArgumentError naming the row (CSV:
    spreadsheet row with the header as row 1; JSONL: line number) and the column. Nothing is returned on error.
    """
    limits = Limits.from_env() if limits is None else limits
    if isinstance(file, str) and ("\n" in file or "," in file):
        text = file
    elif isinstance(file, str | Path | bytes | bytearray | memoryview) or hasattr(file, "read"):
        # a str here is a path: a one-line text would be a header alone, never a valid trace
        text = upload_text(read_upload(file, "the trace", limits), "the trace", TRACE_EXPECTED)
    else:
        raise InvalidArgumentError(f"load_trace needs a path, text, bytes or file object, got {type(file)}")
    if max_len is not None:
        check_int(max_len, "max_len (tokens)", minimum=2)
    parsed = []
    for row, record in _records(text):
        limits.check_rows_read(len(parsed) + 1, f"row {row:,}")
        request = _parse_row(record, row)
        if max_len is not None and request.max_total_len > max_len:
            raise InvalidArgumentError(
                f"trace row {row}: prompt_len {request.prompt_len:,} + output_len {request.output_len:,} = "
                f"{request.max_total_len:,} tokens, over the limit of {max_len:,} tokens"
                + (f" ({max_len_source})" if max_len_source else "")
                + "; shorten or drop that row"
            )
        parsed.append(request)
    if not parsed:
        raise InvalidArgumentError("trace has no requests")
    parsed.sort(key=lambda r: r.arrival_time)
    return [
        Request(i, r.arrival_time, r.prompt_len, r.output_len, r.n, r.prefix_group, r.prefix_len)
        for i, r in enumerate(parsed)
    ]
