"""A staged rate ramp (a load generator's `stages`: each a rate held for a duration) of shared-prefix requests, and
the whole run's figures aggregated as the benchmark tool aggregates them: a transient replay, not a steady state.

The load is that of inference-perf's `shared_prefix` data with a `poisson` load of `stages` (the tool llm-d's
"KV-cache wins" benchmark ran; kubernetes-sigs/inference-perf, `datagen/shared_prefix_datagen.py` and
`loadgen/load_timer.py`):

- Prompts: `groups` x `per_group` fixed prompts, prompt (g, u) = group g's `prefix_len`-token system prompt, then
  user u's own `question_len`-token question; the list is shuffled once (seeded here) and request i sends prompt
  i mod (groups x per_group), so each user's whole prompt is sent again every groups x per_group requests (its
  question can hit too, not only the prefix). Every request asks for `output_len` tokens (ignore_eos).
  Here user (g, u) is conversation g x per_group + u (`Request.conversation`): the same token stream each time.
- Arrivals: stage k starts when stage k - 1 ends and sends int(rate_k x duration_k) requests, its gaps drawn
  exponential (mean 1 / rate_k) and scaled so they sum to the stage's duration: the last arrival of a stage is
  at its end. (The 2025 tool drew a Poisson count each second instead: the same mean, counts that vary by about
  their square root.)

Figures (`ramp_report`), inference-perf's definitions: a stage's requests are those it sent; its output tok/s
is their output tokens / (the last one's finish - the first one's arrival), so a stage whose requests queue for
minutes is credited over the minutes they took; its TTFT p90 is over its requests. The whole run's output tok/s
is the mean of the stages' (the published "Summary across QPS" row is the plain mean of its per-stage rows,
warm-up excluded: 8,730.0 / 6,944.4 / 4,428.7 / 4,266.4 from the 16 per-stage rows of llm-d-kv-cache-manager's
benchmarking/73-capacity report), and its TTFT p90 the percentile over every request of every stage (inference-perf's
summary report; the mean of the stages' p90s does not reproduce the published summary: 0.536 s / 77.7 s against
0.542 / 92.6). Requests the run did not finish are left out of both, as the tool leaves out failed ones.
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from core.common import check_float, check_int
from core.errors import InvalidArgumentError
from core.serving.latency import REQUEST_SIDE_COLUMN, request_latencies
from core.serving.workload import Request

__all__ = [
    "SharedPrefixPrompts",
    "Stage",
    "check_stages",
    "ramp_report",
    "stage_bounds",
    "staged_arrivals",
    "staged_requests",
]

MAX_RAMP_REQUESTS = 1_000_000


class Stage(NamedTuple):
    """One stage of a ramp: `rate` requests/s held for `duration_s` seconds."""

    rate: float
    duration_s: float


class SharedPrefixPrompts(NamedTuple):
    """inference-perf's `shared_prefix` data: `groups` system prompts of `prefix_len` tokens, `per_group` users
    each, every user's question `question_len` tokens, every answer `output_len` tokens."""

    groups: int
    per_group: int
    prefix_len: int
    question_len: int
    output_len: int


def check_stages(stages: Sequence[Stage]) -> list[Stage]:
    """The stages as `Stage`s. Raises InvalidArgumentError for no stages, a stage not (rate, duration_s), a rate
    or duration <= 0 or not finite, or a ramp that sends no request or more than `MAX_RAMP_REQUESTS`."""
    if isinstance(stages, str | bytes) or not isinstance(stages, Sequence) or not stages:
        raise InvalidArgumentError(f"stages must be a non-empty list of (rate, duration_s), got {stages!r}")
    out = []
    for k, stage in enumerate(stages):
        if not isinstance(stage, tuple) or len(stage) != 2:
            raise InvalidArgumentError(
                f"stage {k + 1} must be (rate requests/s, duration_s seconds), got {stage!r}"
            )
        rate = check_float(stage[0], f"stage {k + 1} rate (requests/s)", minimum=0.0, exclusive_minimum=True)
        duration = check_float(stage[1], f"stage {k + 1} duration (s)", minimum=0.0, exclusive_minimum=True)
        if not np.isfinite(rate) or not np.isfinite(duration):
            raise InvalidArgumentError(f"stage {k + 1} needs a finite rate and duration, got {stage!r}")
        out.append(Stage(rate, duration))
    total = sum(int(s.rate * s.duration_s) for s in out)
    if total < 1 or total > MAX_RAMP_REQUESTS:
        raise InvalidArgumentError(
            f"the stages send {total:,} requests; a ramp needs 1 to {MAX_RAMP_REQUESTS:,} (rate x duration each)"
        )
    return out


def stage_bounds(stages: Sequence[Stage]) -> np.ndarray:
    """Stage k spans seconds [bounds[k], bounds[k + 1]); bounds[0] = 0."""
    return np.concatenate([[0.0], np.cumsum([s.duration_s for s in check_stages(stages)])])


def staged_arrivals(stages: Sequence[Stage], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times in seconds, stage index of each), in arrival order (module docstring: int(rate x duration)
    requests a stage, exponential gaps scaled to the stage's duration). Deterministic for a seed. Raises
    InvalidArgumentError for no stages, a rate or duration <= 0 or not finite, or a ramp of no request."""
    stages = check_stages(stages)
    check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng([seed, 0x5A6E])
    bounds = stage_bounds(stages)
    times, index = [], []
    for k, stage in enumerate(stages):
        count = int(stage.rate * stage.duration_s)
        if count == 0:
            continue
        gaps = rng.exponential(1.0 / stage.rate, count)
        at = bounds[k] + np.cumsum(gaps) * (stage.duration_s / gaps.sum())
        at[-1] = bounds[k + 1]  # the scaled gaps sum to the duration; pin the rounding
        times.append(at)
        index.append(np.full(count, k, dtype=np.int64))
    return np.concatenate(times), np.concatenate(index)


def staged_requests(stages: Sequence[Stage], prompts: SharedPrefixPrompts, seed: int = 0) -> list[Request]:
    """The ramp's requests (module docstring), numbered in arrival order. Raises InvalidArgumentError for bad
    stages or prompt shapes."""
    groups, per_group, prefix_len, question_len, output_len = prompts
    check_int(groups, "groups", minimum=1)
    check_int(per_group, "per_group (users a group)", minimum=1)
    check_int(prefix_len, "prefix_len (tokens)", minimum=0)
    check_int(question_len, "question_len (tokens)", minimum=1)
    check_int(output_len, "output_len (tokens)", minimum=1)
    arrivals, _ = staged_arrivals(stages, seed)
    order = np.random.default_rng([seed, 0x9E0]).permutation(groups * per_group)
    prompt_len = prefix_len + question_len
    out = []
    for i, at in enumerate(arrivals):
        user = int(order[i % len(order)])
        group = user // per_group if prefix_len else None
        out.append(
            Request(
                i,
                float(at),
                prompt_len,
                output_len,
                1,
                group,
                prefix_len if prefix_len else 0,
                conversation=user,
            )
        )
    return out


def ramp_report(
    requests: pd.DataFrame,
    stages: Sequence[Stage],
    first_stage: int = 0,
    stage_of: np.ndarray | None = None,
    timeout_s: float | None = None,
) -> dict:
    """The run's figures (module docstring) from a simulation's `requests` frame (arrival_time, first_token_time,
    finish_time, output_len, prompt_len, prefix_hit_tokens; a request-side time column, when present, added to
    every TTFT and finish as `core.serving.latency.request_latencies` adds it): `stages` a list, per stage, of rate, requests
    sent, finished, output_tokens_per_s and ttft_p90_s; the whole run's output_tokens_per_s (the mean over the
    stages from `first_stage` on: a warm-up before it is left out, as the published summary leaves it out),
    ttft_p90_s and ttft_mean_s (over every finished request), prefix_hit_rate (prompt tokens the caches served /
    prompt tokens, finished requests), unfinished (requests sent but not finished when the run stopped) and
    timed_out. stage_of: each request's stage index (None: from its arrival time and the stages' bounds; a run
    whose stages wait for each other, `core.serving.staged_run`, gives it). timeout_s: a request not finished
    within it of its arrival failed at arrival + timeout_s, as a client's timeout fails it: left out of the
    figures (counted in `timed_out`), its failure time still ending its stage's span as the tool's does."""
    stages = check_stages(stages)
    check_int(first_stage, "first_stage", minimum=0, maximum=len(stages) - 1)
    arrival = requests["arrival_time"].to_numpy()
    if stage_of is None:
        bounds = stage_bounds(stages)
        stage_of = np.clip(np.searchsorted(bounds, arrival, side="left") - 1, 0, len(stages) - 1)
    stage_of = np.asarray(stage_of)
    if stage_of.shape != arrival.shape or (
        len(stage_of) and not 0 <= stage_of.min() <= stage_of.max() < len(stages)
    ):
        raise InvalidArgumentError(f"stage_of needs one stage index (0 to {len(stages) - 1}) per request")
    ttft = request_latencies(requests)["ttft"]  # with the request-side time (REQUEST_SIDE_COLUMN), if any
    finish = requests["finish_time"].to_numpy(np.float64)
    if REQUEST_SIDE_COLUMN in requests:  # the client sees its last token that much later too
        finish = finish + requests[REQUEST_SIDE_COLUMN].to_numpy(np.float64)
    done = requests["finish_time"].notna().to_numpy()
    timed_out = np.zeros_like(done)
    if timeout_s is not None:
        check_float(timeout_s, "timeout_s (s)", minimum=0.0, exclusive_minimum=True)
        timed_out = done & (finish - arrival > timeout_s)
        finish = np.where(timed_out, arrival + timeout_s, finish)
        done = done & ~timed_out
    per_stage = []
    for k, stage in enumerate(stages):
        mine = (stage_of == k) & done
        sent = int((stage_of == k).sum())
        row = {"rate": stage.rate, "duration_s": stage.duration_s, "sent": sent, "finished": int(mine.sum())}
        if timeout_s is not None:
            row["timed_out"] = int(((stage_of == k) & timed_out).sum())
        if mine.any():
            ended = (stage_of == k) & (done | timed_out)
            span = float(finish[ended].max() - arrival[stage_of == k].min())
            tokens = float(requests["output_len"].to_numpy()[mine].sum())
            row["output_tokens_per_s"] = tokens / span if span > 0 else float("nan")
            row["ttft_p90_s"] = float(np.percentile(ttft[mine], 90))
        else:
            row["output_tokens_per_s"], row["ttft_p90_s"] = 0.0, float("nan")
        per_stage.append(row)
    main = [row["output_tokens_per_s"] for row in per_stage[first_stage:]]
    prompts = float(requests["prompt_len"].to_numpy()[done].sum())
    return {
        "output_tokens_per_s": float(np.mean(main)),
        "ttft_p90_s": float(np.percentile(ttft[done], 90)) if done.any() else float("nan"),
        "ttft_mean_s": float(np.mean(ttft[done])) if done.any() else float("nan"),
        "prefix_hit_rate": float(requests["prefix_hit_tokens"].to_numpy()[done].sum() / prompts)
        if prompts
        else 0.0,
        "unfinished": int((~done & ~timed_out).sum()),
        "timed_out": int(timed_out.sum()),
        "stages": per_stage,
    }
