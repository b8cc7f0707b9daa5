"""`python -m bench.slo --quick --server vllm`: the latency prediction held to a real vLLM (its CPU build, the
`.venv-vllm` of `core.serve.vllm_env`) serving SmolLM2-135M-Instruct in bf16 on this machine.

1. The bench starts its own `vllm serve` (`core.serve.vllm_server.VLLMServer`) on loopback, with bench.slo's
   `--threads` OpenMP threads (1 by default) at its `--nice` niceness (-10 where allowed: on a shared 2-core
   machine a step whose two threads wait on each other while another process holds a core takes seconds, not
   tens of ms; the roofs are measured with as many threads): block size 32,
   VLLM_CPU_KVCACHE_SPACE=1 with the KV cache vLLM sizes itself (no block override; `num_gpu_blocks` read back from
   /metrics), max_num_seqs MAX_NUM_SEQS, max_num_batched_tokens MAX_NUM_BATCHED_TOKENS, prefix caching as vLLM's
   default (the random prompts share nothing).
2. Roofs: this machine's copy bandwidth and bf16 matmul FLOP/s (`core.planning.cost.cpu_roofline.measure_roofs`; vLLM
   computes in bf16, whose matmuls run ~3-4x float32's here with AVX-512 BF16: a float32 roof left the fit's
   FLOP/s efficiency at its bound of 1 and priced prefills 3x too slow), the roofline of the model's bf16 weights
   and KV (`engine_step_model`); the bench itself at the same niceness as the server.
3. Sweep (`bench.slo_vllm_sweep`): vLLM's steps measured from outside as for any vLLM, lockstep decode batches of
   1-16 and lone prefills. A sweep runs before the first rate and after the last; the fit
   (`core.planning.cost.fits.step_fit.fit_step_time`, bench.slo's CPU_FIT) is on both.
4. Validation (no fitting): `vllm bench serve` (the wheel's CLI) at three Poisson rates, 0.25, 0.5 and 0.75 of the
   fit's throughput bound (`analytic_bounds`; the third near the knee), random prompts of 56 +- 70 % tokens and
   outputs of 24 +- 70 % (`--random-range-ratio 0.7`: prompts 16-96, outputs 7-41), `--ignore-eos`,
   `--save-detailed`: each request's send time, lengths, TTFT and end-to-end latency come back, and the lab's
   simulator (core.sched's scheduler at the server's limits, paged KV at its num_gpu_blocks x 32 tokens, the
   fitted step time) replays the same arrivals and lengths. Both sides' percentiles are
   `core.serving.latency.latency_summary` of the requests' times (vLLM's own p50 / p99 are kept beside them).

Prints bench.slo's JSON keys (machine, roofs, sweep_steps, rates with the measured and predicted TTFT / TPOT
p50 / p95 / p99, throughput, `*_rel_err`, step_time_measured_over_predicted is absent: vLLM's steps are not
visible from outside; `worst`, wall_s) plus server (the vLLM and its cache), and per rate what says where a miss
comes from (`bench.slo_vllm_limits`: tpot_by_batch, prediction_band, engine_steps).
"""

import functools
import json
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bench.machine import machine_facts
from bench.slo import SIZES, compare, fit, raise_priority, worst_errors
from bench.slo_vllm_limits import engine_steps, mean_tpot, prediction_band, scrape, tpot_by_batch
from bench.slo_vllm_sweep import SWEEP_LEVELS, sweep
from core.kernels.cpu_isa import cpu_description
from core.live.metrics import parse_vllm_metrics
from core.planning.catalog.models import ModelSpec
from core.planning.cost.cpu_roofline import engine_step_model, measure_roofs
from core.planning.search.slo_eval import analytic_bounds
from core.serve.vllm_env import find_vllm
from core.serve.vllm_server import VLLMServeConfig, VLLMServer
from core.serving.memory_policies import paged
from core.serving.sim_result import SimulationResult
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import Request

BLOCK_SIZE = 32
MAX_NUM_SEQS = 16
MAX_NUM_BATCHED_TOKENS = 256
MAX_MODEL_LEN = 2048
INPUT_LEN, OUTPUT_LEN, RANGE_RATIO = 56, 24, 0.7
SEED = 7  # `vllm bench serve --seed`: its prompts, lengths and arrivals


@dataclass(frozen=True)
class Client:
    """The load generator: `vllm bench serve`, writing its detailed results under `out`, at niceness `nice`
    (None: the bench's own, which it inherits; a higher value than the server's makes it yield the server's
    reserved core to vLLM's scheduler and API server when both are ready)."""

    out: Path
    nice: int | None = None

    def serve(self, server: VLLMServer, model_dir: str, rate: float, num: int) -> dict:
        """`vllm bench serve` at `rate` (Poisson), its saved detailed result."""
        argv, name = bench_serve_argv(server, model_dir, rate, num, self.out)
        env = {
            "PATH": "/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "OMP_NUM_THREADS": "1",
        }
        renice = None if self.nice is None else functools.partial(_renice, self.nice)
        run = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env, preexec_fn=renice)
        if run.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {run.stdout[-1500:]} {run.stderr[-1500:]}")
        return json.loads((self.out / name).read_text())


def _renice(nice: int) -> None:
    current = os.nice(0)
    if nice > current:  # raising niceness needs no privilege
        os.nice(nice - current)


def bench_serve_argv(
    server: VLLMServer, model_dir: str, rate: float, num: int, out: Path
) -> tuple[list, str]:
    """`vllm bench serve`'s command line at `rate` (Poisson) for `num` requests, and its result file's name."""
    name = f"rate-{rate:.4f}.json"
    argv = [
        str(find_vllm().command),
        "bench",
        "serve",
        "--base-url",
        server.url,
        "--model",
        server.config.served_name,
        "--tokenizer",
        model_dir,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--random-range-ratio",
        str(RANGE_RATIO),
        "--num-prompts",
        str(num),
        "--request-rate",
        f"{rate:.6g}",
        "--ignore-eos",
        "--seed",
        str(SEED),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,95,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out),
        "--result-filename",
        name,
        "--disable-tqdm",
    ]
    return argv, name


def measured_requests(result: dict) -> pd.DataFrame:
    """The requests' times as core.serving.latency reads them, from the detailed result (seconds from the first
    send)."""
    start = np.array(result["start_times"], dtype=np.float64)
    arrival = start - start.min()
    return pd.DataFrame(
        {
            "arrival_time": arrival,
            "first_token_time": arrival + np.array(result["ttfts"], dtype=np.float64),
            "finish_time": arrival + np.array(result["latencies"], dtype=np.float64),
            "output_len": np.array(result["output_lens"], dtype=np.int64),
            "prompt_len": np.array(result["input_lens"], dtype=np.int64),
        }
    )


def predict(measured: pd.DataFrame, model, kv_tokens: int) -> SimulationResult:
    requests = [
        Request(i, float(r.arrival_time), int(r.prompt_len), int(r.output_len))
        for i, r in enumerate(measured.itertuples())
    ]
    config = SimulatorConfig(
        kv_capacity_tokens=kv_tokens,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_seq_len=MAX_MODEL_LEN,
        step_time=model,
        max_snapshots=1,
    )
    return simulate(requests, paged(BLOCK_SIZE), config)


def _replay(measured: pd.DataFrame, kv_tokens: int):
    """model -> the predicted requests of `measured`'s arrivals replayed with that step-time model."""
    return lambda model: predict(measured, model, kv_tokens).requests


def _requests_for_bound(num: int, seed: int) -> list[Request]:
    """Lengths like the validation's (uniform over vLLM's random-dataset ranges) for the throughput bound."""
    rng = np.random.default_rng(seed)
    low_in, high_in = int(INPUT_LEN * (1 - RANGE_RATIO)), int(np.ceil(INPUT_LEN * (1 + RANGE_RATIO)))
    low_out, high_out = int(OUTPUT_LEN * (1 - RANGE_RATIO)), int(np.ceil(OUTPUT_LEN * (1 + RANGE_RATIO)))
    return [
        Request(i, 0.0, int(rng.integers(low_in, high_in + 1)), int(rng.integers(low_out, high_out + 1)))
        for i in range(num)
    ]


def _drift(before: pd.DataFrame, after: pd.DataFrame) -> float | None:
    """Median over the decode levels of the after sweep's median step over the before sweep's: how much the
    machine's speed changed while the rates ran."""
    ratios = []
    for level in SWEEP_LEVELS:
        a = after[(after.kind == "decode") & (after.new_tokens == level)]["seconds"]
        b = before[(before.kind == "decode") & (before.new_tokens == level)]["seconds"]
        if len(a) and len(b):
            ratios.append(float(np.median(a) / np.median(b)))
    return float(np.median(ratios)) if ratios else None


def _cpu_now(server: VLLMServer) -> tuple[dict[str, float], float]:
    """The server's processes' CPU seconds so far, and this process's children's (`vllm bench serve`, waited for)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return server.cpu_seconds(), children.ru_utime + children.ru_stime


def _cpu_use(server: VLLMServer, since: tuple[dict[str, float], float], seconds: float) -> dict[str, float]:
    """Cores each of the server's processes, the benchmark client and this bench (its sweep clients) used on
    average over the last `seconds` (CPU seconds since `since` / wall seconds): on 2 cores, what the engine core
    shares its cores with at each rate."""
    (server_then, children_then), (server_now, children_now) = since, _cpu_now(server)
    used = {name: (server_now[name] - server_then.get(name, 0.0)) / seconds for name in server_now}
    used["vllm bench serve"] = (children_now - children_then) / seconds
    return {name: round(cores, 4) for name, cores in used.items()}


def compare_rates(results: list, used, kv_tokens: int, steps: dict | None = None, band=None) -> dict:
    """{rate: the measured and predicted percentiles, their errors, and vLLM's own figures} for each
    (rate, fraction, requests, `vllm bench serve` result, seconds) of `results`, predicted with the fit `used`;
    steps: per rate, the engine steps vLLM counted and its worker's CPU (`bench.slo_vllm_limits.engine_steps`), set beside the
    replay's steps and their mean predicted time; band: (the sweep's rows, the base model) for each rate's
    `prediction_band`."""
    rates = {}
    for rate, fraction, served, result, serve_s in results:
        measured = measured_requests(result)
        predicted = predict(measured, used.model, kv_tokens)
        row = compare(measured, predicted.requests)
        if steps is not None and f"{rate:.3f}" in steps:
            seconds = predicted.steps["step_time_ms"].to_numpy() / 1e3
            row["engine_steps"] = steps[f"{rate:.3f}"] | {
                "predicted_steps": len(seconds),
                "predicted_mean_step_s": float(seconds.mean()),
                "client_mean_tpot_s": mean_tpot(measured),
                "predicted_mean_tpot_s": mean_tpot(predicted.requests),
            }
        vllm_own = {
            k: result[k] / 1e3 for k in result if k.startswith(("p50_", "p95_", "p99_")) and k.endswith("_ms")
        }
        rates[f"{rate:.3f}"] = {
            "rate_req_per_s": rate,
            "fraction_of_bound": fraction,
            "requests": served,
            "completed": result["completed"],
            "serve_s": serve_s,
            "fit": used.to_dict(),
            "vllm_bench_serve_s": vllm_own,
            "vllm_output_throughput": result["output_throughput"],
            "tpot_by_batch": tpot_by_batch(measured, predicted),
            **(
                {"prediction_band": prediction_band(band, measured, _replay(measured, kv_tokens))}
                if band
                else {}
            ),
            **row,
        }
    return rates


def _serve_rates(server, folder: str, size: dict, capacity_rps: float, client: Client, record: tuple) -> list:
    """`vllm bench serve` at each of the mode's rates (fractions of `capacity_rps`): per rate (rate, fraction,
    requests, result, seconds); `record` = (cpu, loads, steps): each rate's cores used, the load average after it
    and its engine steps (`bench.slo_vllm_limits.engine_steps`)."""
    cpu, loads, steps = record
    results = []
    for fraction, served in zip(size["rates"], size["requests"], strict=True):
        rate = fraction * capacity_rps
        t, at, scraped = time.perf_counter(), _cpu_now(server), scrape(server)
        result = client.serve(server, folder, rate, served)
        results.append((rate, fraction, served, result, time.perf_counter() - t))
        cpu[f"{rate:.3f}"] = _cpu_use(server, at, results[-1][-1])
        steps[f"{rate:.3f}"] = engine_steps(server, at[0], scraped)
        loads.append(os.getloadavg())
    return results


def _server_facts(
    config: VLLMServeConfig, num_gpu_blocks: int, niceness: tuple, bind: bool, log_tail
) -> dict:
    """niceness: (the server's, the client's: None when it inherits the bench's)."""
    return {
        "kind": "vllm",
        "vllm": find_vllm().version,
        "model": "SmolLM2-135M-Instruct bf16",
        "block_size": BLOCK_SIZE,
        "num_gpu_blocks": num_gpu_blocks,
        "kv_cache_space_gib": config.kv_cache_space_gib,
        "threads": config.threads,
        "nice": niceness[0],
        "client_nice": niceness[1],
        "bind": bind,
        "bench_affinity": sorted(os.sched_getaffinity(0)),
        "log_tail": log_tail,
    }


def _raw_rows(before: pd.DataFrame, after: pd.DataFrame, results: list) -> dict:
    """The sweeps' rows and each rate's measured requests, as saved beside the figures."""
    return {
        "sweep_rows": {"before": before.to_dict(orient="list"), "after": after.to_dict(orient="list")},
        "measured_requests": {
            f"{rate:.3f}": measured_requests(result).to_dict(orient="list")
            for rate, _, _, result, _ in results
        },
    }


def serve_config(folder: str, args) -> VLLMServeConfig:
    """The bench's vLLM: the lab's limits, `--threads` OpenMP threads at `--nice`, pinned as vLLM pins (`--bind`)."""
    return VLLMServeConfig(
        model_dir=folder,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        threads=args.threads,
        nice=args.nice,
        bind_threads=args.bind,
    )


def main(args) -> None:
    from core.engine.fetch import fetch_model, model_cache_dir
    from core.engine.hf_export import export_hf_folder

    started = time.perf_counter()
    size = SIZES["quick" if args.quick else "full"]
    torch.set_num_threads(args.threads)
    folder = str(
        export_hf_folder(fetch_model("smollm2-135m-instruct"), model_cache_dir() / "SmolLM2-135M-Instruct-hf")
    )
    spec = ModelSpec.from_hf_config(json.loads((Path(folder) / "config.json").read_text()), name="smollm2")
    config = serve_config(folder, args)
    load_before = os.getloadavg()
    loads: list[tuple[float, float, float]] = []
    niceness_bench = raise_priority(args.nice)
    if args.bind:  # vLLM's auto binding puts its OpenMP thread on the first core and reserves the last
        os.sched_setaffinity(0, {os.cpu_count() - 1})
    roofs = measure_roofs(matmul_dtype="bfloat16")
    base = engine_step_model(spec.shape, weight_bytes=2.0 * spec.num_params, dtype_bytes=2, roofs=roofs)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="slo-vllm-") as tmp, VLLMServer(config) as server:
        niceness = server.niceness
        metrics = parse_vllm_metrics(server.get("/metrics").decode())
        kv_tokens = int(metrics.num_gpu_blocks) * BLOCK_SIZE
        t, before_cpu = time.perf_counter(), _cpu_now(server)
        before = sweep(server.url, config.served_name, rng, spec.vocab_size)
        sweep_s = [time.perf_counter() - t]
        first_fit = fit(before, base, args.robust)
        requests = _requests_for_bound(max(size["requests"]), 0)
        bound = analytic_bounds(first_fit.model, requests, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, kv_tokens)
        cpu = {"sweep_before": _cpu_use(server, before_cpu, sweep_s[0])}
        client = Client(Path(tmp), args.client_nice)
        steps: dict = {}
        results = _serve_rates(server, folder, size, bound.capacity_rps, client, (cpu, loads, steps))
        t = time.perf_counter()
        after = sweep(server.url, config.served_name, rng, spec.vocab_size)
        sweep_s.append(time.perf_counter() - t)
        log_tail = server.log_tail(3)
    fitted_on = pd.concat([before, after], ignore_index=True)
    used = first_fit if args.fit_once else fit(fitted_on, base, args.robust)
    rates = compare_rates(results, used, kv_tokens, steps, (before if args.fit_once else fitted_on, base))
    decode = np.median(before[before.kind == "decode"]["seconds"]) if len(before) else None
    drift = _drift(before, after)
    print(
        json.dumps(
            {
                "cpu": cpu_description(),
                "machine": machine_facts(load_before, torch=torch.__version__, load_average_during=loads),
                "server": _server_facts(
                    config, int(metrics.num_gpu_blocks), (niceness, args.client_nice), args.bind, log_tail
                ),
                "model": "SmolLM2-135M-Instruct bf16 (vLLM)",
                "mode": "quick" if args.quick else "full",
                "fit_once": args.fit_once,
                "robust_fit": args.robust,
                "limits": {
                    "max_num_seqs": MAX_NUM_SEQS,
                    "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
                    "kv_tokens": kv_tokens,
                },
                "roofs": roofs,
                "roofs_after": measure_roofs(matmul_dtype="bfloat16"),
                "bench_nice": niceness_bench,
                "sweep_steps": len(before),
                "sweep_s": sweep_s,
                "sweep_decode_median_s": decode,
                "sweep_drift_after_over_before": drift,
                "throughput_bound_req_per_s": bound.capacity_rps,
                "cpu_cores_used": cpu,
                "requests_per_rate": list(size["requests"]),
                "rates": rates,
                "worst": worst_errors(rates),
                "wall_s": time.perf_counter() - started,
                **_raw_rows(before, after, results),
            },
            indent=2,
        )
    )
