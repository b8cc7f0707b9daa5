"""What a finite closed-loop benchmark of a deployment reports (`benchmark_means`), beside the steady state that
`predict` estimates.

A steady-state prediction is what a long run converges to. A benchmark as engineers run one (aiperf
`--concurrency C --request-count N`, `vllm bench serve --max-concurrency C --num-prompts N`) is N / C rounds long
and starts synchronized: all C clients send at once (aiperf starts its measured phase when every warm-up
response is in), so the first round's C prompts queue for the prefill budget and, at many clients, its TTFT is
several times the steady state's. The benchmark's mean is `core.serving.latency.benchmark_mean` of that round and
the steady state: the round is simulated here on one replica with its share of the clients, from a synchronized
start, priced as `predict` prices its steady state (the same replica, step model and request-side seconds).
This is how the vLLM profile's fit replays the published rows (`core.planning.cost.fits.published_vllm`, its
"first" phase), so `predict --concurrency C --benchmark-requests N` answers what such a row measured, where the
steady state alone cannot (docs/slo.md 2c).

    p = predict(deployment, Load(None, 1024, 1024, concurrency=64))
    benchmark_means(p, 640)["mean_ttft_s"]      # a benchmark of 10 rounds
"""

import numpy as np

from core.errors import InvalidArgumentError
from core.fields import InputField
from core.planning.predict.load import Load
from core.planning.predict.prediction import Prediction, add_request_side
from core.planning.predict.replica_sim import caches_prefixes, replica_config, replica_policy
from core.serving.latency import benchmark_mean, request_latencies
from core.serving.simulator import simulate

BENCHMARK_FIELD = InputField(
    "benchmark_requests",
    "--benchmark-requests",
    None,
    "int",
    None,
    "Requests of a finite benchmark",
    "requests of a finite closed-loop benchmark from a synchronized start (aiperf --request-count); adds its "
    "mean TTFT and TPOT beside the steady state (--concurrency only)",
    "requests",
    minimum=1,
    maximum=1 << 30,
    optional=True,
)


def first_round_means(prediction: Prediction) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) in seconds of a closed loop's first round from a synchronized start: one replica's
    clients (`Load.per_replica`) all send at 0 and the round's requests are measured while the clients go on
    sending (`simulate(..., until_finished=C)`), on the replica `predict` sized and priced (`Prediction.replica`),
    with the engine profile's request-side seconds as `predict` adds them."""
    deployment, load, replica = prediction.deployment, prediction.load, prediction.replica
    if replica is None:
        raise InvalidArgumentError("a benchmark's first round needs the Prediction that predict() returns")
    share = load.per_replica(deployment.ranks)
    clients = share.concurrency
    config = replica_config(deployment, replica.step, replica.kv_tokens, load.max_len, replica.offload)
    policy = replica_policy(deployment, caches_prefixes(deployment, load))
    result = simulate(
        share.requests(2 * clients), policy, config, until_finished=clients, concurrency=clients
    )
    if replica.request_overhead_s is not None:
        add_request_side(result, replica.request_overhead_s, closed_loop=True)
    latencies = request_latencies(result.requests.iloc[:clients])
    return float(np.nanmean(latencies["ttft"])), float(np.nanmean(latencies["tpot"]))


def check_benchmark_requests(load: Load, requests: int) -> int:
    """`requests` as a benchmark of `load` takes it (an int >= the clients). Raises InvalidArgumentError for an
    open loop (a rate: no rounds), chats (turns > 1: a chat's later turns wait for its earlier ones, so its clients
    never start a round together) or fewer requests than clients (no full round)."""
    if load.concurrency is None:
        raise InvalidArgumentError(
            f"{BENCHMARK_FIELD.flag} needs a closed loop (--concurrency C): a Poisson rate has no rounds"
        )
    if load.turns > 1:
        raise InvalidArgumentError(
            f"{BENCHMARK_FIELD.flag} is for one-turn requests: a chat's later turns wait for its earlier ones, so "
            "its clients never start a round together (use --turns 1)"
        )
    requests = BENCHMARK_FIELD.check(requests)
    if requests < load.concurrency:
        raise InvalidArgumentError(
            f"{BENCHMARK_FIELD.flag} must be at least the clients ({load.concurrency}: one round), got {requests}"
        )
    return requests


def benchmark_means(prediction: Prediction, requests: int) -> dict:
    """What a benchmark of `requests` requests at the prediction's concurrency reports as its means (module
    docstring): {"requests", "rounds" (requests / clients), "first_round_mean_ttft_s", "first_round_mean_tpot_s",
    "mean_ttft_s", "mean_tpot_s"}, seconds; the means `benchmark_mean` of the first round and the prediction's
    steady state. Raises InvalidArgumentError as `check_benchmark_requests`."""
    load = prediction.load
    requests = check_benchmark_requests(load, requests)
    rounds = requests / load.concurrency
    ttft, tpot = first_round_means(prediction)
    steady = prediction.metrics
    return {
        "requests": requests,
        "rounds": rounds,
        "first_round_mean_ttft_s": ttft,
        "first_round_mean_tpot_s": tpot,
        "mean_ttft_s": benchmark_mean(ttft, steady["mean_ttft_s"], rounds),
        "mean_tpot_s": benchmark_mean(tpot, steady["mean_tpot_s"], rounds),
    }
