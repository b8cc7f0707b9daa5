"""Prediction against observation on our engine: fit the step-time model on sweeps of the engine's own steps,
then serve a Poisson workload through `Engine` at three rates and compare the measured latency with the
simulator's prediction for the same arrivals.

    python -m bench.slo --quick        # ~4.5 minutes on the 2-core machine (more when it is shared)
    python -m bench.slo                # three times the requests per rate, longer sweeps
    python -m bench.slo --quick --server vllm   # the same against a real vLLM (bench/slo_vllm.py)

Model: SmolLM2-135M-Instruct (the real model, `core.engine.fetch`), float32 on the CPU, `--threads` torch threads
(1 by default: on a shared 2-core machine one thread keeps each step's time its own; two threads wait on each
other whenever another process takes a core), at niceness PRIORITY_NICE when allowed (`--nice 0`: as started).

1. Roofs: the machine's memory bandwidth (a 256 MiB `copy_`, read + write bytes) and FLOP/s (a 1,536^3 float32
   matmul), best of a few, measured in this run: the step-time model's memory_bandwidth and peak_flops.
2. Sweep (`calibrate`): a closed loop without a clock, SWEEP_LEVELS requests kept in flight (1..8, then 10..16),
   `steps_per_level` steps at each, newcomers' prompts 8-160 tokens and outputs 4-40 (seed 1, the same every
   sweep): every decode batch size the engine runs (on this CPU the step time is not monotonic in it: three
   decodes take 75-93 ms, four 55-65 ms) and decodes mixed with newcomers' prefill chunks, the steps a served
   workload is made of. Every step's load is `core.sched.step_load` of the engine's own scheduled step, its time
   the engine's step_time_ms; the first WARMUP_STEPS are dropped.
3. Fit (`core.planning.cost.fits.step_fit.fit_step_time`, least squares on relative error): bandwidth and FLOP/s
   efficiencies, the per-step overheads of one-token and larger steps, and the small-step factors (the median
   measured / predicted of the sweep's steps of exactly n <= 16 tokens, where it has 4 or more; `CPU_FIT`;
   `sweep_steps_by_size` counts them). Bracketed: a sweep runs
   before the first rate, between the rates and after the last, and each rate's prediction uses the fit on the
   two sweeps around it (other sessions change the machine's speed over minutes; `sweep_drift_after_over_before`
   says by how much). `--fit-once`: the first sweep's fit for both rates. No fit ever sees a validation step.
4. Validation (no fitting): the same seeded requests (prompt 16-96 tokens, output 8-40, uniform; the first 40, 80
   and 120 of them at the three rates in quick mode: each rate serves for about the same time) arriving as a
   Poisson process at three rates (0.25, 0.5 and, near the knee, 0.75 of the first fit's throughput bound): each request is added when the
   wall clock reaches its arrival, the engine steps meanwhile; a request's first token / finish are the wall
   times at which the step() that produced them returned (read from the scheduler's outcome, without
   streaming). The simulator replays the same arrivals with the same scheduler limits (core.sched's Scheduler
   under both) and the fitted model pricing its steps.

Prints one JSON object: machine (niceness, the load average before and after: the machine is shared), roofs
(and roofs_after, measured again at the end), sweep_steps and sweep_s, per rate the fit used (values, residuals
on its sweeps), serve_s, the measured and predicted TTFT / TPOT p50 / p95 / p99 and throughput with
`ttft_p50_rel_err` ... `tpot_p99_rel_err`, `throughput_rel_err`
(|predicted - measured| / measured) and step_time_measured_over_predicted (the step-time model's own error on the
validation steps), `worst` (the largest of each over the rates, and `max_rel_err`), wall_s.
"""

import argparse
import json
import os
import time

import numpy as np
import pandas as pd
import torch

from bench.machine import machine_facts
from core.kernels.cpu_isa import cpu_description
from core.planning.cost.cpu_roofline import engine_step_model, measure_roofs
from core.planning.cost.fits.step_fit import fit_step_time
from core.planning.cost.step_model import StepTimeModel
from core.planning.search.slo_eval import analytic_bounds
from core.sched import step_load
from core.serving.latency import latency_summary
from core.serving.memory_policies import paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request, poisson_arrivals

BLOCK_SIZE = 16
NUM_BLOCKS = 1024
MAX_NUM_SEQS = 16
MAX_NUM_BATCHED_TOKENS = 256
MAX_SEQ_LEN = 256
# rates as fractions of the fitted throughput bound (a light load, a middling one and one near the knee, 0.75 of
# an upper bound on the throughput: requests queue for their prefill), the requests served at each (in proportion
# to the rate: every rate serves for the same ~53 s (quick), so the knee's p95 / p99 rest on 120 requests, not on
# the two slowest of 40), sweep steps per level
SIZES = {
    "quick": {"requests": (40, 80, 120), "steps_per_level": 6, "rates": (0.25, 0.5, 0.75)},
    "full": {"requests": (120, 240, 360), "steps_per_level": 20, "rates": (0.25, 0.5, 0.75)},
}
METRICS = ("ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "tpot_p99")
# Niceness the bench asks for: the machine is shared, and at the default niceness a process that another one
# preempts has steps ~2x slower at random (fit residuals of 20%, p95s off by 50% at a load average of 3-4).
# Raised, its one thread keeps a core while the others share the rest; memory bandwidth stays shared. Both the
# sweep and the validation run at it; `--nice 0` measures as started, the JSON records what was in effect.
PRIORITY_NICE = -10
# One-token steps get their own overhead: a lone decode runs matrix-vector kernels (~37 ms here), any larger step
# matrix-matrix kernels that pack the weights first (~60 ms for 2-8 decodes). The per-token overhead is left at 0:
# on this CPU it is collinear with the FLOP/s roof (both grow with the step's tokens), and the engine's host time
# per token is under 0.1 ms (its host_ms column). small_step_factors: steps of 2-16 tokens are not monotonic in
# time (three decodes 1.22-1.32x the roofline fit, four 0.9x: the matrix kernels' M dimension), so each size gets
# its measured ratio (core.planning.cost.step_model's module docstring).
CPU_FIT = (
    "bandwidth_efficiency",
    "flops_efficiency",
    "overhead_s",
    "single_token_overhead_s",
    "small_step_factors",
)
SIZES_REPORTED = 16  # steps of 1..16 tokens: the decode batches (max_num_seqs) the factors cover


def raise_priority(nice: int) -> int:
    """Run at niceness `nice` when allowed (a negative value needs root); returns the niceness in effect."""
    current = os.nice(0)
    if nice < current:
        try:
            return os.nice(nice - current)
        except PermissionError:
            return current
    return current


class StepLog:
    """Wraps the engine's scheduler so that every scheduled step's load (`step_load`), every first admission (at
    the wall time the step started) and the requests whose first token each step produced are recorded (the
    engine is not asked to stream, which would add detokenisation to every step)."""

    def __init__(self, engine):
        self.loads: list = []
        self.admitted: dict = {}
        self.first_token: list = []  # request ids whose prefill the last step finished
        scheduler = engine.scheduler
        schedule, postprocess = scheduler.schedule, scheduler.postprocess

        def logged_schedule():
            started = time.perf_counter()
            step = schedule()
            self.loads.append(step_load(step, scheduler.memory))  # what the driver sets as `step.load`
            for group, start, _ in step.prefill_chunks:
                if start == 0:
                    self.admitted.setdefault(group.request_id, started)
            return step

        def logged_postprocess(step):
            outcome = postprocess(step)
            self.first_token = [g.request_id for g in outcome.first_token]
            return outcome

        scheduler.schedule, scheduler.postprocess = logged_schedule, logged_postprocess


def base_model(engine, roofs: dict) -> StepTimeModel:
    """The roofline of the engine's model on this CPU (`core.planning.cost.cpu_roofline.engine_step_model`): fp32
    weights, efficiencies and overheads to fit."""
    return engine_step_model(
        engine.config.shape, weight_bytes=float(engine.model.weight_bytes), dtype_bytes=4, roofs=roofs
    )


def _prompt(rng, length: int, low: int, vocab: int) -> list[int]:
    return rng.integers(low, vocab, size=length).tolist()


# Requests kept in flight in the sweep: every decode batch size to 8, then every other one up to MAX_NUM_SEQS.
SWEEP_LEVELS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
WARMUP_STEPS = 8


def calibrate(
    engine, log: StepLog, steps_per_level: int, seed: int, low: int, vocab: int, params
) -> pd.DataFrame:
    """Run the sweep; its measured steps (MEASURED_STEP_COLUMNS + output_tokens), the first WARMUP_STEPS dropped.

    A closed loop, no clock: for each level c of SWEEP_LEVELS, `steps_per_level` steps with c requests kept in
    flight (a new one added whenever one finishes; prompts uniform in 8..160 tokens, outputs in 4..40, drawn from
    `seed`), then the rest drained. So the fit sees every decode batch size the engine runs (on this CPU the
    step time is not monotonic in it: three decodes take longer than four) and decodes mixed with the prefill
    chunks of newcomers, the steps a served workload is made of, without any step of the validation."""
    rng = np.random.default_rng(seed)
    engine.reset_metrics()
    first = len(log.loads)
    in_flight = 0
    for level in SWEEP_LEVELS:
        for _ in range(steps_per_level):
            for _ in range(level - in_flight):
                prompt = _prompt(rng, int(rng.integers(8, 161)), low, vocab)
                engine.add_request(prompt, params(int(rng.integers(4, 41))))
            in_flight = max(in_flight, level)
            in_flight -= sum(out.finished for out in engine.step())
    while engine.has_unfinished_requests():
        engine.step()
    steps = engine.current_run().steps
    loads = log.loads[first:]
    frame = pd.DataFrame(
        {
            "new_tokens": [x.new_tokens for x in loads],
            "kv_tokens_read": [x.kv_tokens_read for x in loads],
            "attention_pairs": [x.attention_pairs for x in loads],
            "output_tokens": [x.output_tokens for x in loads],
            "seconds": steps["step_time_ms"].to_numpy() / 1e3,
        }
    )
    return frame.iloc[WARMUP_STEPS:].reset_index(drop=True)  # the first steps warm caches and allocators


def make_requests(num: int, seed: int = 0) -> list[Request]:
    """The validation requests at rate 1 req/s (scale arrival times by 1 / rate): uniform lengths, seeded."""
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(num, 1.0, rng)
    prompts = rng.integers(16, 97, size=num)
    outputs = rng.integers(8, 41, size=num)
    return [Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(num)]


def at_rate(requests: list[Request], rate: float) -> list[Request]:
    return [Request(r.request_id, r.arrival_time / rate, r.prompt_len, r.output_len) for r in requests]


def serve(engine, log: StepLog, requests: list[Request], low: int, vocab: int, params) -> pd.DataFrame:
    """Serve `requests` in wall-clock time; their measured times (REQUEST_TIME_COLUMNS), seconds from the start:
    a request's first token and finish are the times the step() that produced them returned."""
    rng = np.random.default_rng(2)
    prompts = {r.request_id: _prompt(rng, r.prompt_len, low, vocab) for r in requests}
    first, finish = {}, {}
    log.admitted.clear()
    engine.reset_metrics()
    log.loads.clear()
    start = time.perf_counter()
    pending = list(requests)
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0].arrival_time <= now:
            r = pending.pop(0)
            engine.add_request(prompts[r.request_id], params(r.output_len), request_id=r.request_id)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival_time - (time.perf_counter() - start)))
            continue
        log.first_token = []
        outputs = engine.step()
        done = time.perf_counter() - start
        for request_id in log.first_token:
            first.setdefault(request_id, done)
        for out in outputs:
            finish[out.request_id] = done
    return pd.DataFrame(
        {
            "arrival_time": [r.arrival_time for r in requests],
            "admit_time": [log.admitted[r.request_id] - start for r in requests],
            "first_token_time": [first[r.request_id] for r in requests],
            "finish_time": [finish[r.request_id] for r in requests],
            "output_len": [r.output_len for r in requests],
        }
    )


def step_ratio(measured_s: np.ndarray, loads: list, model: StepTimeModel) -> dict:
    """Measured / predicted time of every step of a served run (its step times and `step_load`s), by the model
    it was predicted with: how much of the latency error is the step-time model's (the rest is the schedule's)."""
    n = np.array([x.new_tokens for x in loads], dtype=np.float64)
    kv = np.array([x.kv_tokens_read for x in loads], dtype=np.float64)
    pairs = np.array([x.attention_pairs for x in loads], dtype=np.float64)
    outputs = np.array([x.output_tokens for x in loads], dtype=np.float64)
    ratio = measured_s / model.step_time(n, kv, pairs, output_tokens=outputs)
    decode = np.array([x.prefill_tokens == 0 for x in loads])
    by_size = {
        str(k): {"steps": int((n == k).sum()), "median": float(np.median(ratio[n == k]))}
        for k in range(1, SIZES_REPORTED + 1)
        if (n == k).any()
    }
    return {
        "by_size": by_size,
        "median": float(np.median(ratio)),
        "p10": float(np.percentile(ratio, 10)),
        "p90": float(np.percentile(ratio, 90)),
        "decode_only_median": float(np.median(ratio[decode])),
        "with_prefill_median": float(np.median(ratio[~decode])) if (~decode).any() else None,
        "steps": len(ratio),
    }


def predict(requests: list[Request], model: StepTimeModel) -> pd.DataFrame:
    config = SimulatorConfig(
        kv_capacity_tokens=NUM_BLOCKS * BLOCK_SIZE,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_seq_len=MAX_SEQ_LEN,
        step_time=model,
        max_snapshots=1,
    )
    return simulate(requests, paged(BLOCK_SIZE), config).requests


def compare(measured: pd.DataFrame, predicted: pd.DataFrame) -> dict:
    m, p = latency_summary(measured), latency_summary(predicted)
    out: dict = {}
    for name in METRICS:
        out[f"{name}_s"] = {"measured": m[f"{name}_s"], "predicted": p[f"{name}_s"]}
        out[f"{name}_rel_err"] = abs(p[f"{name}_s"] - m[f"{name}_s"]) / m[f"{name}_s"]
    mt, pt = m["output_throughput_tokens_per_s"], p["output_throughput_tokens_per_s"]
    out["throughput_tokens_per_s"] = {"measured": mt, "predicted": pt}
    out["throughput_rel_err"] = abs(pt - mt) / mt
    out["measured_queue_p95_s"] = m.get("queue_p95_s")
    return out


def fit(frame: pd.DataFrame, base: StepTimeModel, robust: bool):
    return fit_step_time(frame, base, fit=CPU_FIT, robust=robust)


def steps_by_size(frame: pd.DataFrame) -> dict:
    """How many of the fit's steps have exactly n tokens, n = 1..SIZES_REPORTED (what each factor rests on)."""
    counts = frame["new_tokens"].value_counts()
    return {str(k): int(counts.get(k, 0)) for k in range(1, SIZES_REPORTED + 1)}


def drift(before: pd.DataFrame, after: pd.DataFrame) -> float:
    """Median over the steps of after / before seconds: two sweeps of the same seed run the same steps (the
    scheduler is deterministic), so this is how much the machine's speed changed between them."""
    steps = min(len(before), len(after))
    return float(np.median(after["seconds"].to_numpy()[:steps] / before["seconds"].to_numpy()[:steps]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.slo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="40 / 80 / 120 requests at the three rates (default: three times as many, longer sweeps)",
    )
    parser.add_argument(
        "--server",
        choices=("engine", "vllm"),
        default="engine",
        help="engine: our Engine in this process (default); vllm: a real vLLM this bench starts (bench/slo_vllm.py)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the engine (default: %(default)s)"
    )
    parser.add_argument("--fit-once", action="store_true", help="one sweep and fit for both rates")
    parser.add_argument(
        "--robust", action="store_true", help="Huber-reweighted fit (default: plain least squares)"
    )
    parser.add_argument(
        "--bind",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--server vllm: vLLM's default CPU binding (its OpenMP thread on the first core, the last reserved "
        "for its scheduler and API server), this bench and its client on the reserved core (default); "
        "--no-bind: nothing pinned",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=PRIORITY_NICE,
        help="niceness to run at (0: as started; see PRIORITY_NICE)",
    )
    parser.add_argument(
        "--client-nice",
        type=int,
        default=None,
        help="--server vllm: `vllm bench serve`'s niceness (default: the bench's, which it inherits; a higher "
        "value makes the load generator yield the server's core to vLLM's scheduler and API server)",
    )
    return parser


def load_engine():
    """SmolLM2-135M-Instruct (the real model, fetched) in float32 on the CPU under the bench's scheduler limits."""
    from core.engine import Engine
    from core.engine.fetch import fetch_model

    return Engine.from_pretrained(
        fetch_model("smollm2-135m-instruct"),
        dtype=torch.float32,
        device="cpu",
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_snapshots=1,
    )


class Sweeper:
    """The bench's calibration sweeps on one engine: the same seed every time (the same steps, so that drift()
    compares like with like), each sweep's wall time kept."""

    def __init__(self, engine, log: StepLog, steps_per_level: int, params) -> None:
        self.engine, self.log, self.steps_per_level, self.params = engine, log, steps_per_level, params
        self.low = max(engine.tokenizer.all_special_ids or [0]) + 1
        self.vocab = engine.config.vocab_size
        self.frames: list[pd.DataFrame] = []
        self.seconds: list[float] = []

    def __call__(self) -> pd.DataFrame:
        t = time.perf_counter()
        frame = calibrate(self.engine, self.log, self.steps_per_level, 1, self.low, self.vocab, self.params)
        self.seconds.append(time.perf_counter() - t)
        self.frames.append(frame)
        return frame


def serve_rate(
    sweeps: Sweeper, timed: list[Request], fit_once: bool, base: StepTimeModel, robust: bool
) -> dict:
    """Serve `timed` through the engine, fit the step time on the sweeps around it (the first sweep's fit with
    `fit_once`), and compare the measurement with the simulator's prediction of the same arrivals."""
    engine, log = sweeps.engine, sweeps.log
    i = len(sweeps.frames) - 1
    t = time.perf_counter()
    measured = serve(engine, log, timed, sweeps.low, sweeps.vocab, sweeps.params)
    serve_s = time.perf_counter() - t
    served_s = engine.current_run().steps["step_time_ms"].to_numpy() / 1e3
    served_loads = log.loads[-len(served_s) :]
    if fit_once:
        fitted_on, machine_drift = sweeps.frames[0], None
    else:  # bracketed: the sweeps right before and right after this rate
        sweeps()
        fitted_on = pd.concat(sweeps.frames[i : i + 2], ignore_index=True)
        machine_drift = drift(sweeps.frames[i], sweeps.frames[i + 1])
    used = fit(fitted_on, base, robust)
    row = compare(measured, predict(timed, used.model))
    row["step_time_measured_over_predicted"] = step_ratio(served_s, served_loads, used.model)
    return {
        "serve_s": serve_s,
        "sweep_drift_after_over_before": machine_drift,
        "fit": used.to_dict(),
        "sweep_steps_by_size": steps_by_size(fitted_on),
        **row,
    }


def worst_errors(rates: dict) -> dict:
    """Each error's largest over the rates, and the largest of all (`max_rel_err`)."""
    keys = [f"{m}_rel_err" for m in METRICS] + ["throughput_rel_err"]
    worst = {k: max(r[k] for r in rates.values()) for k in keys}
    return worst | {"max_rel_err": max(worst.values())}


def main() -> None:
    args = build_parser().parse_args()
    if args.server == "vllm":
        from bench.slo_vllm import main as vllm_main

        vllm_main(args)
        return
    niceness = raise_priority(args.nice)
    size = SIZES["quick" if args.quick else "full"]
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    from core.engine import SamplingParams

    engine = load_engine()
    load_s = time.perf_counter() - started

    def params(tokens: int):
        return SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    sweeps = Sweeper(engine, StepLog(engine), size["steps_per_level"], params)
    load_before = os.getloadavg()
    requests = make_requests(max(size["requests"]))
    roofs = measure_roofs()
    base = base_model(engine, roofs)
    first_fit = fit(sweeps(), base, args.robust)
    limits = {
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "kv_tokens": NUM_BLOCKS * BLOCK_SIZE,
    }
    bound = analytic_bounds(
        first_fit.model, requests, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, limits["kv_tokens"]
    )
    rates = {}
    for fraction, served in zip(size["rates"], size["requests"], strict=True):
        rate = fraction * bound.capacity_rps
        timed = at_rate(requests[:served], rate)
        row = serve_rate(sweeps, timed, args.fit_once, base, args.robust)
        rates[f"{rate:.3f}"] = {
            "rate_req_per_s": rate,
            "fraction_of_bound": fraction,
            "requests": served,
            **row,
        }
    machine = machine_facts(load_before, torch=torch.__version__, threads=args.threads, nice=niceness)
    report = {
        "cpu": cpu_description(),
        "machine": machine,
        "model": "SmolLM2-135M-Instruct fp32",
        "mode": "quick" if args.quick else "full",
        "fit_once": args.fit_once,
        "robust_fit": args.robust,
        "limits": limits,
        "roofs": roofs,
        "roofs_after": measure_roofs(),
        "sweep_steps": len(sweeps.frames[0]),
        "sweep_s": sweeps.seconds,
        "throughput_bound_req_per_s": bound.capacity_rps,
        "requests_per_rate": list(size["requests"]),
        "rates": rates,
        "worst": worst_errors(rates),
        "load_s": load_s,
        "wall_s": time.perf_counter() - started,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
