"""What the SLO planner's search mode adds to each ranked configuration it shows: the highest Poisson rate it holds
within the targets (`core.planning.predict.max_rate.max_rate` of `core.planning.search.slo.config_deployment`, exactly what
`python -m core.planning max-rate` prints for that deployment, engine and targets) and the `vllm bench serve`
command that replays the workload against it. No streamlit here; the page submits `highest_rates` to the worker
pool through `core.page_models.tasks`.

Invariants: `highest_rates` answers, in order, for the configurations it is given (the page gives those its chart
draws that meet the SLO, at most `MAX_RATE_CONFIGS`); each answer's key is `rate_key` of its configuration (the
deployment and its max_num_seqs), by which the ranked table finds its row.
"""

from collections.abc import Callable
from dataclasses import dataclass

from core.page_models.slo_planner import SloPlannerParams, config_label, disagg_deployment, rate_key
from core.planning.predict.max_rate import max_rate
from core.planning.predict.vllm_bench import bench_num_prompts, in_flight, vllm_bench_serve_command
from core.planning.search.slo import config_deployment
from core.planning.search.slo_eval import SloConfig

# configurations whose highest rate the page computes: those its chart draws that meet the SLO
MAX_RATE_CONFIGS = 3


@dataclass(frozen=True)
class HighestRate:
    """One configuration's highest rate: key (`rate_key`), label (`config_label`), max_req_per_s (0 when even
    the lowest rate tried misses a target), binding (the target the next higher rate missed, or "rate": not
    served), evaluations (predictions the bisection made)."""

    key: tuple
    label: str
    max_req_per_s: float
    binding: str
    evaluations: int


def highest_rates(
    params: SloPlannerParams, configs: tuple[SloConfig, ...], progress: Callable[[float, str], None]
) -> tuple[HighestRate, ...]:
    """`max_rate` of each configuration at the page's lengths and targets, priced as the search priced it (its
    engine and step-time overrides), the bisection starting from the page's rate (the configurations drawn
    meet the SLO there), reporting progress per configuration."""
    cands, load, targets = params.candidates(), params.workload(), params.slo().targets()
    found = []
    for i, config in enumerate(configs):
        progress(i / len(configs), f"configuration {i + 1} of {len(configs)}")
        deployment = config_deployment(params.model, config, cands)
        rate = max_rate(deployment, load, targets, step_time=cands.step_time, holds_at=params.rate)
        found.append(
            HighestRate(
                rate_key(config), config_label(config), rate.max_req_per_s, rate.binding, rate.evaluations
            )
        )
    return tuple(found)


def bench_command(params: SloPlannerParams, config: SloConfig) -> str:
    """The `vllm bench serve` command replaying the page's workload against `config`'s `vllm serve`: its prompts
    sized from the requests in flight (rate x the configuration's median end-to-end latency, a stand-in for the
    mean the search does not keep; all it can run when it does not keep up)."""
    load = params.workload()
    if (
        config.mode == "disagg"
    ):  # the client sees one endpoint: sized on the decode pool, which holds requests
        deployment = disagg_deployment(params, config).decode
    else:
        deployment = config_deployment(params.model, config, params.candidates())
    flying = in_flight(config.simulated and config.stable, config.e2e_p50_s, deployment, load)
    return vllm_bench_serve_command(deployment.model_spec, load, bench_num_prompts(load, flying))
