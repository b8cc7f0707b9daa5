"""How each measured vLLM serving figure (`core.planning.cost.fits.published_vllm_rows`) is predicted: the row's
benchmark replayed through the simulator, and the replay re-priced for any step-time parameters. The fit that uses
it is `core.planning.cost.fits.published_vllm`'s.

The prediction of one row (`predict_row`) is the row's deployment (`published_vllm_rows`: vLLM's defaults where the
row says nothing); the step time `core.planning.cost.step_time.from_specs` with the parameters given; run
through `core.serving.simulator.simulate(..., concurrency=C)` (the closed loop, the paged policy counting blocks)
as the benchmark that measured it: BENCHMARK_ROUNDS rounds of C requests (aiconfigurator's deployment guide sends
10 x C requests at concurrency C; `Benchmark`), the mean over all of them. Two phases make that mean:
- "first": the first round, from a synchronized start (all C clients send at 0: the prompts queue for the
  prefill budget, so TTFT grows with C);
- "steady": the rounds after, in the steady state of clients out of phase (a real server's clients drift apart;
  the simulator's, with fixed lengths, would stay in lockstep forever, every round a synchronized start): the
  first round's outputs drawn uniformly from 2..OSL tokens (`out_of_phase_outputs`, seed PHASE_SEED), so each
  client runs at a random phase of the cycle, the next WARMUP_ROUNDS x C requests dropped, the next
  MEASURED_ROUNDS x C measured.
mean = (first + (BENCHMARK_ROUNDS - 1) x steady) / BENCHMARK_ROUNDS, for TTFT and for TPOT.

Why re-pricing is exact and fast: in a closed loop a request arrives the moment another finishes, i.e. at the
end of a step, so which requests each step holds never depends on how long the steps take. `RowReplay`
simulates each phase of a row once, records every step's load (new tokens, keys read, attention pairs, sampled
tokens) and which step each measured request arrived, got its first token and finished in; other parameters
then only re-price the recorded steps (numpy), exactly what simulating again gives (tests check it).

Request-side latency (REQUEST_TERM, in the cross-model profile only): with an override "request_overhead_s" each
predicted TTFT gains that fixed time (the serving front end: HTTP, tokenization, the hand-off to the engine, the
first token's way back) plus the step in flight when the request reaches the engine (`request_latency`): a
closed-loop client's next request arrives after the engine has scheduled the next step without it, where the
simulator admits it at once. Without the override, TTFT is the simulator's (the stored profile's numbers).
"""

import random
from dataclasses import dataclass

import numpy as np

from core.errors import InvalidArgumentError
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.fits.engine_profiles import REQUEST_TERM
from core.planning.cost.fits.published_vllm_rows import (
    BLOCK_SIZE,
    KV_DTYPE,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    VllmRow,
    expert_block_rows,
    kv_tokens,
)
from core.planning.cost.step_model import PrefillLoad, StepTimeModel
from core.planning.cost.step_time import from_specs
from core.serving.latency import benchmark_mean, request_side_seconds
from core.serving.memory_policies import paged
from core.serving.sim_config import SimulatorConfig
from core.serving.simulator import simulate
from core.serving.workload import Request, evenly_spaced_outputs, out_of_phase_outputs

WARMUP_ROUNDS = 2
MEASURED_ROUNDS = 2
# Rounds of C requests in each row's benchmark. The rows do not say; the source documents three counts:
# aiconfigurator's deployment guide (docs/dynamo_deployment_guide.md) uses concurrency x 10 requests "to reduce
# the impact of the first batch of requests", its generated benchmark script 20 by default
# (bench_run.sh.j2, AICONFIGURATOR_BENCH_MULTI_ROUND) and its Kubernetes template 50. The seventh stage (docs/slo.md
# 2c) takes the guide's 10, which the training rows also prefer of the three (training RMS 0.147 / 0.195 / 0.264);
# every stage before it was fitted with 20.
BENCHMARK_ROUNDS = 10
# The seed of the steady phase's random phases (docs/slo.md 2c: seeds 0, 1, 2 fit to training RMS 0.1468, 0.1438,
# 0.1452 in the seventh stage, 0.1948, 0.1906, 0.1958 in the sixth)
PHASE_SEED = 0


STEADY_PHASES = ("steady", "steady-even")


@dataclass(frozen=True)
class Benchmark:
    """How each row's benchmark is replayed (module docstring): `rounds` rounds of C requests, the first from a
    synchronized start, the others in the steady phase `steady`: "steady", the clients at random phases
    (`out_of_phase_outputs`), or "steady-even", evenly spaced over the cycle (`evenly_spaced_outputs`, so their
    prefills never queue behind each other's: the fifth stage and before)."""

    rounds: int = BENCHMARK_ROUNDS
    steady: str = "steady"

    def __post_init__(self):
        if self.steady not in STEADY_PHASES or not (isinstance(self.rounds, int) and self.rounds >= 1):
            raise InvalidArgumentError(
                f"a benchmark is rounds >= 1 (got {self.rounds!r}) and a steady phase of {STEADY_PHASES} "
                f"(got {self.steady!r})"
            )

    @property
    def phases(self) -> tuple[str, str]:
        return ("first", self.steady)


BENCHMARK = Benchmark()  # the seventh stage's (adopted)
SIXTH_STAGE_BENCHMARK = Benchmark(rounds=20)
FIFTH_STAGE_BENCHMARK = Benchmark(rounds=20, steady="steady-even")  # and every stage before it
AIPERF_DATASET_ENTRIES = 100  # aiperf's default --num-dataset-entries
AIPERF_SEED = 100  # the --random-seed of aiconfigurator's generated benchmark script
# The request-side latency (module docstring): an override of this name (not a StepTimeModel parameter) adds to
# every TTFT the fixed time a request spends outside the engine's steps and the step in flight when it arrives
# (engine_profiles.REQUEST_TERM: the profile's term that predict, max-rate and slo price the same way).


def step_model(row: VllmRow, overrides: dict) -> StepTimeModel:
    """The row's StepTimeModel with these parameters (REQUEST_TERM, not a step parameter, left out)."""
    step = {k: v for k, v in overrides.items() if k != REQUEST_TERM}
    if row.dp > 1:  # one DP rank of an attention-DP row (`attention_dp_comparison`)
        step["data_parallel"] = row.dp
    if block_rows := expert_block_rows(row):  # the kernel the row's vLLM ran its experts with
        step.setdefault("expert_block_rows", block_rows)
    return from_specs(MODELS[row.model], GPUS[row.gpu], row.tp, row.weight_dtype, KV_DTYPE, **step)


def request_latency(overrides: dict, durations: np.ndarray, arrival: np.ndarray):
    """What REQUEST_TERM adds to each request's TTFT: 0 without it; with it, its fixed seconds plus the step in
    flight when the request reaches the engine, taken as long as the step whose end the simulated request
    arrived at (durations[arrival - 1]; nothing at arrival 0, an idle engine). A closed-loop client sends its
    next request when the last token of its previous one reaches it: by then the engine has started the next
    step without it (the simulator, which admits it at that step, misses this wait). The fixed part is the
    serving front end's (HTTP, prompt tokenization, hand-off to the engine, the first token's way back).
    durations: float64 [steps]; arrival: int64 [requests], steps ended when each request arrived. The one
    definition, `core.serving.latency.request_side_seconds`, is what predict / max-rate / slo add too."""
    if REQUEST_TERM not in overrides:
        return 0.0
    return request_side_seconds(overrides[REQUEST_TERM], durations, arrival)


def pool_draws(count: int, pool: int, seed: int = AIPERF_SEED) -> list[int]:
    """Which of `pool` prompts each of `count` requests sends when a benchmark samples its dataset by shuffling:
    a random order of the pool, then another, and so on (aiperf's default "shuffle" sampling)."""
    rng = random.Random(seed)
    draws: list[int] = []
    while len(draws) < count:
        order = list(range(pool))
        rng.shuffle(order)
        draws += order
    return draws[:count]


def _run(row: VllmRow, step, phase: str, prompt_pool: int | None = None):
    """The closed-loop simulation of `row` priced by `step` (a StepTimeModel or anything with its interface) and
    the requests it measures: phase "first" runs one round from a synchronized start (every client sends at 0)
    and measures it; phase "steady" draws the first round's outputs (`out_of_phase_outputs`: each client at a
    random phase of the cycle, as a real server's clients drift apart) and measures requests
    WARMUP_ROUNDS x C to (WARMUP_ROUNDS + MEASURED_ROUNDS) x C; "steady-even" likewise with the clients evenly
    spaced (`evenly_spaced_outputs`: FIFTH_STAGE_BENCHMARK, the fifth stage's replay).

    prompt_pool: None, every prompt unique (the profile's assumption); or N, the prompts drawn from N distinct
    ones (`pool_draws`) and served with vLLM's prefix caching, so a prompt still cached is not prefilled again
    (the what-if of docs/slo.md 2c: a benchmark reusing a dataset of N prompts, as aiperf does by default)."""
    c = row.concurrency
    if phase == "first":
        start, end = 0, c
        lengths = [row.osl] * (2 * c)
    else:
        start, end = WARMUP_ROUNDS * c, (WARMUP_ROUNDS + MEASURED_ROUNDS) * c
        if phase == "steady-even":
            first = evenly_spaced_outputs(c, row.osl)
        else:
            first = out_of_phase_outputs(c, row.osl, PHASE_SEED)
        lengths = first + [row.osl] * end
    if prompt_pool is None:
        requests = [Request(i, 0.0, row.isl, n) for i, n in enumerate(lengths)]
        policy = paged(BLOCK_SIZE, counted=True)
    else:
        draws = pool_draws(len(lengths), prompt_pool)
        requests = [
            Request(i, 0.0, row.isl, n, prefix_group=draws[i], prefix_len=row.isl)
            for i, n in enumerate(lengths)
        ]
        policy = paged(BLOCK_SIZE, enable_prefix_caching=True)
    config = SimulatorConfig(
        kv_capacity_tokens=kv_tokens(row),
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_seq_len=row.isl + row.osl,
        step_time=step,
        max_snapshots=1,
    )
    result = simulate(requests, policy, config, until_finished=end, concurrency=c)
    return result, result.requests.iloc[start:end]


def _means(measured, extra_ttft=0.0) -> tuple[float, float]:
    ttft = measured["first_token_time"] - measured["arrival_time"] + extra_ttft
    tpot = (measured["finish_time"] - measured["first_token_time"]) / (measured["output_len"] - 1)
    return float(ttft.mean()), float(tpot.mean())


def row_benchmark_mean(
    first: tuple[float, float], steady: tuple[float, float], benchmark: Benchmark = BENCHMARK
) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) of `benchmark`, its first round's means `first` and the steady phase's `steady`
    (`core.serving.latency.benchmark_mean` of each)."""
    return tuple(benchmark_mean(f, s, benchmark.rounds) for f, s in zip(first, steady, strict=True))


def predict_row(
    row: VllmRow, overrides: dict, prompt_pool: int | None = None, benchmark: Benchmark = BENCHMARK
) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) in seconds that `row`'s benchmark would measure, simulated with these parameters
    (prompt_pool: `_run`'s; benchmark: how it ran, `Benchmark`)."""
    step = step_model(row, overrides)
    means = []
    for phase in benchmark.phases:
        result, measured = _run(row, step, phase, prompt_pool)
        edges = np.concatenate([[0.0], result.steps["time_s"].to_numpy(np.float64)])
        arrival = _step_index(edges, measured["arrival_time"].to_numpy(np.float64))
        means.append(_means(measured, request_latency(overrides, np.diff(edges), arrival)))
    return row_benchmark_mean(*means, benchmark)


def prefill_fraction_of_peak(row: VllmRow) -> float:
    """The dense FLOP/s the row's measured throughput implies for prefilling its prompts alone, over its GPUs'
    datasheet peak in the weights' dtype: C / (TTFT + (OSL - 1) x TPOT) requests a second, each ISL tokens at 2 x
    the parameters active per token. A benchmark whose prompts were all computed cannot exceed ~1 (no vLLM step
    reaches its GPU's peak); a high value says its prompts were (partly) served from the prefix cache."""
    rate = row.concurrency / (row.ttft_s + (row.osl - 1) * row.tpot_s)
    per_gpu = step_model(row, {}).peak_flops  # the step-time model's peak for the row's weights (FP8 or bf16)
    return rate * row.isl * 2.0 * MODELS[row.model].num_params_active / (per_gpu * row.tp)


class _RecordingStep:
    """A StepTimeModel that records the load of every step it prices, in the order priced: new tokens, keys read,
    attention pairs, sampled tokens, and the prefill chunks' pairs and prior context (`PrefillLoad`: what an MLA
    model prices apart; the simulator gives them through `step_load_seconds`)."""

    def __init__(self, step: StepTimeModel):
        self.step = step
        self.kv_bytes_per_token = step.kv_bytes_per_token
        self.swap_bandwidth = step.swap_bandwidth
        self.loads: list[tuple[np.ndarray, ...]] = []

    def step_load_seconds(self, load, swap_bytes=0.0):
        if swap_bytes:
            raise AssertionError("a replay cannot re-price swaps (the rows run with preemption by recompute)")
        prefill = PrefillLoad(
            load.attention_pairs - load.decode_context_tokens - load.decode_tokens,
            load.kv_tokens_read - load.decode_context_tokens,
        )
        values = (load.new_tokens, load.kv_tokens_read, load.attention_pairs, load.output_tokens, *prefill)
        self.loads.append(tuple(np.array([v], dtype=np.float64) for v in values))
        return self.step.step_seconds(
            load.new_tokens,
            load.kv_tokens_read,
            load.attention_pairs,
            output_tokens=load.output_tokens,
            prefill=prefill,
        )

    def step_time(self, new_tokens, kv_read, pairs=0.0):
        """Decode-only steps (the simulator's batched decode runs): no prefill part."""
        arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (new_tokens, kv_read, pairs)))
        none = np.zeros_like(arrays[0])
        self.loads.append((*arrays, arrays[0], none, none))
        return self.step.step_time(new_tokens, kv_read, pairs)


class RowReplay:
    """One row simulated once per phase, re-priced for any parameters (module docstring: why that is exact).

    For each phase: the recorded step loads (new tokens, keys read, attention pairs, sampled tokens, the prefill
    chunks' pairs and prior context; float64 [steps]) and, per measured request, the number of steps that had ended when it arrived, got its first token
    and finished (int64 [requests]; its times are the cumulative step times there)."""

    def __init__(self, row: VllmRow, record_with: dict | None = None):
        self.row = row
        self.record_with = record_with or {}  # the parameters the recording simulation prices its steps with
        self.phases: dict = {}  # phase -> its recording, made the first time it is priced

    def latencies(self, overrides: dict, benchmark: Benchmark = BENCHMARK) -> tuple[float, float]:
        """(mean TTFT, mean TPOT) in seconds, as `predict_row` computes them, with these parameters and
        `benchmark`."""
        return row_benchmark_mean(*(self.phase_latencies(overrides, p) for p in benchmark.phases), benchmark)

    def phase_latencies(self, overrides: dict, phase: str) -> tuple[float, float]:
        """(mean TTFT, mean TPOT) in seconds of one phase ("first", "steady" or "steady-even") with these
        parameters; "steady" is what `predict --concurrency` estimates (a steady state of clients out of phase)."""
        step = step_model(self.row, overrides)
        if phase not in self.phases:
            self.phases[phase] = _record(self.row, phase, self.record_with)
        loads, (arrival, first, finish) = self.phases[phase]
        durations = step.step_time(*loads[:3], output_tokens=loads[3], prefill=PrefillLoad(*loads[4:]))
        clock = np.concatenate([[0.0], np.cumsum(durations)])
        ttft = clock[first] - clock[arrival] + request_latency(overrides, durations, arrival)
        tpot = (clock[finish] - clock[first]) / (self.row.osl - 1)
        return float(ttft.mean()), float(tpot.mean())


def _record(row: VllmRow, phase: str, record_with: dict):
    """(loads, (arrival, first, finish) step indices) of one phase of `row` (RowReplay), simulated with the
    parameters `record_with` (any: in a closed loop the schedule does not depend on them)."""
    recorder = _RecordingStep(step_model(row, record_with))
    result, measured = _run(row, recorder, phase)
    loads = tuple(np.concatenate(parts) for parts in zip(*recorder.loads, strict=True))
    ends = result.steps["time_s"].to_numpy(np.float64)
    if len(ends) != len(loads[0]):
        raise AssertionError(f"{len(loads[0])} steps priced, {len(ends)} recorded: cannot replay")
    edges = np.concatenate([[0.0], ends])
    names = ("arrival_time", "first_token_time", "finish_time")
    return loads, tuple(_step_index(edges, measured[n].to_numpy(np.float64)) for n in names)


def _step_index(edges: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Index into edges (0, then each step's end) of each time, which must be one of them."""
    index = np.searchsorted(edges, times)
    index = np.minimum(index, len(edges) - 1)
    if not np.allclose(edges[index], times, rtol=1e-12, atol=1e-12):
        raise AssertionError("a request time is not a step end: cannot replay")
    return index
