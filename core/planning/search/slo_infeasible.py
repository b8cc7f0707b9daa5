"""Why a latency SLO cannot be met: the error `plan_slo` raises, naming the target no configuration meets, the
closest configuration and its shortfall (`SloInfeasibleError`'s metric, target, best and ratio), or that nothing
fits in memory."""

from core.errors import SloInfeasibleError
from core.planning.search.slo_candidates import metric_label


def infeasible_error(plan) -> SloInfeasibleError:
    """The error `plan_slo` raises when no configuration of `plan` (a `SloPlan`) meets its SLO: the target no
    configuration meets, with the closest configuration and its shortfall; or, when none fits in memory, that."""
    rate = plan.workload.rate
    feasible = [c for c in plan.configs if c.feasible]
    estimated = [c for c in feasible if c.slo_ratio is not None]  # a dominated row has none (`KvMisses`)
    if not feasible:
        first = plan.configs[0] if plan.configs else None
        detail = f" The smallest tried, {first.num_gpus} x {first.gpu_name}: {first.reason}" if first else ""
        return SloInfeasibleError(
            f"no candidate fits {plan.model} in memory with requests of {plan.workload.max_len:,} tokens "
            f"(up to {plan.candidates.max_gpus} GPUs of {', '.join(g for g, _ in plan.candidates.gpu_specs())})."
            f"{detail} Allow more GPUs, fp8 weights or shorter requests.",
            "memory",
            None,
            None,
            None,
            plan,
        )
    closest = min(estimated, key=lambda c: c.slo_ratio)
    layout = f"tp {closest.tp}, pp {closest.pp}"
    if closest.mode == "disagg":
        layout = (
            f"{closest.prefill_workers} prefill x tp {closest.prefill_tp} + {closest.decode_workers} decode "
            f"x tp {closest.decode_tp}"
        )
    where = (
        f"{closest.num_gpus} x {closest.gpu_name} ({layout}, max_num_seqs {closest.max_num_seqs}, KV "
        f"{closest.kv_dtype})"
    )
    if closest.limiting_metric == "rate":
        best = rate / closest.slo_ratio
        how = "simulated" if closest.simulated else "an upper bound"
        return SloInfeasibleError(
            f"no candidate can sustain {rate:g} req/s: the most any holds is {best:,.3g} req/s ({where}; {how}), "
            f"{closest.slo_ratio:.2f}x short. Allow more GPUs or lower the rate.",
            "rate",
            rate,
            best,
            closest.slo_ratio,
            plan,
        )
    metric = closest.limiting_metric
    target = plan.slo.targets()[metric]
    best = closest.slo_ratio * target
    return SloInfeasibleError(
        f"{metric_label(metric)} <= {target:g} s cannot be met at {rate:g} req/s: the closest configuration, "
        f"{where}, reaches {best:.3g} s, {closest.slo_ratio:.2f}x the target ({closest.binding}-bound: "
        f"{closest.reason}).",
        metric,
        target,
        best,
        closest.slo_ratio,
        plan,
    )
